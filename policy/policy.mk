# policy/: the pure decisions (no processes, no I/O, no clock of their own: the caller passes it), each with
# its scripted self-test, written once for every user: the host pool (zygote/), the broker (hostd/), the fleet
# simulator (sim/) and a multi-host service.  Below all of them; includes nothing of the tree but base/.
# policy/API.md.
POLICY_SRCS := policy/ll_greedydual.c policy/ll_sched.c policy/ll_sched_selftest.c policy/ll_place.c \
               policy/ll_provision.c policy/ll_gpu_plan.c policy/ll_hostd_policy.c
LIB_SRCS  += $(POLICY_SRCS)
SELFTESTS += ll_greedydual ll_sched ll_place ll_provision ll_gpu_plan ll_hostd_policy
