/* ll_analysis_scope: the scope rules the AST walker applies, as
 * pure C over name sets: which scope a read name resolves to, where a
 * binding lands, the scope a walrus binds in, and the tree of conditional
 * blocks (branches, loop bodies, handlers) a cell's bindings are made in.
 * No Python: the AST walker fills the scopes and asks here; the replay of a
 * cell's events asks the block tree.
 * Runs wherever the analysis runs; no state of its own.
 *
 * The rules are CPython's symtable's: a name bound anywhere in a function,
 * class or comprehension is local to it unless declared global or
 * nonlocal; a free name in a function looks through the enclosing function
 * scopes but skips class bodies (a method does not see its class's
 * attributes); at module level every name is global. */
#include "analysis/ll_analysis_internal.h"
#include "base/ll_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ll_scope_init(ll_scope_t *sc, ll_scope_kind_t kind, ll_scope_t *parent, bool immediate)
{
    memset(sc, 0, sizeof *sc);
    sc->kind = kind;
    sc->parent = parent;
    sc->immediate = immediate;
}

void ll_scope_free(ll_scope_t *sc)
{
    ll_names_clear(&sc->locals);
    ll_names_clear(&sc->globals);
    ll_names_clear(&sc->nonlocals);
}

bool ll_scope_resolves_global(const ll_scope_t *sc, const char *name)
{
    if (sc->kind == LL_SCOPE_MODULE)
        return true;
    if (ll_names_has(&sc->globals, name))
        return true;
    if (ll_names_has(&sc->nonlocals, name) || ll_names_has(&sc->locals, name))
        return false;
    /* Free name: enclosing function scopes, skipping class bodies. */
    for (sc = sc->parent; sc; sc = sc->parent) {
        if (sc->kind == LL_SCOPE_MODULE)
            return true;
        if (sc->kind == LL_SCOPE_CLASS)
            continue;
        if (ll_names_has(&sc->globals, name))
            return true;
        if (ll_names_has(&sc->locals, name) || ll_names_has(&sc->nonlocals, name))
            return false;
    }
    return true;
}

ll_scope_bind_t ll_scope_binding(const ll_scope_t *sc, const char *name)
{
    if (sc->kind == LL_SCOPE_MODULE)
        return LL_SCOPE_BIND_MODULE;
    return ll_names_has(&sc->globals, name) ? LL_SCOPE_BIND_GLOBAL : LL_SCOPE_BIND_LOCAL;
}

ll_scope_t *ll_scope_walrus_target(ll_scope_t *sc)
{
    while (sc->kind == LL_SCOPE_COMP && sc->parent)
        sc = sc->parent;
    return sc;
}

/* ---- conditional blocks ------------------------------------------------ */

int ll_blocks_add(ll_blocks_t *self, int parent)
{
    if (self->count == self->cap) {
        size_t cap = self->cap ? self->cap * 2 : 16;
        int *p = realloc(self->parent, cap * sizeof *p);
        if (!p)
            return -1;
        self->parent = p;
        self->cap = cap;
        if (self->count == 0)
            self->parent[self->count++] = -1; /* block 0: the cell */
    }
    self->parent[self->count] = parent;
    return (int) self->count++;
}

bool ll_blocks_encloses(const ll_blocks_t *self, int outer, int inner)
{
    if (outer < 0 || inner < 0)
        return false;
    for (int b = inner, guard = 0; b >= 0 && guard < 100000; guard++) {
        if (b == outer)
            return true;
        b = (size_t) b < self->count ? self->parent[b] : -1;
    }
    return false;
}

void ll_blocks_free(ll_blocks_t *self)
{
    free(self->parent);
    memset(self, 0, sizeof *self);
}

/* ---- self-test: resolution, binding and block decisions, scripted ------ */

static void s_st_names(ll_names_t *set, const char *csv)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", csv);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        ll_names_add(set, tok);
}

