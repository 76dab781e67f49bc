/* ll_draft: a cell still being typed, made parseable for the edit-time
 * prefetch (see ll_draft.c).  Pure; no state. */
#ifndef LL_DRAFT_H
#define LL_DRAFT_H

#include <stdbool.h>

/* CODE with its open string and brackets closed, in order (`f(a[1` gives
 * `f(a[1])`); NULL when nothing is open, the brackets are mismatched, or
 * CODE is NULL.  The caller frees the result. */
char *ll_draft_closed(const char *code);

/* CODE without its last non-blank line (and the blank lines before it);
 * NULL when that leaves nothing.  The caller frees the result. */
char *ll_draft_without_last_line(const char *code);

/* Failures of the scripted cases (0: all passed). */
int ll_draft_selftest(bool verbose);

#endif
