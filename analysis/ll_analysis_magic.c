/* ll_analysis_magic: what the cell analysis knows about IPython's magics:
 * the table of magics whose effect on the user namespace is
 * known, which get_ipython() calls are magics, and the text rules IPython
 * applies to a magic's line ($name and {expr} expansion, leading options,
 * the names --out/--err/--proc and %%capture bind).  Pure C, no Python: the
 * walker (ll_analysis_walk*.c) asks here what a magic call means and does
 * the Python part (parsing the code or expression a magic runs) itself.
 * Runs wherever the analysis runs; no state.
 *
 * After IPython's input transformation a magic is a call
 * get_ipython().run_line_magic(NAME, LINE) or run_cell_magic(NAME, LINE,
 * BODY), and `!cmd` is get_ipython().system(CMD) or getoutput(CMD).  A magic
 * not in the table, or one whose effect is unknown (%run, %reset, %who, ...),
 * makes the cell opaque: its closure is then everything live. */
#include "analysis/ll_analysis_internal.h"
#include "base/ll_check.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

/* Magics whose effect on the namespace we know.  Anything else is opaque. */
static const ll_magic_t s_magics[] = {
    {"time", LL_MAGIC_CODE, ""},
    {"prun", LL_MAGIC_CODE, "DlsT"},
    {"timeit", LL_MAGIC_TIMEIT, "nrp"},
    {"capture", LL_MAGIC_CAPTURE, ""},
    {"pinfo", LL_MAGIC_EXPR, ""},
    {"pinfo2", LL_MAGIC_EXPR, ""},
    {"pdef", LL_MAGIC_EXPR, ""},
    {"pdoc", LL_MAGIC_EXPR, ""},
    {"psource", LL_MAGIC_EXPR, ""},
    {"pfile", LL_MAGIC_EXPR, ""},
    {"page", LL_MAGIC_EXPR, ""},
    {"bash", LL_MAGIC_SCRIPT, ""},
    {"sh", LL_MAGIC_SCRIPT, ""},
    {"script", LL_MAGIC_SCRIPT, ""},
    {"perl", LL_MAGIC_SCRIPT, ""},
    {"ruby", LL_MAGIC_SCRIPT, ""},
    {"python", LL_MAGIC_SCRIPT, ""},
    {"python2", LL_MAGIC_SCRIPT, ""},
    {"python3", LL_MAGIC_SCRIPT, ""},
    {"pypy", LL_MAGIC_SCRIPT, ""},
    {"run", LL_MAGIC_OPAQUE, ""},
    {"reset", LL_MAGIC_OPAQUE, ""},
    {"reset_selective", LL_MAGIC_OPAQUE, ""},
    {"who", LL_MAGIC_OPAQUE, ""},
    {"whos", LL_MAGIC_OPAQUE, ""},
    {"who_ls", LL_MAGIC_OPAQUE, ""},
    {"store", LL_MAGIC_OPAQUE, ""},
    {"pylab", LL_MAGIC_OPAQUE, ""},
    {"recall", LL_MAGIC_OPAQUE, ""},
    {"rerun", LL_MAGIC_OPAQUE, ""},
    {"macro", LL_MAGIC_OPAQUE, ""},
    {"edit", LL_MAGIC_OPAQUE, ""},
    {"psearch", LL_MAGIC_OPAQUE, ""},
    {"xdel", LL_MAGIC_OPAQUE, ""},
    {"debug", LL_MAGIC_OPAQUE, ""},
    {"paste", LL_MAGIC_OPAQUE, ""},
    {"cpaste", LL_MAGIC_OPAQUE, ""},
    /* no effect on the user namespace */
    {"matplotlib", LL_MAGIC_HARMLESS, ""},
    {"load_ext", LL_MAGIC_HARMLESS, ""},
    {"reload_ext", LL_MAGIC_HARMLESS, ""},
    {"unload_ext", LL_MAGIC_HARMLESS, ""},
    {"autoreload", LL_MAGIC_HARMLESS, ""},
    {"aimport", LL_MAGIC_HARMLESS, ""},
    {"config", LL_MAGIC_HARMLESS, ""},
    {"pwd", LL_MAGIC_HARMLESS, ""},
    {"cd", LL_MAGIC_HARMLESS, ""},
    {"env", LL_MAGIC_HARMLESS, ""},
    {"set_env", LL_MAGIC_HARMLESS, ""},
    {"precision", LL_MAGIC_HARMLESS, ""},
    {"xmode", LL_MAGIC_HARMLESS, ""},
    {"colors", LL_MAGIC_HARMLESS, ""},
    {"pip", LL_MAGIC_HARMLESS, ""},
    {"conda", LL_MAGIC_HARMLESS, ""},
    {"mamba", LL_MAGIC_HARMLESS, ""},
    {"lsmagic", LL_MAGIC_HARMLESS, ""},
    {"magic", LL_MAGIC_HARMLESS, ""},
    {"history", LL_MAGIC_HARMLESS, ""},
    {"hist", LL_MAGIC_HARMLESS, ""},
    {"alias", LL_MAGIC_HARMLESS, ""},
    {"unalias", LL_MAGIC_HARMLESS, ""},
    {"alias_magic", LL_MAGIC_HARMLESS, ""},
    {"rehashx", LL_MAGIC_HARMLESS, ""},
    {"automagic", LL_MAGIC_HARMLESS, ""},
    {"autocall", LL_MAGIC_HARMLESS, ""},
    {"doctest_mode", LL_MAGIC_HARMLESS, ""},
    {"pdb", LL_MAGIC_HARMLESS, ""},
    {"tb", LL_MAGIC_HARMLESS, ""},
    {"quickref", LL_MAGIC_HARMLESS, ""},
    {"gui", LL_MAGIC_HARMLESS, ""},
    {"pprint", LL_MAGIC_HARMLESS, ""},
    {"bookmark", LL_MAGIC_HARMLESS, ""},
    {"dhist", LL_MAGIC_HARMLESS, ""},
    {"dirs", LL_MAGIC_HARMLESS, ""},
    {"popd", LL_MAGIC_HARMLESS, ""},
    {"pushd", LL_MAGIC_HARMLESS, ""},
    {"ls", LL_MAGIC_HARMLESS, ""},
    {"ll", LL_MAGIC_HARMLESS, ""},
    {"lf", LL_MAGIC_HARMLESS, ""},
    {"lk", LL_MAGIC_HARMLESS, ""},
    {"lx", LL_MAGIC_HARMLESS, ""},
    {"ldir", LL_MAGIC_HARMLESS, ""},
    {"mkdir", LL_MAGIC_HARMLESS, ""},
    {"rmdir", LL_MAGIC_HARMLESS, ""},
    {"mv", LL_MAGIC_HARMLESS, ""},
    {"rm", LL_MAGIC_HARMLESS, ""},
    {"cp", LL_MAGIC_HARMLESS, ""},
    {"cat", LL_MAGIC_HARMLESS, ""},
    {"clear", LL_MAGIC_HARMLESS, ""},
    {"less", LL_MAGIC_HARMLESS, ""},
    {"more", LL_MAGIC_HARMLESS, ""},
    {"man", LL_MAGIC_HARMLESS, ""},
    {"sx", LL_MAGIC_HARMLESS, ""},
    {"sc", LL_MAGIC_HARMLESS, ""},
    {"system", LL_MAGIC_HARMLESS, ""},
    {"killbgscripts", LL_MAGIC_HARMLESS, ""},
    {"load", LL_MAGIC_HARMLESS, ""},
    {"loadpy", LL_MAGIC_HARMLESS, ""},
    {"save", LL_MAGIC_HARMLESS, ""},
    {"logstart", LL_MAGIC_HARMLESS, ""},
    {"logon", LL_MAGIC_HARMLESS, ""},
    {"logoff", LL_MAGIC_HARMLESS, ""},
    {"logstop", LL_MAGIC_HARMLESS, ""},
    {"logstate", LL_MAGIC_HARMLESS, ""},
    {"notebook", LL_MAGIC_HARMLESS, ""},
    {"autosave", LL_MAGIC_HARMLESS, ""},
    {"connect_info", LL_MAGIC_HARMLESS, ""},
    {"qtconsole", LL_MAGIC_HARMLESS, ""},
    {"html", LL_MAGIC_HARMLESS, ""},
    {"HTML", LL_MAGIC_HARMLESS, ""},
    {"javascript", LL_MAGIC_HARMLESS, ""},
    {"js", LL_MAGIC_HARMLESS, ""},
    {"latex", LL_MAGIC_HARMLESS, ""},
    {"markdown", LL_MAGIC_HARMLESS, ""},
    {"svg", LL_MAGIC_HARMLESS, ""},
    {"writefile", LL_MAGIC_HARMLESS, ""},
    {"file", LL_MAGIC_HARMLESS, ""},
    {"sql", LL_MAGIC_OPAQUE, ""},
    /* ours: reports where variables live and the GPU time held (runs in the kernel) */
    {"looseleaf", LL_MAGIC_HARMLESS, ""},
    {NULL, 0, NULL}};

