/* ll_draft: a cell still being typed, made parseable for the edit-time
 * prefetch.  JupyterLab sends the whole cell with each typed
 * identifier character, so most drafts of a short cell end inside a call
 * (`out = model(X`): they do not parse, the analysis gives them no label, and
 * a cell typed in a few seconds was never prefetched before its Run.  The
 * prefetch analyses, after the draft itself, the draft with its open
 * brackets and string closed, then without its last line.  Only the label
 * and closure of such a guess are used, to prepare a worker; the cell that
 * runs is analysed as sent.  Pure C, no state; runs in the kernel. */
#include "analysis/ll_draft.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S_MAX_DEPTH 64 /* brackets open at once that we track */

char *ll_draft_closed(const char *code)
{
    if (!code)
        return NULL;
    char stack[S_MAX_DEPTH];
    int depth = 0;
    char quote = 0;      /* the open string's quote, 0 outside strings */
    bool triple = false; /* ... and whether it is a triple-quoted one */
    for (const char *p = code; *p; p++) {
        char c = *p;
        if (quote) {
            if (c == '\\' && p[1]) {
                p++;
            } else if (c == quote && !triple) {
                quote = 0;
            } else if (c == quote && p[1] == quote && p[2] == quote) {
                quote = 0;
                p += 2;
            } else if (c == '\n' && !triple) {
                quote = 0; /* an unterminated one-line string: the line is broken anyway */
            }
        } else if (c == '#') {
            while (p[1] && p[1] != '\n')
                p++;
        } else if (c == '\'' || c == '"') {
            quote = c;
            triple = p[1] == c && p[2] == c;
            if (triple)
                p += 2;
        } else if (c == '(' || c == '[' || c == '{') {
            if (depth == S_MAX_DEPTH)
                return NULL;
            stack[depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
        } else if (c == ')' || c == ']' || c == '}') {
            if (depth == 0 || stack[depth - 1] != c)
                return NULL; /* mismatched: closing more would not help */
            depth--;
        }
    }
    if (!quote && depth == 0)
        return NULL;
    size_t n = strlen(code);
    /* A dangling comma or operator before the closers would still not parse;
     * strip trailing blanks so the closers follow the last token. */
    while (n > 0 && (code[n - 1] == ' ' || code[n - 1] == '\t'))
        n--;
    char *out = malloc(n + 3 + (size_t) depth + 1);
    if (!out)
        return NULL;
    memcpy(out, code, n);
    size_t k = n;
    if (quote) {
        for (int i = 0; i < (triple ? 3 : 1); i++)
            out[k++] = quote;
    }
    while (depth > 0)
        out[k++] = stack[--depth];
    out[k] = '\0';
    return out;
}

char *ll_draft_without_last_line(const char *code)
{
    if (!code)
        return NULL;
    size_t n = strlen(code);
    while (n > 0 && (code[n - 1] == '\n' || code[n - 1] == ' ' || code[n - 1] == '\t'))
        n--;
    while (n > 0 && code[n - 1] != '\n')
        n--;
    while (n > 0 && code[n - 1] == '\n')
        n--;
    if (n == 0)
        return NULL;
    char *out = malloc(n + 1);
    if (!out)
        return NULL;
    memcpy(out, code, n);
    out[n] = '\0';
    return out;
}

/* ---- self-test ------------------------------------------------------------ */

static int s_expect(char *got, const char *want, int line)
{
    bool ok = (!got && !want) || (got && want && strcmp(got, want) == 0);
    if (!ok)
        fprintf(stderr, "ll_draft selftest line %d: got [%s], want [%s]\n", line,
                got ? got : "(null)", want ? want : "(null)");
    free(got);
    return ok ? 0 : 1;
}
#define S_EXPECT(got, want) (fails += s_expect((got), (want), __LINE__))

int ll_draft_selftest(bool verbose)
{
    int fails = 0;
    S_EXPECT(ll_draft_closed("out = model(X"), "out = model(X)");
    S_EXPECT(ll_draft_closed("y = f(a[1, g({'k': "), "y = f(a[1, g({'k':})])");
    S_EXPECT(ll_draft_closed("out = model(X)"), NULL); /* nothing to close */
    S_EXPECT(ll_draft_closed("print('a(b"), "print('a(b')");
    S_EXPECT(ll_draft_closed("s = \"\"\"doc (\nmore"), "s = \"\"\"doc (\nmore\"\"\"");
    S_EXPECT(ll_draft_closed("x = (1  # a (comment\n"), "x = (1  # a (comment\n)");
    S_EXPECT(ll_draft_closed("x = f(1))"), NULL); /* mismatched */
    S_EXPECT(ll_draft_closed("print('it\\'s (' , t.sum("), "print('it\\'s (' , t.sum())");
    S_EXPECT(ll_draft_without_last_line("out = model(X)\nprint(out.sum("), "out = model(X)");
    S_EXPECT(ll_draft_without_last_line("a = 1\n\nb = (\n"), "a = 1");
    S_EXPECT(ll_draft_without_last_line("one line"), NULL);
    S_EXPECT(ll_draft_closed(NULL), NULL);
    if (verbose)
        printf("ll_draft: %d failure(s)\n", fails);
    return fails;
}
