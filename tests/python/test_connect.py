"""ferry.Client() finds its agent by the rule ferryctl and libferry use, and a socket that
does not exist is named at once."""
import socket
import time

import pytest

import ferry


def test_default_socket_is_ferry_socket_else_the_host_name(monkeypatch):
    monkeypatch.setenv("FERRY_SOCKET", "/run/ferry/ferryd.sock")
    assert ferry.default_socket() == "/run/ferry/ferryd.sock"
    monkeypatch.delenv("FERRY_SOCKET")
    assert ferry.default_socket() == f"/tmp/ferryd-{socket.gethostname()}.sock"
    monkeypatch.setenv("FERRY_SOCKET", "")
    assert ferry.default_socket() == f"/tmp/ferryd-{socket.gethostname()}.sock"


def test_a_missing_socket_fails_at_once_naming_it(tmp_path, monkeypatch):
    missing = str(tmp_path / "ferryd-nobody.sock")
    monkeypatch.setenv("FERRY_SOCKET", missing)
    start = time.monotonic()
    with pytest.raises(ferry.Unavailable) as e:
        ferry.Client(timeout=10)
    assert time.monotonic() - start < 2
    assert f"no ferryd socket at {missing} (no such file)" in str(e.value)
    assert "ferry.Client(PATH)" in e.value.message
    assert "FERRY_SOCKET" in e.value.message
