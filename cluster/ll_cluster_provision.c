/* ll_cluster_provision: the provisioning controller of ll_provision.h
 * (target utilisation plus square-root staffing) for the cluster's
 * autoscaler (cluster/looseleaf_cluster/autoscale.py, through ctypes), so
 * the cluster and `looseleaf simulate` decide the fleet's size with the
 * same C.  Only the constructor needs a wrapper: it takes the config as
 * flat arguments, so Python never mirrors ll_provision_config_t's layout
 * (a change to the struct breaks this file's build, not a silent ctypes
 * mismatch); observe, load, decide, gpus and beta take scalars and are
 * called as they are.  Linked into build/cluster/libllplace.so (see
 * cluster/cluster.mk).  A controller is not thread-safe: its one owner
 * (the scaler's loop) calls it. */
#include "policy/ll_provision.h"

/* A controller (NULL when the values are out of ll_provision_new's range);
 * free it with ll_cluster_provision_free. */
ll_provision_t *ll_cluster_provision_new(int gpus_per_host, double target_util, double p_wait,
                                         double window_s, double down_hold_s, int min_hosts,
                                         int max_hosts, double idle_load)
{
    ll_provision_config_t cfg = {.gpus_per_host = gpus_per_host,
                                 .target_util = target_util,
                                 .p_wait = p_wait,
                                 .window_s = window_s,
                                 .down_hold_s = down_hold_s,
                                 .min_hosts = min_hosts,
                                 .max_hosts = max_hosts,
                                 .idle_load = idle_load};
    return ll_provision_new(&cfg);
}

void ll_cluster_provision_free(ll_provision_t *p)
{
    ll_provision_destroy(&p);
}
