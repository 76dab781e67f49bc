/* ll_hostpool_clients: frames from the host pool to its clients (the
 * kernels), queued per client and written as its socket takes them.  A
 * client that stops reading stalls only itself; past S_CLIENT_QUEUE_MAX
 * it is marked dead (the loop, ll_hostpool.c, then drops it and cancels
 * its cells).  The lowest part of the pool: it uses nothing of the rest.
 * Run by the pool's one thread. */
#include "zygote/ll_hostpool_internal.h"
#include "base/ll_log.h"
#include "base/ll_check.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* A client's queue grows no further than this: past it the client is
 * dropped instead (its cells are cancelled). */
#define S_CLIENT_QUEUE_MAX (512u << 20)

void ll_hostpool_flush(ll_hostpool_t *pool, int c)
{
    ll_hostpool_client_t *cl = &pool->clients[c];
    size_t done = 0;
    while (done < cl->olen) {
        ssize_t w = send(cl->fd, cl->out + done, cl->olen - done, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w > 0) {
            done += (size_t) w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno != EAGAIN) {
            ll_debug("pool", "client %d: send failed: %s", c, strerror(errno));
            cl->dead = true;
        }
        break;
    }
    memmove(cl->out, cl->out + done, cl->olen - done);
    cl->olen -= done;
}

void ll_hostpool_send(ll_hostpool_t *pool, int c, json_t *msg)
{
    size_t n = 0;
    char *bytes = c >= 0 && pool->clients[c].fd >= 0 && !pool->clients[c].dead
                      ? ll_zframe_encode(msg, &n)
                      : NULL;
    json_decref(msg);
    if (!bytes)
        return;
    ll_hostpool_client_t *cl = &pool->clients[c];
    if (cl->olen + n > S_CLIENT_QUEUE_MAX) {
        ll_warn("pool", "client %d does not read its events (%zu bytes queued): dropping it", c,
                cl->olen);
        cl->dead = true;
        free(bytes);
        return;
    }
    if (cl->olen + n > cl->ocap) {
        size_t cap = (cl->olen + n) * 2;
        char *nb = realloc(cl->out, cap);
        if (!nb) {
            cl->dead = true;
            free(bytes);
            return;
        }
        cl->out = nb;
        cl->ocap = cap;
    }
    memcpy(cl->out + cl->olen, bytes, n);
    cl->olen += n;
    free(bytes);
    ll_hostpool_flush(pool, c);
}

/* ------------------------------------------------------------------ */
/* Self-test: a client's queue of frames on a socketpair (no process is */
/* started): a client that does not read stalls nobody, gets every     */
/* frame in order once it reads; a dead or gone one gets nothing.      */

int ll_hostpool_clients_selftest(bool verbose)
{
    int fails = 0;
    ll_hostpool_t *pool = calloc(1, sizeof *pool);
    int sv[2];
    S_CHECK(pool && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) == 0);
    if (!pool)
        return 1;
    for (int c = 0; c < LL_HOSTPOOL_MAX_CLIENTS; c++)
        pool->clients[c].fd = -1;
    int small = 4096;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    pool->clients[0].fd = sv[0];
    char text[1001];
    memset(text, 'a', 1000);
    text[1000] = '\0';
    const int nframes = 300; /* ~300 KiB: more than the socket holds */
    for (int i = 0; i < nframes; i++)
        ll_hostpool_send(pool, 0,
                         json_pack("{s:s, s:i, s:s}", "type", "stream", "n", i, "text", text));
    S_CHECK(pool->clients[0].olen > 0 && !pool->clients[0].dead); /* queued, not blocked */
    /* The client reads: every frame, in order, as the queue drains. */
    ll_zreader_t *rd = ll_zreader_new(sv[1]);
    int next = 0;
    bool bad = false;
    for (int turn = 0; turn < 100000 && next < nframes && !bad; turn++) {
        ll_hostpool_flush(pool, 0);
        ll_zreader_fill(rd);
        json_t *m;
        while ((m = ll_zreader_pop(rd, &bad))) {
            bad = bad || json_integer_value(json_object_get(m, "n")) != next++;
            json_decref(m);
        }
    }
    S_CHECK(next == nframes && !bad && pool->clients[0].olen == 0);
    /* A client marked dead, or one that is gone, gets nothing. */
    pool->clients[0].dead = true;
    ll_hostpool_send(pool, 0, json_pack("{s:s}", "type", "stats"));
    S_CHECK(pool->clients[0].olen == 0);
    ll_hostpool_send(pool, 1, json_pack("{s:s}", "type", "stats"));
    ll_hostpool_send(pool, -1, json_pack("{s:s}", "type", "stats"));
    S_CHECK(pool->clients[1].olen == 0);
    /* A client whose end closed is marked dead at the next write. */
    pool->clients[0].dead = false;
    close(sv[1]);
    ll_hostpool_send(pool, 0, json_pack("{s:s}", "type", "stats"));
    S_CHECK(pool->clients[0].dead);
    ll_zreader_destroy(&rd);
    close(sv[0]);
    free(pool->clients[0].out);
    free(pool);
    if (verbose)
        fprintf(stderr, "ll_hostpool_clients: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
