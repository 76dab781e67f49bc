/* ll_sim_designs: which designs `looseleaf simulate` compares, in
 * ll_sim_design_t's order, each by its ops (ll_sim_internal.h): the
 * baselines (ll_sim_baselines.c) and LooseLeaf with and without prefetch
 * (ll_sim_looseleaf.c).  Above both and the engine (ll_sim.c), so that the
 * engine, which the designs call, does not name them. */
#include "sim/ll_sim_internal.h"

ll_sim_t *ll_sim_new(const ll_sim_config_t *cfg, char *err, size_t errlen)
{
    /* The ablations are LooseLeaf's own code with one mechanism off (it
     * looks at its design number). */
    static const ll_sim_ops_t *const ops[LL_SIM_NDESIGNS] = {
        &ll_sim_pinned_ops,     &ll_sim_pinned_packed_ops, &ll_sim_keepalive_ops,
        &ll_sim_notebookos_ops, &ll_sim_naive_ops,         &ll_sim_looseleaf_nopf_ops,
        &ll_sim_looseleaf_ops,  &ll_sim_looseleaf_ops,     &ll_sim_looseleaf_ops,
        &ll_sim_looseleaf_ops,  &ll_sim_looseleaf_ops};
    return ll_sim_new_designs(cfg, ops, err, errlen);
}
