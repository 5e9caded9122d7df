"""SocketPool: reuse, the idle bound, connections that saw an error, and close."""

from __future__ import annotations

import pytest

from kvstack.kv.tiers.remote.pool import SocketPool


class Conn:
    def __init__(self, number: int) -> None:
        self.number = number
        self.closed = False

    def close(self) -> None:
        self.closed = True


def pool(max_idle: int = 1) -> tuple[SocketPool[Conn], list[Conn]]:
    made: list[Conn] = []

    def connect() -> Conn:
        made.append(Conn(len(made)))
        return made[-1]

    return SocketPool(connect, max_idle), made


def test_idle_connections_are_reused_up_to_the_bound() -> None:
    p, made = pool(max_idle=1)
    with p.connection() as a, p.connection() as b:
        assert (a.number, b.number) == (0, 1)
    # b came back first and stays idle; a came back over the bound
    assert [c.closed for c in made] == [True, False]
    with p.connection() as again:
        assert again is made[1]


def test_a_connection_that_saw_an_error_is_closed() -> None:
    p, made = pool()
    with pytest.raises(OSError), p.connection():
        raise OSError("reset by peer")
    assert made[0].closed
    with p.connection() as fresh:
        assert fresh.number == 1


def test_close_closes_idle_connections_now_and_busy_ones_when_returned() -> None:
    p, made = pool(max_idle=2)
    with p.connection():
        pass
    with p.connection() as busy:
        p.close()
        assert not busy.closed
    assert all(c.closed for c in made)
