"""Every arm gets the same advantages: the LRU arm with pins has exactly the weighted arm's rules,
only the weighted arm reads its tunables, and workload seeds are held out from the tuning seed."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstack.bench.lora.arms import ARMS, arm_config, parse_overrides, weighted_defaults
from kvstack.bench.lora.seeds import bench_workloads, streams
from kvstack.bench.lora.setup import bench_config
from kvstack.bench.workloads.lora_zipf import make_adapters, make_arrivals
from kvstack.lora.config import LoRAConfig

PINS = ["status == 'canary' and canary_percent > 0", "tenant_priority == 'platinum'"]


@pytest.fixture
def base(tmp_path: Path) -> LoRAConfig:
    return bench_config(
        tmp_path,
        tmp_path / "sources",
        tmp_path / "key.pub.pem",
        adapter_cache_policy={"never_evict_when": PINS, "demote_when": ["rank > 32"]},
    )


def test_the_pins_arm_has_the_weighted_arms_rules_and_lru_has_none(base: LoRAConfig) -> None:
    cfg = {
        name: arm_config(base, arm, 4, 32, {}).adapter_cache_policy for name, arm in ARMS.items()
    }
    assert cfg["weighted-lru"].eviction_policy == "weighted-lru"
    assert cfg["lru-pins"].eviction_policy == cfg["lru"].eviction_policy == "lru"
    for name in ("weighted-lru", "lru-pins"):
        assert cfg[name].never_evict_when == PINS and cfg[name].demote_when == ["rank > 32"]
    assert cfg["lru"].never_evict_when == cfg["lru"].demote_when == []
    # Equal memory.
    assert {(c.gpu_slots_per_base_model, c.host_slots_per_base_model) for c in cfg.values()} == {
        (4, 32)
    }


def test_tunables_reach_the_weighted_arm_only(base: LoRAConfig) -> None:
    overrides = parse_overrides(
        '{"hot_score": {"qps_30m": 0.9}, "qps_window_s": 600, "priority_weights": {"gold": 0.5}}'
    )
    weighted = arm_config(base, ARMS["weighted-lru"], 4, 32, overrides)
    pins = arm_config(base, ARMS["lru-pins"], 4, 32, overrides)
    got = weighted_defaults(weighted)
    assert got["hot_score"]["qps_30m"] == 0.9 and got["hot_score"]["tenant_priority"] == 0.2
    assert got["qps_window_s"] == 600 and got["priority_weights"] == {"gold": 0.5}
    assert weighted_defaults(pins) == weighted_defaults(base)


@pytest.mark.parametrize("key", ["never_evict_when", "demote_when", "gpu_slots_per_base_model"])
def test_overrides_that_would_favour_one_arm_are_refused(key: str) -> None:
    with pytest.raises(ValueError, match="weighted arm only"):
        parse_overrides(f'{{"{key}": []}}')


def test_workloads_tuning_seed_first_then_held_out_seeds_on_every_shape() -> None:
    got = [(w.role, w.seed, w.shape) for w in bench_workloads(0, [1, 2], [1.0, 0.8])]
    assert got == [
        ("tuning", 0, "1"),
        ("held-out", 1, "1"),
        ("held-out", 2, "1"),
        ("held-out", 1, "0.8"),
        ("held-out", 2, "0.8"),
    ]
    with pytest.raises(ValueError, match="tuning seed"):
        bench_workloads(1, [1, 2], [1.0])


def test_seed_0_is_the_stream_the_defaults_were_chosen_on() -> None:
    (w,) = bench_workloads(0, [], [1.0])
    adapters, arrivals = streams(w, 200, 500, 12.0, 0.7)
    assert adapters == make_adapters(200, 1.0)
    assert arrivals == make_arrivals(make_adapters(200, 1.0), 500, 12.0, 0.7)
    (other,) = bench_workloads(None, [1], [1.0])
    assert streams(other, 200, 500, 12.0, 0.7)[1] != arrivals
