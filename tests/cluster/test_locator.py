"""IndexLocator: answers from the index, remembered ones while the index is down, and a miss
(raised, for the tier to count) for chunks never located."""

from __future__ import annotations

import pytest

from kvstack.cluster import locator as locator_module
from kvstack.cluster.locator import IndexLocator
from kvstack.errors import IndexServiceError
from kvstack.index.protocol import LocateReply
from kvstack.kv.keys import ChunkKey

A, B = ChunkKey(b"a" * 16), ChunkKey(b"b" * 16)


class FlakyIndex:
    url = "redis://index:6379/0"

    def __init__(self) -> None:
        self.down = False
        self.calls = 0

    def locate(self, keys: list[bytes], exclude: str = "") -> LocateReply:
        self.calls += 1
        if self.down:
            raise IndexServiceError("no primary")
        return LocateReply(peers=["e1"], addresses=["10.0.0.1:8400"], holders=[[0] for _ in keys])

    def close(self) -> None:
        pass


@pytest.fixture
def flaky(monkeypatch: pytest.MonkeyPatch) -> FlakyIndex:
    index = FlakyIndex()
    monkeypatch.setattr(locator_module, "open_index", lambda url, timeout_s, keys: index)
    return index


def test_remembered_answers_while_the_index_is_down(flaky: FlakyIndex) -> None:
    now = [0.0]
    locator = IndexLocator("redis://index:6379/0", 1.0, retry_s=1.0, clock=lambda: now[0])
    assert locator.locate([A], "self") == [["10.0.0.1:8400"]]
    flaky.down = True
    assert locator.locate([A, B], "self") == [["10.0.0.1:8400"], []]
    calls = flaky.calls
    assert locator.locate([A], "self") == [["10.0.0.1:8400"]]
    assert flaky.calls == calls  # not asked again before retry_s
    with pytest.raises(ConnectionError):
        locator.locate([B], "self")  # nothing remembered: a miss the tier counts
    now[0] = 2.0
    flaky.down = False
    assert locator.locate([B], "self") == [["10.0.0.1:8400"]]
    assert locator.remembered_answers == 2