const ll_magic_t *ll_magic_find(const char *name)
{
    for (const ll_magic_t *m = s_magics; name && m->name; m++)
        if (strcmp(m->name, name) == 0)
            return m;
    return NULL;
}

bool ll_magic_is_call(const char *method)
{
    return strcmp(method, "run_line_magic") == 0 || strcmp(method, "run_cell_magic") == 0 ||
           strcmp(method, "system") == 0 || strcmp(method, "getoutput") == 0;
}

ll_magic_kind_t ll_magic_classify(const char *method, int argc, const char *name,
                                  const ll_magic_t **magic)
{
    *magic = NULL;
    if (strcmp(method, "system") == 0 || strcmp(method, "getoutput") == 0)
        return LL_MAGIC_SHELL;
    bool cell = strcmp(method, "run_cell_magic") == 0;
    if ((!cell && strcmp(method, "run_line_magic") != 0) || argc < (cell ? 3 : 2))
        return LL_MAGIC_OPAQUE;
    const ll_magic_t *m = ll_magic_find(name);
    if (!m || m->kind == LL_MAGIC_OPAQUE)
        return LL_MAGIC_OPAQUE;
    *magic = m;
    return m->kind;
}

/* Skip a magic line's leading options; ARGOPTS lists options with values. */
const char *ll_magic_skip_options(const char *line, const char *argopts)
{
    const char *p = line;
    for (;;) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (p[0] != '-' || p[1] == '\0' || p[1] == ' ')
            return p;
        char opt = p[1];
        bool attached = p[2] && p[2] != ' ' && p[2] != '\t';
        while (*p && *p != ' ' && *p != '\t')
            p++;
        if (strchr(argopts, opt) && !attached && opt != '-') {
            while (*p == ' ' || *p == '\t')
                p++;
            while (*p && *p != ' ' && *p != '\t')
                p++;
        }
    }
}

