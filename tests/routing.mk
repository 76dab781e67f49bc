# GPU routing through the real kernel (routing-test engineer): tests/routing/test_route_*.py drive
# build/looseleaf through jupyter_client and compare mixed CPU/GPU notebooks with ipykernel, check the routing
# report in execute_reply.metadata.looseleaf, worker/zygote faults, interrupt, input and kernels sharing a pool.
PYTESTS += tests/routing
