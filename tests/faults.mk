# Fault injection through the real kernel: the store's redis-server killed, stopped or
# restarted empty, the payload pool full, worker / zygote / pool / kernel killed at named stages of a GPU
# cell (restore, run, commit), interrupts while the store is silent, shutdown during a save; and what a
# kernel leaves behind.  tests/faults/faulthelp.py drives kernels on pools of their own.
PYTESTS += tests/faults
