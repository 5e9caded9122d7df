"""Ports picked for servers: free now, never from the range the kernel hands to outgoing
connections, never the same one twice in a process."""

from __future__ import annotations

import socket

import pytest

from kvstack.stack import ports


def test_picked_ports_are_below_the_ephemeral_range_distinct_and_bindable() -> None:
    low = ports._ephemeral_low()
    picked = [ports.free_port() for _ in range(200)]
    assert len(set(picked)) == len(picked), "a port was handed out twice"
    assert all(ports.LOWEST_PICKED <= p < low for p in picked)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", picked[-1]))  # free, as promised


def test_a_bus_port_pick_leaves_its_bus_port_free() -> None:
    port = ports.free_port(bus=True)
    assert ports.port_is_bindable("127.0.0.1", port + 10000)


def test_a_port_something_listens_on_is_not_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as listener, socket.socket() as other:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        other.bind(("127.0.0.1", 0))  # a free port, once this socket is closed
        busy, free = listener.getsockname()[1], other.getsockname()[1]
        other.close()
        choices = iter([busy, busy, free])
        monkeypatch.setattr(ports, "LOWEST_PICKED", 1024)
        monkeypatch.setattr(ports, "_ephemeral_low", lambda: 65536)
        monkeypatch.setattr(ports._random, "randrange", lambda low, high: next(choices))
        assert ports.free_port() == free
