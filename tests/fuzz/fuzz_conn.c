/* Fuzz target (libFuzzer, under ASan/UBSan): the connection-file reader,
 * ll_conn_parse, on arbitrary text.  A file it accepts has every port in
 * range and distinct, a transport it knows, an endpoint for every channel,
 * and a key no longer than its buffer; a refused one leaves no key behind. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/ll_conn.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = 0;
    ll_conn_info_t info;
    char err[300];
    if (ll_conn_parse(text, &info, err, sizeof err) == 0) {
        if (strcmp(info.transport, "tcp") != 0 && strcmp(info.transport, "ipc") != 0)
            __builtin_trap();
        if (info.key_len > sizeof info.key || !info.ip[0])
            __builtin_trap();
        for (int ch = 0; ch < LL_CHAN_COUNT; ch++) {
            char ep[600];
            if (info.ports[ch] < 1 || info.ports[ch] > 65535 ||
                ll_conn_endpoint(&info, (ll_channel_t) ch, ep, sizeof ep) != 0)
                __builtin_trap();
            for (int other = 0; other < ch; other++)
                if (info.ports[other] == info.ports[ch])
                    __builtin_trap();
        }
        ll_conn_clear(&info);
    } else if (info.key_len != 0 || !err[0]) {
        __builtin_trap();
    }
    free(text);
    return 0;
}
