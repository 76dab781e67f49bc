/* Fuzz target (libFuzzer, under ASan/UBSan): what clients of `looseleaf
 * hostd` say, checked by ll_hostd_wire and applied to the broker's policy
 * as the broker applies it (hostd/ll_hostd.c, s_frame), with the policy's
 * promises checked after every frame: no slot is leased twice, never more
 * leases than slots, no pool above its own slots' worth.
 *
 * The input is lines; a line's first byte picks the connection (four, of
 * three uids) or, with its high bit, an event: the connection closes, or
 * the clock moves on.  The rest of the line is the frame's JSON.  Slots 0
 * and 1 start restored (a restart) for two of the uids. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "policy/ll_hostd_policy.h"
#include "hostd/ll_hostd_wire.h"

#define S_SLOTS 3
#define S_CONNS 4

static void s_check(const ll_hostd_policy_t *p, const bool *open, const int *nslots)
{
    int per_slot[S_SLOTS] = {0}, per_conn[S_CONNS] = {0}, n = 0;
    for (int i = 0; i < LL_HOSTD_MAX_LEASES; i++) {
        const ll_hostd_lease_t *l = ll_hostd_policy_lease(p, i);
        if (l->conn < 0)
            continue;
        if (l->slot < 0 || l->slot >= S_SLOTS || l->conn >= S_CONNS || !open[l->conn])
            __builtin_trap();
        per_slot[l->slot]++;
        per_conn[l->conn]++;
        n++;
    }
    for (int s = 0; s < S_SLOTS; s++)
        if (per_slot[s] > 1)
            __builtin_trap(); /* one slot leased twice */
    for (int c = 0; c < S_CONNS; c++)
        if (per_conn[c] > nslots[c])
            __builtin_trap();
    if (n > S_SLOTS)
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ll_hostd_policy_t *p = ll_hostd_policy_new(S_SLOTS);
    bool open[S_CONNS] = {false}, pool[S_CONNS] = {false};
    int nslots[S_CONNS] = {0};
    double now = 1;
    ll_hostd_policy_restore(p, 0, 1000, 5000);
    ll_hostd_policy_restore(p, 1, 1001, 5000);
    size_t start = 0;
    for (size_t i = 0; i <= size; i++) {
        if (i < size && data[i] != '\n')
            continue;
        const uint8_t *line = data + start;
        size_t len = i - start;
        start = i + 1;
        if (len == 0)
            continue;
        int c = line[0] % S_CONNS;
        unsigned uid = 1000 + (unsigned) (c % 3);
        if (line[0] & 0x80) {
            if (line[0] & 0x40) {
                now += (double) (line[0] & 0x3f) * 1000;
            } else if (open[c]) {
                ll_hostd_policy_close(p, c, now);
                open[c] = pool[c] = false;
                nslots[c] = 0;
            }
        } else {
            json_t *m = json_loadb((const char *) line + 1, len - 1, 0, NULL);
            ll_hostd_msg_t q;
            char why[256];
            if (m && ll_hostd_wire_parse(m, S_SLOTS, &q, why, sizeof why) == 0) {
                if (q.type == LL_HOSTD_MSG_HELLO && !pool[c]) {
                    if (ll_hostd_policy_open(p, c, uid, q.nslots, now) == 0) {
                        open[c] = pool[c] = true;
                        nslots[c] = q.nslots;
                        for (int k = 0; k < q.nheld; k++)
                            if (ll_hostd_policy_adopt(p, c, q.held[k].slot, q.held[k].idle, now) ==
                                0)
                                ll_hostd_policy_mark(p, c, q.held[k].slot, q.held[k].idle,
                                                     q.held[k].value, q.held[k].pid,
                                                     q.held[k].cells, now);
                    }
                } else if (pool[c] && q.type == LL_HOSTD_MSG_WANT) {
                    ll_hostd_policy_want(p, c, q.want, now);
                    if (q.has_prefetch)
                        ll_hostd_policy_want_prefetch(p, c, q.want_prefetch, now);
                } else if (pool[c] && q.type == LL_HOSTD_MSG_MARK) {
                    if (ll_hostd_policy_mark(p, c, q.lease.slot, q.lease.idle, q.lease.value,
                                             q.lease.pid, q.lease.cells, now) == 0 &&
                        q.lease.has_prefetch)
                        ll_hostd_policy_mark_prefetch(p, c, q.lease.slot, q.lease.prefetch);
                } else if (pool[c] && q.type == LL_HOSTD_MSG_RELEASE) {
                    ll_hostd_policy_release(p, c, q.lease.slot, now);
                }
            } else if (m && why[0] == '\0') {
                __builtin_trap(); /* refused without a reason */
            }
            json_decref(m);
        }
        ll_hostd_decision_t d;
        for (int k = 0; k < 64 && ll_hostd_policy_next(p, now, &d); k++)
            if (d.conn < 0 || d.conn >= S_CONNS || !open[d.conn])
                __builtin_trap();
        s_check(p, open, nslots);
        now += 1;
    }
    ll_hostd_policy_destroy(&p);
    return 0;
}
