/* ll_hostd_metrics: the broker's stats (hostd_stats, as `looseleaf top
 * --json` prints them) as Prometheus text, for `GET /metrics` and `looseleaf
 * top --prometheus` (hostd/API.md, "Metrics").  Pure: JSON in, text out;
 * runs in the broker's thread or in `looseleaf top`. */
#include "hostd/ll_hostd_metrics.h"

#include <stdio.h>
#include <stdlib.h>

char *ll_hostd_prometheus(const json_t *st)
{
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (!f)
        return NULL;
    json_t *users = json_object_get(st, "users"), *u;
    size_t i;
    long hits = 0, cold = 0;
    fprintf(f,
            "# HELP looseleaf_hostd_slots GPU slots the broker lends.\n"
            "# TYPE looseleaf_hostd_slots gauge\nlooseleaf_hostd_slots %lld\n",
            json_integer_value(json_object_get(st, "slots")));
    fprintf(f,
            "# HELP looseleaf_hostd_slots_held Slots lent to a pool (busy or warm).\n"
            "# TYPE looseleaf_hostd_slots_held gauge\nlooseleaf_hostd_slots_held %lld\n",
            json_integer_value(json_object_get(st, "busy_slots")));
    fprintf(f,
            "# HELP looseleaf_hostd_waiting_cells Cells waiting for a slot.\n"
            "# TYPE looseleaf_hostd_waiting_cells gauge\nlooseleaf_hostd_waiting_cells %lld\n",
            json_integer_value(json_object_get(st, "waiting")));
    fprintf(f,
            "# HELP looseleaf_hostd_store_cap_bytes Checkpoint store each user may hold (0: no "
            "cap).\n# TYPE looseleaf_hostd_store_cap_bytes gauge\n"
            "looseleaf_hostd_store_cap_bytes %lld\n",
            json_integer_value(json_object_get(st, "store_cap")));
    static const struct {
        const char *key, *name, *type, *help;
    } per_user[] = {
        {"busy", "looseleaf_hostd_user_busy_slots", "gauge", "Slots running a cell."},
        {"warm", "looseleaf_hostd_user_warm_slots", "gauge", "Slots held by an idle warm worker."},
        {"waiting", "looseleaf_hostd_user_waiting_cells", "gauge", "Cells waiting for a slot."},
        {"gpu_held_s", "looseleaf_hostd_user_gpu_held_seconds_total", "counter",
         "Slot-seconds held (busy or warm)."},
        {"gpu_busy_s", "looseleaf_hostd_user_gpu_busy_seconds_total", "counter",
         "Slot-seconds running cells."},
        {"grants", "looseleaf_hostd_user_grants_total", "counter", "Slots lent."},
        {"revokes", "looseleaf_hostd_user_revokes_total", "counter", "Slots taken back."},
    };
    for (size_t k = 0; k < sizeof per_user / sizeof per_user[0]; k++) {
        fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", per_user[k].name, per_user[k].help,
                per_user[k].name, per_user[k].type);
        json_array_foreach(users, i, u) {
            json_t *v = json_object_get(u, per_user[k].key);
            fprintf(f, "%s{uid=\"%lld\"} %g\n", per_user[k].name,
                    json_integer_value(json_object_get(u, "uid")), json_number_value(v));
        }
    }
    json_array_foreach(users, i, u) {
        hits += (long) json_integer_value(json_object_get(u, "warm_hits"));
        cold += (long) json_integer_value(json_object_get(u, "cold_starts"));
    }
    fprintf(f,
            "# HELP looseleaf_hostd_warm_hits_total Cells that started on a warm worker.\n"
            "# TYPE looseleaf_hostd_warm_hits_total counter\nlooseleaf_hostd_warm_hits_total %ld\n"
            "# HELP looseleaf_hostd_cold_starts_total Cells that started on a fresh worker.\n"
            "# TYPE looseleaf_hostd_cold_starts_total counter\n"
            "looseleaf_hostd_cold_starts_total %ld\n"
            "# HELP looseleaf_hostd_warm_hit_ratio Warm hits over cells started.\n"
            "# TYPE looseleaf_hostd_warm_hit_ratio gauge\nlooseleaf_hostd_warm_hit_ratio %g\n",
            hits, cold, hits + cold ? (double) hits / (double) (hits + cold) : 0.0);
    json_t *cl = json_object_get(st, "cluster_leases");
    if (json_is_object(cl))
        fprintf(f,
                "# HELP looseleaf_hostd_cluster_leases_issued_total Cluster leases this broker "
                "signed.\n# TYPE looseleaf_hostd_cluster_leases_issued_total counter\n"
                "looseleaf_hostd_cluster_leases_issued_total{host=\"%s\"} %lld\n"
                "# HELP looseleaf_hostd_cluster_leases_redeemed_total Cluster leases redeemed "
                "here.\n# TYPE looseleaf_hostd_cluster_leases_redeemed_total counter\n"
                "looseleaf_hostd_cluster_leases_redeemed_total{host=\"%s\"} %lld\n"
                "# HELP looseleaf_hostd_cluster_leases_refused_total Lease requests refused "
                "(forged, replayed, expired, another host's or user's).\n"
                "# TYPE looseleaf_hostd_cluster_leases_refused_total counter\n"
                "looseleaf_hostd_cluster_leases_refused_total{host=\"%s\"} %lld\n",
                json_string_value(json_object_get(cl, "host")),
                json_integer_value(json_object_get(cl, "issued")),
                json_string_value(json_object_get(cl, "host")),
                json_integer_value(json_object_get(cl, "redeemed")),
                json_string_value(json_object_get(cl, "host")),
                json_integer_value(json_object_get(cl, "refused")));
    fclose(f);
    return out;
}
