"""The tier contract, run over every factory in ``tests/kv/conftest.py``."""

from __future__ import annotations

from tests.kv.tier_contract import TierContract


class TestTierContract(TierContract):
    pass
