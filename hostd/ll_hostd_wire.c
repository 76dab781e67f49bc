/* ll_hostd_wire: a broker client's frames checked field by field (see
 * ll_hostd_wire.h).  Pure; used by the broker's one thread. */
#include "hostd/ll_hostd_wire.h"
#include "base/ll_check.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ll_hostd_socket_path(char *out, size_t len)
{
    const char *e = getenv("LL_HOSTD_SOCKET");
    snprintf(out, len, "%s", e && *e ? e : LL_HOSTD_DEFAULT_SOCKET);
}

static int s_bad(char *why, size_t wlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int s_bad(char *why, size_t wlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, wlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* KEY of object O as an integer in LO..HI into *OUT.  Absent: DEF when
 * OPTIONAL, else an error.  A JSON integer only (no real, no string), never
 * truncated: 2^40 is out of range, not 0. */
static int s_int(const json_t *o, const char *type, const char *key, long long lo, long long hi,
                 bool optional, int def, int *out, char *why, size_t wlen)
{
    const json_t *v = json_object_get(o, key);
    if (!v && optional) {
        *out = def;
        return 0;
    }
    if (!json_is_integer(v))
        return s_bad(why, wlen, "%s: '%s' must be an integer %lld..%lld", type, key, lo, hi);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return s_bad(why, wlen, "%s: '%s' must be an integer %lld..%lld, not %lld", type, key, lo,
                     hi, (long long) x);
    *out = (int) x;
    return 0;
}

static int s_bool(const json_t *o, const char *type, const char *key, bool *out, bool *given,
                  char *why, size_t wlen)
{
    const json_t *v = json_object_get(o, key);
    if (given)
        *given = v != NULL;
    if (!v) {
        *out = false;
        return 0;
    }
    if (!json_is_boolean(v))
        return s_bad(why, wlen, "%s: '%s' must be true or false", type, key);
    *out = json_is_true(v);
    return 0;
}

/* A lease as described by O (a mark, or one of hello's claims); SLOT_ONLY:
 * a release (only its slot counts). */
static int s_lease(const json_t *o, const char *type, int nslots, bool slot_only,
                   ll_hostd_lease_msg_t *l, char *why, size_t wlen)
{
    memset(l, 0, sizeof *l);
    if (!json_is_object(o))
        return s_bad(why, wlen, "%s: a lease must be an object", type);
    if (s_int(o, type, "slot", 0, nslots - 1, false, 0, &l->slot, why, wlen) < 0)
        return -1;
    if (slot_only)
        return 0;
    const json_t *v = json_object_get(o, "value");
    if (v && (!json_is_number(v) || !isfinite(json_number_value(v))))
        return s_bad(why, wlen, "%s: 'value' must be a number", type);
    l->value = v ? json_number_value(v) : 0;
    return s_bool(o, type, "idle", &l->idle, NULL, why, wlen) < 0 ||
                   s_int(o, type, "pid", 0, INT_MAX, true, 0, &l->pid, why, wlen) < 0 ||
                   s_int(o, type, "cells", 0, INT_MAX, true, 0, &l->cells, why, wlen) < 0 ||
                   s_bool(o, type, "prefetch", &l->prefetch, &l->has_prefetch, why, wlen) < 0
               ? -1
               : 0;
}

static int s_hello(const json_t *m, int nslots, ll_hostd_msg_t *out, char *why, size_t wlen)
{
    int pid;
    if (s_int(m, "hello", "nslots", 1, LL_HOSTD_MAX_SLOTS, false, 0, &out->nslots, why, wlen) < 0 ||
        s_int(m, "hello", "pid", 1, INT_MAX, true, 1, &pid, why, wlen) < 0)
        return -1;
    const json_t *held = json_object_get(m, "held"), *e;
    if (held && !json_is_array(held))
        return s_bad(why, wlen, "hello: 'held' must be an array");
    /* A pool holds at most its own slots' worth, each broker slot once. */
    if (json_array_size(held) > (size_t) out->nslots || json_array_size(held) > (size_t) nslots)
        return s_bad(why, wlen, "hello: %zu slots claimed by a pool of %d (the broker has %d)",
                     json_array_size(held), out->nslots, nslots);
    size_t i;
    json_array_foreach(held, i, e) {
        ll_hostd_lease_msg_t *l = &out->held[out->nheld];
        if (s_lease(e, "hello", nslots, false, l, why, wlen) < 0)
            return -1;
        for (int k = 0; k < out->nheld; k++)
            if (out->held[k].slot == l->slot)
                return s_bad(why, wlen, "hello: slot %d claimed twice", l->slot);
        out->nheld++;
    }
    return 0;
}

int ll_hostd_wire_parse(const json_t *m, int nslots, ll_hostd_msg_t *out, char *why, size_t wlen)
{
    memset(out, 0, sizeof *out);
    why[0] = '\0';
    const char *type = json_string_value(json_object_get(m, "type"));
    if (!json_is_object(m) || !type)
        return s_bad(why, wlen, "frame without a type");
    if (strcmp(type, "stats") == 0) {
        out->type = LL_HOSTD_MSG_STATS;
        return 0;
    }
    if (strcmp(type, "hello") == 0) {
        out->type = LL_HOSTD_MSG_HELLO;
        return s_hello(m, nslots, out, why, wlen);
    }
    if (strcmp(type, "want") == 0) {
        out->type = LL_HOSTD_MSG_WANT;
        out->has_prefetch = json_object_get(m, "prefetch") != NULL;
        return s_int(m, "want", "n", 0, LL_HOSTD_MAX_SLOTS, false, 0, &out->want, why, wlen) < 0 ||
                       s_int(m, "want", "prefetch", 0, LL_HOSTD_MAX_SLOTS, true, 0,
                             &out->want_prefetch, why, wlen) < 0
                   ? -1
                   : 0;
    }
    if (strcmp(type, "mark") == 0) {
        out->type = LL_HOSTD_MSG_MARK;
        return s_lease(m, "mark", nslots, false, &out->lease, why, wlen);
    }
    if (strcmp(type, "release") == 0) {
        out->type = LL_HOSTD_MSG_RELEASE;
        return s_lease(m, "release", nslots, true, &out->lease, why, wlen);
    }
    return s_bad(why, wlen, "unknown frame type '%.40s'", type);
}

/* ------------------------------------------------------------------ */
/* Self-test: what a pool of this code sends passes; every lie the issue
 * found (and its neighbours) is refused with a reason. */

/* Parse TEXT on a broker of 2 slots: 0 or -1; WHY filled. */
static int s_try(const char *text, ll_hostd_msg_t *msg, char *why, size_t wlen)
{
    json_t *m = json_loads(text, 0, NULL);
    int rc = m ? ll_hostd_wire_parse(m, 2, msg, why, wlen) : -2;
    json_decref(m);
    return rc;
}

int ll_hostd_wire_selftest(bool verbose)
{
    int fails = 0;
    ll_hostd_msg_t msg;
    char why[200];
    /* What the pool sends (ll_hostpool_hostd.c). */
    S_CHECK(s_try("{\"type\":\"hello\",\"nslots\":2,\"pid\":7,\"held\":[{\"slot\":1,\"idle\":true,"
                  "\"value\":1.5,\"pid\":9,\"cells\":3,\"prefetch\":false}]}",
                  &msg, why, sizeof why) == 0 &&
            msg.type == LL_HOSTD_MSG_HELLO && msg.nslots == 2 && msg.nheld == 1 &&
            msg.held[0].slot == 1 && msg.held[0].idle && msg.held[0].value == 1.5 &&
            msg.held[0].pid == 9 && msg.held[0].cells == 3);
    S_CHECK(s_try("{\"type\":\"hello\",\"nslots\":4,\"held\":[]}", &msg, why, sizeof why) == 0 &&
            msg.nheld == 0);
    S_CHECK(s_try("{\"type\":\"want\",\"n\":1,\"prefetch\":0}", &msg, why, sizeof why) == 0 &&
            msg.type == LL_HOSTD_MSG_WANT && msg.want == 1 && msg.has_prefetch);
    S_CHECK(s_try("{\"type\":\"want\",\"n\":0}", &msg, why, sizeof why) == 0 && !msg.has_prefetch);
    S_CHECK(s_try("{\"type\":\"mark\",\"slot\":0,\"idle\":false,\"value\":0,\"pid\":5,\"cells\":0,"
                  "\"prefetch\":true}",
                  &msg, why, sizeof why) == 0 &&
            msg.type == LL_HOSTD_MSG_MARK && msg.lease.prefetch && msg.lease.has_prefetch);
    S_CHECK(s_try("{\"type\":\"release\",\"slot\":1}", &msg, why, sizeof why) == 0 &&
            msg.type == LL_HOSTD_MSG_RELEASE && msg.lease.slot == 1);
    S_CHECK(s_try("{\"type\":\"stats\"}", &msg, why, sizeof why) == 0 &&
            msg.type == LL_HOSTD_MSG_STATS);
    /* nslots out of range, or not an integer. */
    S_CHECK(s_try("{\"type\":\"hello\",\"nslots\":-5}", &msg, why, sizeof why) == -1 &&
            strstr(why, "nslots") && strstr(why, "-5"));
    S_CHECK(s_try("{\"type\":\"hello\",\"nslots\":1000}", &msg, why, sizeof why) == -1);
    S_CHECK(s_try("{\"type\":\"hello\",\"nslots\":0}", &msg, why, sizeof why) == -1);
    S_CHECK(s_try("{\"type\":\"hello\",\"nslots\":2.0}", &msg, why, sizeof why) == -1);
    S_CHECK(s_try("{\"type\":\"hello\"}", &msg, why, sizeof why) == -1);
    /* A slot of 2^40 (0 once truncated to an int), of 2^32 + 1, negative, past the slots. */
    S_CHECK(s_try("{\"type\":\"release\",\"slot\":1099511627776}", &msg, why, sizeof why) == -1 &&
            strstr(why, "1099511627776"));
    S_CHECK(s_try("{\"type\":\"mark\",\"slot\":4294967297}", &msg, why, sizeof why) == -1);
    S_CHECK(s_try("{\"type\":\"release\",\"slot\":-1}", &msg, why, sizeof why) == -1);
    S_CHECK(s_try("{\"type\":\"release\",\"slot\":2}", &msg, why, sizeof why) == -1);
    S_CHECK(s_try("{\"type\":\"release\",\"slot\":\"0\"}", &msg, why, sizeof why) == -1);
    S_CHECK(s_try("{\"type\":\"release\"}", &msg, why, sizeof why) == -1);
    S_CHECK(s_try("{\"type\":\"hello\",\"nslots\":2,\"held\":[{\"slot\":1099511627776}]}", &msg,
                  why, sizeof why) == -1);
    /* Claims: twice the same slot, more than the pool's slots or the broker's, not objects. */
    S_CHECK(s_try("{\"type\":\"hello\",\"nslots\":2,\"held\":[{\"slot\":0},{\"slot\":0}]}", &msg,
                  why, sizeof why) == -1 &&
            strstr(why, "twice"));
    S_CHECK(s_try("{\"type\":\"hello\",\"nslots\":1,\"held\":[{\"slot\":0},{\"slot\":1}]}", &msg,
                  why, sizeof why) == -1);
    S_CHECK(s_try("{\"type\":\"hello\",\"nslots\":8,\"held\":[{\"slot\":0},{\"slot\":1},"
                  "{\"slot\":2}]}",
                  &msg, why, sizeof why) == -1);
    S_CHECK(s_try("{\"type\":\"hello\",\"nslots\":2,\"held\":[0]}", &msg, why, sizeof why) == -1);
    S_CHECK(s_try("{\"type\":\"hello\",\"nslots\":2,\"held\":{}}", &msg, why, sizeof why) == -1);
    /* Other fields: wrong types and ranges. */
    S_CHECK(s_try("{\"type\":\"want\",\"n\":-1}", &msg, why, sizeof why) == -1);
    S_CHECK(s_try("{\"type\":\"want\",\"n\":65}", &msg, why, sizeof why) == -1);
    S_CHECK(s_try("{\"type\":\"want\",\"n\":1,\"prefetch\":1099511627776}", &msg, why,
                  sizeof why) == -1);
    S_CHECK(s_try("{\"type\":\"want\"}", &msg, why, sizeof why) == -1);
    S_CHECK(s_try("{\"type\":\"mark\",\"slot\":0,\"idle\":1}", &msg, why, sizeof why) == -1);
    S_CHECK(s_try("{\"type\":\"mark\",\"slot\":0,\"value\":\"x\"}", &msg, why, sizeof why) == -1);
    S_CHECK(s_try("{\"type\":\"mark\",\"slot\":0,\"pid\":-3}", &msg, why, sizeof why) == -1);
    S_CHECK(s_try("{\"type\":\"mark\",\"slot\":0,\"cells\":4294967296}", &msg, why, sizeof why) ==
            -1);
    S_CHECK(s_try("{\"type\":\"grant\",\"slot\":0}", &msg, why, sizeof why) == -1 &&
            strstr(why, "unknown"));
    S_CHECK(s_try("{\"type\":7}", &msg, why, sizeof why) == -1);
    S_CHECK(s_try("{}", &msg, why, sizeof why) == -1);
    if (verbose)
        fprintf(stderr, "ll_hostd_wire: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
