"""IndexState in process: what a reset and an expiry forget."""

from __future__ import annotations

from kvstack.index.protocol import AnnounceBatch, KeyProfile, LocateRequest, TierInfo
from kvstack.index.state import IndexState

PROFILE = KeyProfile(model="toy@1", chunk_size=4)
KEYS = [bytes([i]) * 16 for i in range(3)]


def report(state: IndexState, reset: bool, **stored: list[bytes]) -> None:
    batch = AnnounceBatch(instance="a", profile=PROFILE, epoch=state.epoch, peer="h:1",
                          tiers=[TierInfo("cpu")], reset=reset, stored=stored)  # fmt: skip
    assert not state.apply(batch).resync


def test_a_reset_forgets_chunks_of_tiers_the_engine_does_not_list() -> None:
    state = IndexState()
    report(state, reset=True, cpu=KEYS[:1], old_disk=KEYS)  # a tier no longer in its list
    assert state.locate(LocateRequest(KEYS)).holders == [[0], [0], [0]]
    report(state, reset=True)
    assert state.locate(LocateRequest(KEYS)).holders == [[], [], []]
    state.index.check_integrity()


def test_an_expiry_forgets_chunks_of_tiers_the_engine_does_not_list() -> None:
    now = [0.0]
    state = IndexState(clock=lambda: now[0])
    report(state, reset=True, old_disk=KEYS)
    now[0] = 100.0
    assert state.expire(ttl_s=30) == ["a"]
    report(state, reset=True)  # back, holding nothing
    assert state.locate(LocateRequest(KEYS)).holders == [[], [], []]
    assert state.index.locations() == {}
