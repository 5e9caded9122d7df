"""Random operation sequences on a two-tier cache: never wrong KV, integrity at every check."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvstack.kv import KVCache
from kvstack.kv.tiers.file import chunkfile
from tests.kv.test_cache import CHUNK_BYTES, DIM, HEADS, LAYERS, C, kv_for

BASES = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [1, 2, 3, 4, 9, 9, 9, 9], [50] * 16]
prompts = st.builds(
    lambda base, extra, cut: BASES[base][:cut] + extra,
    st.integers(0, len(BASES) - 1),
    st.lists(st.integers(0, 30), max_size=9),
    st.integers(0, 16),
)


class CacheMachine(RuleBasedStateMachine):
    write_policy = "write-through"

    @initialize()
    def open_cache(self) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.cache = self._open()
        self.leases: list[tuple[torch.Tensor, torch.Tensor]] = []  # (leased view, expected)

    def _open(self) -> KVCache:
        return KVCache.from_config(
            {
                "model": "toy@1",
                "chunk_size": C,
                "write_policy": self.write_policy,
                "tiers": [f"cpu://?size={6 * CHUNK_BYTES}", f"file://{self.dir.name}?size=12KiB"],
            }
        )

    @rule()
    def restart(self) -> None:
        """A new process on the same directory: DRAM is gone, the disk tier comes back."""
        self.leases.clear()
        self.cache.close()
        on_disk = self.cache.tiers[1].stats().entries
        self.cache = self._open()
        found = self.cache.tiers[1].stats()  # damaged headers are dropped at start
        assert found.entries + found.corrupt == on_disk
        self.cache.check_integrity()

    def teardown(self) -> None:
        if hasattr(self, "cache"):
            self.leases.clear()
            self.cache.check_integrity()
            self.cache.close()
            self.dir.cleanup()

    def _check(self, tokens: list[int], got: torch.Tensor | None, n: int) -> None:
        assert n % C == 0 and n <= len(tokens)
        assert (got is None) == (n == 0)
        if got is not None:
            assert torch.equal(got, kv_for(tokens)[:, :, :n]), "wrong KV returned"

    @rule(tokens=prompts)
    def store(self, tokens: list[int]) -> None:
        n = self.cache.store(tokens, kv_for(tokens))
        assert n <= len(tokens) - len(tokens) % C

    @rule(tokens=prompts)
    def lookup_then_retrieve(self, tokens: list[int]) -> None:
        found = self.cache.lookup(tokens)
        got, n = self.cache.retrieve(tokens)
        self._check(tokens, got, n)
        assert n <= found  # a chunk that is read was there when looked up

    @rule(tokens=prompts)
    def load_into_buffers(self, tokens: list[int]) -> None:
        keys = self.cache.chunk_keys(tokens)
        outs = [torch.empty(LAYERS, 2, C, HEADS, DIM, dtype=torch.float16) for _ in keys]
        n = self.cache.get_chunks_into(keys, outs)
        got = torch.cat(outs[:n], dim=2) if n else None
        self._check(tokens, got, n * C)

    @rule(tokens=prompts, tier=st.integers(0, 1), index=st.integers(0, 6))
    def remove(self, tokens: list[int], tier: int, index: int) -> None:
        keys = self.cache.chunk_keys(tokens)
        if keys:
            self.cache.tiers[tier].remove(keys[index % len(keys)])

    @rule(tokens=prompts)
    def hold_a_lease(self, tokens: list[int]) -> None:
        keys = self.cache.chunk_keys(tokens)
        leased = self.cache.tiers[0].get(keys[0]) if keys else None
        if leased is not None:
            expected = kv_for(tokens)[0, :, :C]
            assert torch.equal(leased[0], expected)
            self.leases.append((leased[0], expected))  # a view keeps the lease

    @rule()
    def release_leases(self) -> None:
        for view, expected in self.leases:  # pinned memory was never reused meanwhile
            assert torch.equal(view, expected)
        self.leases.clear()

    @rule(tokens=prompts, offset=st.integers(0, 4000))
    def damage_a_file(self, tokens: list[int], offset: int) -> None:
        self.cache.flush()
        for key in self.cache.chunk_keys(tokens):
            path = chunkfile.chunk_path(self.cache.tiers[1].root, key)  # type: ignore[attr-defined]
            if path.exists():
                data = bytearray(path.read_bytes())
                data[offset % len(data)] ^= 0x01
                path.write_bytes(bytes(data))
                return

    @rule(tokens=prompts)
    def two_phase_put(self, tokens: list[int]) -> None:
        keys = self.cache.chunk_keys(tokens)
        if not keys:
            return
        buf = self.cache.prepare_put(keys[0], torch.float16, (LAYERS, 2, C, HEADS, DIM))
        if buf is not None:
            buf.copy_(kv_for(tokens)[:, :, :C])
            assert self.cache.complete_put(keys[0])

    @rule()
    def flush_and_check(self) -> None:
        self.cache.check_integrity()

    @invariant()
    def stats_are_sane(self) -> None:
        if hasattr(self, "cache"):
            for s in self.cache.stats().tiers:
                assert (
                    0
                    <= s.bytes_used
                    <= s.capacity_bytes + (6 * CHUNK_BYTES if s.name == "cpu" else 0)
                )


class WriteBackMachine(CacheMachine):
    write_policy = "write-back"


_settings: dict[str, Any] = {
    "max_examples": int(os.environ.get("KVSTACK_HYPOTHESIS_EXAMPLES", "25")),
    "stateful_step_count": 30,
    "deadline": None,
}
TestWriteThrough = CacheMachine.TestCase
TestWriteThrough.settings = settings(**_settings)
TestWriteBack = WriteBackMachine.TestCase
TestWriteBack.settings = settings(**_settings)