int ll_analysis_scope_selftest(bool verbose)
{
    int fails = 0;
    /* module
     *   class C:        attr = ...
     *     def m(self):  global g; v = ...; nonlocal-free names
     *       def inner(): nonlocal v; w = ...
     *       [i for i in ...]   (a comprehension in m)
     *   [j for j in ...]       (a comprehension at module level) */
    ll_scope_t mod, cls, fn, inner, comp_fn, comp_mod, comp_comp;
    ll_scope_init(&mod, LL_SCOPE_MODULE, NULL, true);
    ll_scope_init(&cls, LL_SCOPE_CLASS, &mod, true);
    s_st_names(&cls.locals, "attr,m");
    ll_scope_init(&fn, LL_SCOPE_FUNC, &cls, false);
    s_st_names(&fn.locals, "self,v,g,inner");
    s_st_names(&fn.globals, "g");
    ll_scope_init(&inner, LL_SCOPE_FUNC, &fn, false);
    s_st_names(&inner.locals, "w");
    s_st_names(&inner.nonlocals, "v");
    ll_scope_init(&comp_fn, LL_SCOPE_COMP, &fn, false);
    s_st_names(&comp_fn.locals, "i");
    ll_scope_init(&comp_mod, LL_SCOPE_COMP, &mod, true);
    s_st_names(&comp_mod.locals, "j");
    ll_scope_init(&comp_comp, LL_SCOPE_COMP, &comp_fn, false);

    /* At module level everything is global. */
    S_CHECK(ll_scope_resolves_global(&mod, "anything"));
    /* A class body sees its own names as locals, the rest as globals. */
    S_CHECK(!ll_scope_resolves_global(&cls, "attr") && ll_scope_resolves_global(&cls, "y"));
    /* A method: its locals are not global, a `global` is, and the class's
     * attributes are invisible (the class body is skipped). */
    S_CHECK(!ll_scope_resolves_global(&fn, "self") && !ll_scope_resolves_global(&fn, "v"));
    S_CHECK(ll_scope_resolves_global(&fn, "g"));
    S_CHECK(ll_scope_resolves_global(&fn, "attr"));
    S_CHECK(ll_scope_resolves_global(&fn, "free"));
    /* A nested function: nonlocal and its own locals are not global; a free
     * name found local in the enclosing function is not; one declared
     * global there is. */
    S_CHECK(!ll_scope_resolves_global(&inner, "v") && !ll_scope_resolves_global(&inner, "w"));
    S_CHECK(!ll_scope_resolves_global(&inner, "self"));
    S_CHECK(ll_scope_resolves_global(&inner, "g"));
    S_CHECK(ll_scope_resolves_global(&inner, "attr") && ll_scope_resolves_global(&inner, "z"));
    /* Comprehensions: their targets are local; the rest resolves outward. */
    S_CHECK(!ll_scope_resolves_global(&comp_fn, "i") && !ll_scope_resolves_global(&comp_fn, "v"));
    S_CHECK(ll_scope_resolves_global(&comp_fn, "g") && ll_scope_resolves_global(&comp_fn, "q"));
    S_CHECK(!ll_scope_resolves_global(&comp_mod, "j") && ll_scope_resolves_global(&comp_mod, "i"));
    S_CHECK(!ll_scope_resolves_global(&comp_comp, "i") &&
            !ll_scope_resolves_global(&comp_comp, "self"));

    /* Where a binding lands. */
    S_CHECK(ll_scope_binding(&mod, "x") == LL_SCOPE_BIND_MODULE);
    S_CHECK(ll_scope_binding(&fn, "g") == LL_SCOPE_BIND_GLOBAL);
    S_CHECK(ll_scope_binding(&fn, "v") == LL_SCOPE_BIND_LOCAL);
    S_CHECK(ll_scope_binding(&cls, "attr") == LL_SCOPE_BIND_LOCAL);
    S_CHECK(ll_scope_binding(&inner, "g") == LL_SCOPE_BIND_LOCAL); /* no `global` there */
    /* A walrus binds in the nearest scope that is not a comprehension. */
    S_CHECK(ll_scope_walrus_target(&comp_comp) == &fn);
    S_CHECK(ll_scope_walrus_target(&comp_mod) == &mod);
    S_CHECK(ll_scope_walrus_target(&fn) == &fn && ll_scope_walrus_target(&mod) == &mod);

    ll_scope_t *all[] = {&mod, &cls, &fn, &inner, &comp_fn, &comp_mod, &comp_comp};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        ll_scope_free(all[i]);

    /* Blocks: the first block made also makes block 0, the cell itself. */
    ll_blocks_t b = {0};
    S_CHECK(ll_blocks_encloses(&b, 0, 0) && !ll_blocks_encloses(&b, 0, 1));
    int if_body = ll_blocks_add(&b, 0);
    int nested = ll_blocks_add(&b, if_body);
    int else_body = ll_blocks_add(&b, 0);
    S_CHECK(if_body == 1 && nested == 2 && else_body == 3);
    S_CHECK(ll_blocks_encloses(&b, 0, nested) && ll_blocks_encloses(&b, if_body, nested));
    S_CHECK(!ll_blocks_encloses(&b, nested, if_body) &&
            !ll_blocks_encloses(&b, if_body, else_body));
    S_CHECK(ll_blocks_encloses(&b, else_body, else_body));
    S_CHECK(!ll_blocks_encloses(&b, -1, nested) && !ll_blocks_encloses(&b, 0, -1));
    S_CHECK(!ll_blocks_encloses(&b, 0, 99)); /* unknown block: nothing encloses it */
    /* A deep chain grows the tree and keeps every ancestor. */
    int last = nested;
    for (int i = 0; i < 40; i++)
        last = ll_blocks_add(&b, last);
    S_CHECK(last == 43 && ll_blocks_encloses(&b, if_body, last));
    S_CHECK(!ll_blocks_encloses(&b, else_body, last));
    ll_blocks_free(&b);
    S_CHECK(b.count == 0 && b.parent == NULL);
    return fails ? 1 : 0;
}
