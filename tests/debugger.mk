# JupyterLab's debugger on CPU cells: tests/debugger drives build/looseleaf and ipykernel with
# the debugger panel's debug_requests through jupyter_client and compares the sessions message by message.
PYTESTS += tests/debugger
