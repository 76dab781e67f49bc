/* Fuzz target (libFuzzer, under ASan/UBSan): the store's metadata decoder,
 * what every process parses of what Redis holds: payload refs
 * (ll_store_ref_parse, ll_store_ref_nbytes) and the JSON lists of refs and
 * names (ll_store_json_parse_list).  What parses must format to text that
 * parses to the same again. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "store/ll_store_internal.h"

/* ll_store_ref.c also keeps the payloads a process holds, which unlease
 * pool regions: never called here. */
void ll_pool_unlease(ll_pool_t *pool, uint32_t idx)
{
    (void) pool;
    (void) idx;
    __builtin_trap();
}

static void s_refs(const char *text)
{
    uint64_t id, id2;
    size_t nb, nb2, n, n2;
    ll_pool_region_t *regs, *regs2;
    if (ll_store_ref_parse(text, &id, &nb, &regs, &n) != 0) {
        if (ll_store_ref_nbytes(text) != -1)
            __builtin_trap();
        return;
    }
    if (ll_store_ref_nbytes(text) != (long long) nb || n != (nb + LL_STORE_R - 1) / LL_STORE_R)
        __builtin_trap();
    char *again = ll_store_ref_format(id, nb, regs, n);
    if (!again || ll_store_ref_parse(again, &id2, &nb2, &regs2, &n2) != 0)
        __builtin_trap();
    if (id2 != id || nb2 != nb || n2 != n || (n && memcmp(regs, regs2, n * sizeof *regs) != 0))
        __builtin_trap();
    free(regs2);
    free(again);
    free(regs);
}

static void s_list(const uint8_t *data, size_t size)
{
    char **items;
    size_t n;
    if (ll_store_json_parse_list((const char *) data, size, &items, &n) != 0)
        return;
    char *text = ll_store_json_list((const char *const *) items, n);
    char **again;
    size_t n2;
    if (!text || ll_store_json_parse_list(text, strlen(text), &again, &n2) != 0 || n2 != n)
        __builtin_trap();
    for (size_t i = 0; i < n; i++) {
        if (strcmp(items[i], again[i]) != 0)
            __builtin_trap();
        free(items[i]);
        free(again[i]);
    }
    free(items);
    free(again);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = 0;
    s_refs(text);
    s_list(data, size);
    free(text);
    return 0;
}
