"""Fixtures the broker's suites share (test_hostd.py, test_hostd_abuse.py): the binaries as the test users run
them, once per module, and a broker of 2 slots per test."""
import pytest

from hdhelp import Binaries, Hostd


@pytest.fixture(scope="module")
def bins():
    b = Binaries()
    yield b
    b.close()


@pytest.fixture
def hostd(bins):
    h = Hostd(bins, nslots=2)
    yield h
    h.close()
