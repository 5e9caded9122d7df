"""The tier contract, run over every factory in ``tests/kv/tiers/conftest.py``."""

from __future__ import annotations

from tests.kv.tiers.tier_contract import TierContract


class TestTierContract(TierContract):
    pass
