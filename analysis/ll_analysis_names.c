/* ll_analysis_names: the insertion-ordered string set the cell analysis uses
 * for names, module paths and package lists (see ll_analysis_internal.h).
 * Small and boring on purpose: open addressing over indexes into an array of
 * owned copies, so iteration follows insertion order (which makes the CLI's
 * output follow the cell's text) and lookups stay O(1) in sessions of
 * thousands of names.  No locking: each set belongs to one object. */
#include "analysis/ll_analysis_internal.h"

#include <stdlib.h>
#include <string.h>

static uint32_t s_hash(const char *s)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (uint8_t) *s) * 16777619u;
    return h;
}

static int s_reindex(ll_names_t *self, size_t icap)
{
    uint32_t *index = calloc(icap, sizeof *index);
    if (!index)
        return -1;
    for (size_t i = 0; i < self->count; i++) {
        size_t slot = s_hash(self->items[i]) & (icap - 1);
        while (index[slot])
            slot = (slot + 1) & (icap - 1);
        index[slot] = (uint32_t) i + 1;
    }
    free(self->index);
    self->index = index;
    self->icap = icap;
    return 0;
}

long ll_names_find(const ll_names_t *self, const char *name)
{
    if (self->icap == 0) {
        /* Small sets are scanned: most cells have a handful of names. */
        for (size_t i = 0; i < self->count; i++)
            if (strcmp(self->items[i], name) == 0)
                return (long) i;
        return -1;
    }
    size_t slot = s_hash(name) & (self->icap - 1);
    while (self->index[slot]) {
        size_t i = self->index[slot] - 1;
        if (strcmp(self->items[i], name) == 0)
            return (long) i;
        slot = (slot + 1) & (self->icap - 1);
    }
    return -1;
}

bool ll_names_has(const ll_names_t *self, const char *name)
{
    return ll_names_find(self, name) >= 0;
}

int ll_names_add(ll_names_t *self, const char *name)
{
    if (ll_names_find(self, name) >= 0)
        return 0;
    if (self->count == self->cap) {
        size_t cap = self->cap ? self->cap * 2 : 8;
        char **items = realloc(self->items, cap * sizeof *items);
        if (!items)
            return -1;
        self->items = items;
        self->cap = cap;
    }
    char *copy = self->borrow ? (char *) name : strdup(name);
    if (!copy)
        return -1;
    self->items[self->count++] = copy;
    if (self->count > 8 && self->count * 2 > self->icap) {
        size_t icap = self->icap ? self->icap : 32;
        while (self->count * 2 > icap)
            icap *= 2;
        if (s_reindex(self, icap) != 0) {
            self->count--;
            if (!self->borrow)
                free(self->items[self->count]);
            return -1;
        }
    } else if (self->icap) {
        size_t slot = s_hash(copy) & (self->icap - 1);
        while (self->index[slot])
            slot = (slot + 1) & (self->icap - 1);
        self->index[slot] = (uint32_t) self->count;
    }
    return 1;
}

int ll_names_union(ll_names_t *self, const ll_names_t *other)
{
    if (self == other)
        return 0;
    for (size_t i = 0; i < other->count; i++)
        if (ll_names_add(self, other->items[i]) < 0)
            return -1;
    return 0;
}

void ll_names_remove(ll_names_t *self, const char *name)
{
    long at = ll_names_find(self, name);
    if (at < 0)
        return;
    if (!self->borrow)
        free(self->items[at]);
    memmove(self->items + at, self->items + at + 1,
            (self->count - (size_t) at - 1) * sizeof *self->items);
    self->count--;
    if (self->icap && s_reindex(self, self->icap) != 0) {
        /* Out of memory while shrinking: fall back to scanning. */
        free(self->index);
        self->index = NULL;
        self->icap = 0;
    }
}

void ll_names_clear(ll_names_t *self)
{
    bool borrow = self->borrow;
    for (size_t i = 0; !borrow && i < self->count; i++)
        free(self->items[i]);
    free(self->items);
    free(self->index);
    memset(self, 0, sizeof *self);
    self->borrow = borrow;
}

void ll_names_reset(ll_names_t *self)
{
    for (size_t i = 0; !self->borrow && i < self->count; i++)
        free(self->items[i]);
    self->count = 0;
    if (self->icap)
        memset(self->index, 0, self->icap * sizeof *self->index);
}

static int s_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *) a, *(const char *const *) b);
}

const char **ll_names_sorted(const ll_names_t *self)
{
    if (self->count == 0)
        return NULL;
    const char **out = malloc(self->count * sizeof *out);
    if (!out)
        return NULL;
    for (size_t i = 0; i < self->count; i++)
        out[i] = self->items[i];
    qsort(out, self->count, sizeof *out, s_cmp);
    return out;
}
