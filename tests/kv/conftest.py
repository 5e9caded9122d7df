"""Fixtures of the KV tests, including the tier factories the contract suite runs over.

To run the tier contract (``tests/kv/tier_contract.py``) over another tier, add one
``pytest.param(factory, id=..., marks=...)`` line to ``TIER_FACTORIES``. A factory takes the
pytest request (for fixtures such as a redis server: ``request.getfixturevalue(...)``) and an
empty temporary directory, and returns a fresh, empty tier of at least 16 MiB.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvstack.kv.tiers import Tier
from kvstack.kv.tiers.cpu.tier import CPUTier
from kvstack.kv.tiers.file.tier import FileTier

TierFactory = Callable[[pytest.FixtureRequest, Path], Tier]

TIER_FACTORIES = [
    pytest.param(lambda request, root: CPUTier(16 << 20, name="cpu"), id="cpu"),
    pytest.param(lambda request, root: CPUTier(16 << 20, "s3fifo", name="cpu"), id="cpu-s3fifo"),
    pytest.param(lambda request, root: FileTier(root, 16 << 20, name="file"), id="file"),
    pytest.param(
        lambda request, root: FileTier(root, 16 << 20, compression="zstd", name="file"),
        id="file-zstd",
    ),
    pytest.param(
        lambda request, root: FileTier(root, 16 << 20, compression="lz4", fsync=True, name="file"),
        id="file-lz4-fsync",
    ),
]


@pytest.fixture(params=TIER_FACTORIES)
def tier(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tier]:
    """A fresh, empty tier of every registered kind; closed after the test."""
    factory: TierFactory = request.param
    made = factory(request, tmp_path / "tier")
    try:
        yield made
    finally:
        made.close()
