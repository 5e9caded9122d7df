"""``qps_10m`` was renamed ``qps_30m`` (its window always was 30 minutes): the old name still
loads, as a hot-score key and in rules, with a warning that names the new one."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from kvstack.lora.config import AdapterCachePolicy, HotScoreWeights, LoRAConfig, ScheduledWarmup
from kvstack.lora.expr import rename_fields
from kvstack.lora.facts import FACT_TYPES, RENAMED_FACTS
from kvstack.section import load_section


def test_the_new_name_loads_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        weights = HotScoreWeights(qps_30m=0.6)
        policy = AdapterCachePolicy(demote_when=["qps_30m < 0.001"])
    assert weights.qps_30m == 0.6
    assert policy.demote_when == ["qps_30m < 0.001"]
    assert "qps_30m" in FACT_TYPES and "qps_10m" not in FACT_TYPES


def test_the_old_hot_score_key_is_accepted_with_a_warning() -> None:
    with pytest.warns(FutureWarning, match=r"hot_score\.qps_10m.*deprecated.*'qps_30m'"):
        weights = HotScoreWeights.model_validate({"qps_10m": 0.6})
    assert weights.qps_30m == 0.6
    assert "qps_10m" not in weights.model_dump()


def test_both_names_at_once_is_an_error() -> None:
    with pytest.raises(ValueError, match="give qps_30m only"):
        HotScoreWeights.model_validate({"qps_10m": 0.6, "qps_30m": 0.5})


def test_rules_with_the_old_name_are_rewritten_with_a_warning() -> None:
    with pytest.warns(FutureWarning, match=r"'qps_10m' is deprecated.*'qps_30m'"):
        policy = AdapterCachePolicy(
            never_evict_when=["qps_10m > 0.5 and adapter_id != 'qps_10m'"],
            demote_when=["not (qps_10m >= 0.01)"],
        )
    # The field is renamed, the string constant is left alone.
    assert policy.never_evict_when == ["qps_30m > 0.5 and adapter_id != 'qps_10m'"]
    assert policy.demote_when == ["not (qps_30m >= 0.01)"]
    with pytest.warns(FutureWarning, match="qps_10m"):
        warmup = ScheduledWarmup(select="qps_10m > 1")
    assert warmup.select == "qps_30m > 1"


def test_rename_touches_names_only() -> None:
    assert rename_fields("a == 'b' or b > 1", {"b": "c"}) == ("a == 'b' or c > 1", ["b"])
    assert rename_fields("  b > 1", {"b": "cc"}) == ("cc > 1", ["b"])
    assert rename_fields("rank > 1", RENAMED_FACTS) == ("rank > 1", [])
    assert rename_fields("b >", {"b": "c"}) == ("b >", [])  # compile_rule says why it fails


def test_an_unknown_name_still_fails_after_the_rewrite() -> None:
    with pytest.raises(ValueError, match="unknown field 'qps_5m'"):
        AdapterCachePolicy(demote_when=["qps_5m > 1"])


def test_the_old_key_loads_from_a_config_file_and_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "kvstack.yaml"
    path.write_text(
        "lora:\n  adapter_cache_policy:\n    hot_score: {qps_10m: 0.3}\n"
        "    demote_when: ['qps_10m < 0.002']\n"
    )
    with pytest.warns(FutureWarning, match="qps_10m"):
        config = load_section("lora", LoRAConfig, path=path, env={})
    assert config.adapter_cache_policy.hot_score.qps_30m == 0.3
    assert config.adapter_cache_policy.demote_when == ["qps_30m < 0.002"]
    env = {"KVSTACK_LORA_ADAPTER_CACHE_POLICY__HOT_SCORE__QPS_10M": "0.2"}
    with pytest.warns(FutureWarning, match="qps_10m"):
        config = load_section("lora", LoRAConfig, env=env)
    assert config.adapter_cache_policy.hot_score.qps_30m == 0.2
