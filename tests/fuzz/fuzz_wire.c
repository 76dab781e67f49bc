/* Fuzz target (libFuzzer, under ASan/UBSan): the wire decoder,
 * ll_session_decode, on arbitrary frames.  The first byte picks the session:
 * even, one with a key (the signature is checked first, so what follows is
 * the verification path); odd, one without (nothing signed, so every frame
 * reaches the JSON parser and the header checks).  The rest is cut into
 * frames at each occurrence of the byte 0xFF (a frame may be empty). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/ll_log.h"
#include "proto/ll_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static ll_session_t *keyed, *open;
    if (!keyed) {
        ll_log_level = -1; /* decoding failures are logged by callers, not here */
        keyed = ll_session_new((const unsigned char *) "fuzz-key", 8, "hmac-sha256", 64);
        open = ll_session_new(NULL, 0, "", 64);
    }
    if (size == 0)
        return 0;
    ll_session_t *session = data[0] & 1 ? open : keyed;
    zmsg_t *raw = zmsg_new();
    size_t start = 1;
    for (size_t i = 1; i <= size; i++) {
        if (i == size || data[i] == 0xFF) {
            zmsg_addmem(raw, data + start, i - start);
            start = i + 1;
        }
    }
    char why[256];
    ll_msg_t *msg = ll_session_decode(session, &raw, why, sizeof why);
    if (msg) {
        /* What a handler reads of a decoded message must be there. */
        if (!msg->msg_type || !json_is_object(msg->header) || !json_is_object(msg->content))
            __builtin_trap();
        ll_msg_content_str(msg, "code");
        /* A decoded message encodes again (a reply shares its header). */
        zmsg_t *out = ll_session_encode(session, msg);
        zmsg_destroy(&out);
        ll_msg_destroy(&msg);
    }
    zmsg_destroy(&raw);
    return 0;
}
