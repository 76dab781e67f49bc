# zygote/: `looseleaf hostd`, the host's GPU slot broker, and `looseleaf top` (issue 17; hostd/API.md).
# The broker's policy is pure (ll_hostd_policy, scripted self-test); the pool's link to it is
# ll_hostpool_hostd.c.
SELFTESTS += ll_hostd_policy
LIB_SRCS  += zygote/ll_hostd_policy.c zygote/ll_hostd.c zygote/ll_hostpool_hostd.c

# Real OS users (useradd, setpriv; root only, skipped otherwise) sharing one broker (~25 s on 2 cores).
PYTESTS   += tests/hostd
