"""Integration tests that looseleaf does not pass yet, kept out of `make test`
(tests/tests.mk lists test_int_*.py only) until it does; each is validated on
ipykernel.  Run: /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/integration/test_pending.py
Move a test to its test_int_ file once it passes on looseleaf."""
from itest_util import REPLY_TIMEOUT


def test_client_with_same_identity_takes_over(kernel):
    """A frontend that reconnects with the same session (so the same zmq
    identity, as km.client() gives every client of one manager) is answered:
    ipykernel sets ROUTER_HANDOVER on shell, control and stdin for this."""
    kc2 = kernel.km.client()
    assert kc2.session.bsession == kernel.kc.session.bsession
    kc2.start_channels()
    try:
        kc2.wait_for_ready(timeout=30)
        reply = kc2.execute("'taken over'", reply=True, timeout=REPLY_TIMEOUT)
        assert reply["content"]["status"] == "ok"
        info = kc2.kernel_info(reply=True, timeout=REPLY_TIMEOUT)
        assert info["content"]["status"] == "ok"
    finally:
        kc2.stop_channels()
    # The first client reconnects the same way and is answered again.
    kernel.connect()
    assert kernel.eval_text("1 + 1") == "2"
