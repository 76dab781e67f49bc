/* ll_usage: the content of a usage_reply (the control-channel request that
 * resource monitors such as jupyter-resource-usage send; ipykernel answers
 * it with psutil figures).  Read from /proc, no Python involved, so it is
 * answered on the control thread even while a cell runs.
 *
 * Fields, as ipykernel 6 sends them: hostname, pid, kernel_cpu (percent of
 * one CPU used by the kernel and its child processes since the previous
 * request; 0.0 the first time, as psutil does), kernel_memory (PSS, else
 * RSS, in bytes, kernel and children), cpu_count, host_cpu_percent (since
 * the previous request; absent the first time), host_virtual_memory (total,
 * available, percent, used, free, active, inactive, buffers, cached, shared,
 * slab in bytes, as psutil.virtual_memory()).
 *
 * Threads: ll_usage_reply keeps the previous sample in statics behind a
 * mutex; call it from any thread. */
#ifndef LL_USAGE_H
#define LL_USAGE_H

#include <jansson.h>
#include <stdbool.h>

/* A new usage_reply content object (the caller owns it), or NULL on
 * allocation failure. */
json_t *ll_usage_reply(void);

int ll_usage_selftest(bool verbose);

#endif