int ll_magic_bound_names(const char *line, bool capture, int (*bind)(void *ctx, const char *name),
                         void *ctx)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", line);
    char *save = NULL;
    bool take_next = false;
    for (char *tok = strtok_r(buf, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
        if (take_next) {
            if (bind(ctx, tok) != 0)
                return -1;
            take_next = false;
        } else if (!capture && (strcmp(tok, "--out") == 0 || strcmp(tok, "--err") == 0 ||
                                strcmp(tok, "--proc") == 0))
            take_next = true;
        else if (capture && tok[0] != '-')
            return bind(ctx, tok) != 0 ? -1 : 0;
    }
    return 0;
}

int ll_magic_expand(const char *text, int (*name_cb)(void *ctx, const char *name),
                    int (*expr_cb)(void *ctx, const char *expr, size_t len), void *ctx)
{
    for (const char *p = text; *p; p++) {
        if (p[0] == '$' && p[1] == '$') {
            p++;
            continue;
        }
        if (p[0] == '$' && (isalpha((unsigned char) p[1]) || p[1] == '_')) {
            char name[256];
            size_t n = 0;
            for (p++; (isalnum((unsigned char) *p) || *p == '_') && n + 1 < sizeof name; p++)
                name[n++] = *p;
            name[n] = '\0';
            if (name_cb(ctx, name) != 0)
                return -1;
            p--;
            continue;
        }
        if (p[0] == '{' && p[1] == '{') {
            p++;
            continue;
        }
        if (p[0] == '{') {
            int depth = 0;
            const char *q = p;
            for (; *q; q++) {
                if (*q == '{')
                    depth++;
                else if (*q == '}' && --depth == 0)
                    break;
            }
            if (!*q)
                return 0; /* unclosed: IPython leaves the rest as text */
            if (expr_cb(ctx, p + 1, (size_t) (q - p - 1)) != 0)
                return -1;
            p = q;
        }
    }
    return 0;
}

