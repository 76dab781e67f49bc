# Integration tests, examples and the kernel benchmark (integration-test engineer).
#
# tests/integration/ starts real kernels through jupyter_client and compares
# looseleaf with ipykernel.  A test file is listed here only once it passes
# against looseleaf (LL_TEST_KERNELS=looseleaf narrows a run to it); the rest
# stay out of `make test` until the kernel can pass them.
