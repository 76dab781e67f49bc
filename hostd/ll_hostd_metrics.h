/* ll_hostd_metrics: the broker's stats as Prometheus text (hostd/API.md,
 * "Metrics"). */
#ifndef LL_HOSTD_METRICS_H
#define LL_HOSTD_METRICS_H

#include <jansson.h>

/* ST (a hostd_stats frame) as Prometheus text: malloc'd (the caller frees),
 * or NULL without memory. */
char *ll_hostd_prometheus(const json_t *st);

#endif