void ll_magic_object(const char *line, char *buf, size_t buflen)
{
    snprintf(buf, buflen, "%s", line);
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '?' || buf[n - 1] == ' '))
        buf[--n] = '\0';
}

/* ---- self-test: the table's and the text rules' decisions, scripted ---- */

typedef struct {
    char seen[8][64]; /* what the callbacks were given, in order */
    int n;
    int stop_at; /* return -1 from this call on (1-based), 0: never */
} s_st_log_t;

static int s_st_note(s_st_log_t *log, const char *text, size_t len)
{
    if (log->n < 8)
        snprintf(log->seen[log->n], sizeof log->seen[0], "%.*s", (int) len, text);
    log->n++;
    return log->stop_at && log->n >= log->stop_at ? -1 : 0;
}

static int s_st_name(void *ctx, const char *name)
{
    char tagged[64];
    snprintf(tagged, sizeof tagged, "$%s", name);
    return s_st_note(ctx, tagged, strlen(tagged));
}

static int s_st_expr(void *ctx, const char *expr, size_t len)
{
    return s_st_note(ctx, expr, len);
}

static int s_st_bind(void *ctx, const char *name)
{
    return s_st_note(ctx, name, strlen(name));
}

int ll_analysis_magic_selftest(bool verbose)
{
    int fails = 0;
#define S_SEEN(log, i, text) ((log).n > (i) && strcmp((log).seen[i], text) == 0)
    /* The table. */
    const ll_magic_t *m = ll_magic_find("timeit");
    S_CHECK(m && m->kind == LL_MAGIC_TIMEIT && strcmp(m->argopts, "nrp") == 0);
    S_CHECK(ll_magic_find("run") && ll_magic_find("run")->kind == LL_MAGIC_OPAQUE);
    S_CHECK(ll_magic_find("looseleaf") && ll_magic_find("looseleaf")->kind == LL_MAGIC_HARMLESS);
    S_CHECK(ll_magic_find("pinfo")->kind == LL_MAGIC_EXPR);
    S_CHECK(ll_magic_find("bash")->kind == LL_MAGIC_SCRIPT);
    S_CHECK(!ll_magic_find("nosuchmagic") && !ll_magic_find("") && !ll_magic_find(NULL));
    S_CHECK(!ll_magic_find("Time")); /* names are case-sensitive */

    /* Which calls are magics, and what each does. */
    S_CHECK(ll_magic_is_call("run_line_magic") && ll_magic_is_call("run_cell_magic"));
    S_CHECK(ll_magic_is_call("system") && ll_magic_is_call("getoutput"));
    S_CHECK(!ll_magic_is_call("kernel") && !ll_magic_is_call("user_ns") && !ll_magic_is_call("ex"));
    S_CHECK(ll_magic_classify("system", 1, "ls", &m) == LL_MAGIC_SHELL && !m);
    S_CHECK(ll_magic_classify("getoutput", 0, NULL, &m) == LL_MAGIC_SHELL);
    S_CHECK(ll_magic_classify("run_line_magic", 2, "time", &m) == LL_MAGIC_CODE && m &&
            strcmp(m->name, "time") == 0);
    S_CHECK(ll_magic_classify("run_line_magic", 1, "time", &m) == LL_MAGIC_OPAQUE && !m);
    S_CHECK(ll_magic_classify("run_cell_magic", 2, "capture", &m) == LL_MAGIC_OPAQUE);
    S_CHECK(ll_magic_classify("run_cell_magic", 3, "capture", &m) == LL_MAGIC_CAPTURE && m);
    S_CHECK(ll_magic_classify("run_line_magic", 2, "who", &m) == LL_MAGIC_OPAQUE && !m);
    S_CHECK(ll_magic_classify("run_line_magic", 2, "nosuchmagic", &m) == LL_MAGIC_OPAQUE);
    S_CHECK(ll_magic_classify("ex", 3, "time", &m) == LL_MAGIC_OPAQUE);

    /* Leading options: those in ARGOPTS take the next word unless attached. */
    S_CHECK(strcmp(ll_magic_skip_options("-n 10 -r3 x = f()", "nrp"), "x = f()") == 0);
    S_CHECK(strcmp(ll_magic_skip_options("  -q -o x", ""), "x") == 0);
    S_CHECK(strcmp(ll_magic_skip_options("-s cumulative f()", "DlsT"), "f()") == 0);
    S_CHECK(strcmp(ll_magic_skip_options("-scumulative f()", "DlsT"), "f()") == 0);
    S_CHECK(strcmp(ll_magic_skip_options("-- x", "nrp"), "x") == 0);
    S_CHECK(strcmp(ll_magic_skip_options("- x", ""), "- x") == 0);
    S_CHECK(strcmp(ll_magic_skip_options("x -n 1", "nrp"), "x -n 1") == 0);
    S_CHECK(strcmp(ll_magic_skip_options("-n", "nrp"), "") == 0);

    /* Names a line binds. */
    s_st_log_t log = {0};
    S_CHECK(ll_magic_bound_names("--out o --bg --err e --proc p", false, s_st_bind, &log) == 0);
    S_CHECK(log.n == 3 && S_SEEN(log, 0, "o") && S_SEEN(log, 1, "e") && S_SEEN(log, 2, "p"));
    log = (s_st_log_t){0};
    S_CHECK(ll_magic_bound_names("--no-stderr cap rest", true, s_st_bind, &log) == 0);
    S_CHECK(log.n == 1 && S_SEEN(log, 0, "cap"));
    log = (s_st_log_t){0};
    ll_magic_bound_names("--out", false, s_st_bind, &log);
    ll_magic_bound_names("-x", true, s_st_bind, &log);
    ll_magic_bound_names("", true, s_st_bind, &log);
    S_CHECK(log.n == 0);
    log = (s_st_log_t){.stop_at = 1};
    S_CHECK(ll_magic_bound_names("--out a --err b", false, s_st_bind, &log) == -1 && log.n == 1);

    /* $name and {expr}: $$ and {{ are literal, braces nest, an unclosed
     * brace ends the scan. */
    log = (s_st_log_t){0};
    S_CHECK(ll_magic_expand("echo $x $$y {a + b} {{lit}} ${z} $_u9 {d[{1: 2}[1]]} {open $w",
                            s_st_name, s_st_expr, &log) == 0);
    S_CHECK(log.n == 5 && S_SEEN(log, 0, "$x") && S_SEEN(log, 1, "a + b") && S_SEEN(log, 2, "z") &&
            S_SEEN(log, 3, "$_u9") && S_SEEN(log, 4, "d[{1: 2}[1]]"));
    log = (s_st_log_t){0};
    S_CHECK(ll_magic_expand("$ 1 $9 {}", s_st_name, s_st_expr, &log) == 0);
    S_CHECK(log.n == 1 && S_SEEN(log, 0, "")); /* {} is an (empty) expression */
    log = (s_st_log_t){.stop_at = 2};
    S_CHECK(ll_magic_expand("$a $b $c", s_st_name, s_st_expr, &log) == -1 && log.n == 2);

    /* The object a help line names. */
    char buf[32];
    ll_magic_object("np.zeros??  ", buf, sizeof buf);
    S_CHECK(strcmp(buf, "np.zeros") == 0);
    ll_magic_object("*int*", buf, sizeof buf);
    S_CHECK(strcmp(buf, "*int*") == 0);
#undef S_SEEN
    return fails ? 1 : 0;
}
