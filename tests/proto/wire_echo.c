/* wire_echo: a test driver for tests/proto/test_wire_interop.py (one
 * process, one thread).  Reads Jupyter messages from stdin, decodes each with
 * ll_session_decode, and writes back either an "echo_reply" built with
 * ll_msg_new + ll_session_encode (content, metadata and buffers copied from
 * the request) or a one-frame error record "ERR <reason>".  The Python side
 * produces the requests with jupyter_client's Session and checks the
 * replies with it, so both directions of interoperability are exercised.
 *
 * Record format, both ways: u32 frame count, then per frame u32 length and
 * the bytes (little-endian).  The key comes from $LL_WIRE_KEY ("" = unsigned).
 * Exits 0 at end of input, 1 on a malformed record. */
#include "base/ll_log.h"
#include "proto/ll_wire.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S_MAX_FRAMES 100000
#define S_MAX_FRAME  (64u << 20)

static bool s_read_u32(uint32_t *v)
{
    unsigned char b[4];
    if (fread(b, 1, 4, stdin) != 4)
        return false;
    *v = (uint32_t) b[0] | (uint32_t) b[1] << 8 | (uint32_t) b[2] << 16 | (uint32_t) b[3] << 24;
    return true;
}

static void s_write_u32(uint32_t v)
{
    unsigned char b[4] = {(unsigned char) v, (unsigned char) (v >> 8), (unsigned char) (v >> 16),
                          (unsigned char) (v >> 24)};
    fwrite(b, 1, 4, stdout);
}

static void s_write_msg(zmsg_t *m)
{
    s_write_u32((uint32_t) zmsg_size(m));
    for (zframe_t *f = zmsg_first(m); f; f = zmsg_next(m)) {
        s_write_u32((uint32_t) zframe_size(f));
        fwrite(zframe_data(f), 1, zframe_size(f), stdout);
    }
    fflush(stdout);
}

static void s_write_error(const char *why)
{
    zmsg_t *m = zmsg_new();
    char line[300];
    snprintf(line, sizeof line, "ERR %s", why);
    zmsg_addstr(m, line);
    s_write_msg(m);
    zmsg_destroy(&m);
}

int main(void)
{
    ll_log_init('A');
    const char *key = getenv("LL_WIRE_KEY");
    size_t key_len = key ? strlen(key) : 0;
    ll_session_t *session = ll_session_new((const unsigned char *) key, key_len, "hmac-sha256", 0);
    if (!session)
        return 1;
    char *frame = malloc(S_MAX_FRAME);
    uint32_t nframes;
    while (s_read_u32(&nframes)) {
        if (nframes > S_MAX_FRAMES)
            return 1;
        zmsg_t *raw = zmsg_new();
        for (uint32_t i = 0; i < nframes; i++) {
            uint32_t len;
            if (!s_read_u32(&len) || len > S_MAX_FRAME || fread(frame, 1, len, stdin) != len)
                return 1;
            zmsg_addmem(raw, frame, len);
        }
        char why[256];
        ll_msg_t *req = ll_session_decode(session, &raw, why, sizeof why);
        if (!req) {
            s_write_error(why);
            continue;
        }
        ll_msg_t *reply = ll_msg_new(session, "echo_reply", req, json_deep_copy(req->content));
        json_decref(reply->metadata);
        reply->metadata = json_deep_copy(req->metadata);
        zmsg_destroy(&reply->buffers);
        reply->buffers = zmsg_dup(req->buffers);
        zmsg_t *out = ll_session_encode(session, reply);
        if (out)
            s_write_msg(out);
        else
            s_write_error("encode failed");
        zmsg_destroy(&out);
        ll_msg_destroy(&reply);
        ll_msg_destroy(&req);
    }
    free(frame);
    ll_session_destroy(&session);
    return 0;
}
