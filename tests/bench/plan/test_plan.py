"""``kvstack plan`` on arithmetic that can be checked by hand, and on the issue's four cases."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from kvstack.bench.plan.cache import PrefixStream, hit_probability
from kvstack.bench.plan.decide import make_plan
from kvstack.bench.plan.model import (
    GIB,
    Hardware,
    PlanModelShape,
    TierFigures,
    WorkloadShape,
    break_even_tokens,
    hbm_capacity_tokens,
    prefill_s,
)

LLAMA_8B = PlanModelShape()  # the llama-3-8b preset's shape
H100 = {"hbm_gib": 80, "pcie_gbps": 25, "disk_gbps": 5, "network_gbps": 10}
ALL = {f"{s}.{f}" for s, c in (("hardware", Hardware), ("workload", WorkloadShape))
       for f in c.model_fields}  # fmt: skip


def test_kv_footprint_and_hbm_capacity() -> None:
    assert LLAMA_8B.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072
    # (80 * 0.9 - 15 - 2) GiB = 55 GiB at 128 KiB per token
    assert hbm_capacity_tokens(LLAMA_8B, Hardware()) == 55 * GIB / 131072 == 450560
    fp8_70b = PlanModelShape(num_layers=80, dtype_bytes=1, weights_gib=66)
    assert 4096 * fp8_70b.kv_bytes_per_token == 671_088_640  # "~500 MB" in the issue: 0.67 GB


def test_break_even_includes_the_fixed_cost_of_a_load() -> None:
    # recompute 1e-4 s/token; load 1 KB/token at 100 MB/s = 1e-5 s/token; 9 ms latency + 9 ms
    # fixed: 0.018 + 1e-5 n = 1e-4 n  ->  n = 200 tokens
    tier = TierFigures("disk", 1e9, 0.009, 1e8)
    hw = Hardware(prefill_tokens_per_s=10000)
    assert break_even_tokens(tier, hw, 1000) == pytest.approx(100)
    assert break_even_tokens(tier, hw, 1000, fixed_s=0.009) == pytest.approx(200)
    slow = TierFigures("slow", 1e9, 0.0, 1e6)  # 1e-3 s/token: slower than recomputing
    assert break_even_tokens(slow, hw, 1000) is None


def test_break_even_with_quadratic_attention() -> None:
    tier = TierFigures("net", 1e9, 0.01, 1e6)
    hw = Hardware(prefill_tokens_per_s=10000, attention_s_per_token2=1e-6)
    expected = (9e-4 + math.sqrt(9e-4**2 + 4 * 1e-6 * 0.01)) / (2 * 1e-6)
    assert break_even_tokens(tier, hw, 1000) == pytest.approx(expected)
    assert 0.01 + 1e-3 * expected == pytest.approx(prefill_s(hw, 0, expected))


def test_lru_hit_probability() -> None:
    # Everything fits and nothing else comes in: always a hit; no room: never.
    assert hit_probability(1000, PrefixStream(0, 2, 100, 1.0)) == 1.0
    assert hit_probability(0, PrefixStream(10, 2, 100, 1.0)) == 0.0
    # One tiny prefix among 100 tokens/s of unique KV in 1000 tokens: it lasts ~10 s.
    hit = hit_probability(1000, PrefixStream(100, 1, 1e-9, 0.05))
    assert hit == pytest.approx(1 - math.exp(-0.05 * 10), rel=1e-6)


def _plan(given: set[str] | None = None, **workload: object) -> object:
    hw = {k: workload.pop(k) for k in list(workload) if k in Hardware.model_fields}
    return make_plan(
        LLAMA_8B, Hardware(**{**H100, **hw}), WorkloadShape(**workload),  # type: ignore[arg-type]
        ALL if given is None else given,
    )  # fmt: skip


TENANT = {"prompt_tokens": 6500, "reuse_fraction": 6000 / 6500, "prefix_groups": 1,
          "requests_per_hour": 200, "output_tokens": 200}  # fmt: skip


def test_a_tenants_6k_system_prompt_200_times_an_hour() -> None:
    # An engine with room to spare keeps the prompt: vLLM's own cache saves it.
    quiet = _plan(**TENANT, other_traffic_tokens_per_s=0)
    assert quiet.recommendation == "neither"  # type: ignore[attr-defined]
    assert quiet.evaluation.hbm_tokens_saved_per_hour == pytest.approx(200 * 6000, rel=0.01)  # type: ignore[attr-defined]
    # A busy engine (20K tokens/s of other KV) evicts it between queries, 18 s apart.
    busy = _plan(**TENANT, other_traffic_tokens_per_s=20000)
    assert busy.recommendation == "native"  # type: ignore[attr-defined]
    native = busy.evaluation.options["native"]  # type: ignore[attr-defined]
    hits = sum(native.hits.values())
    assert native.tokens_saved_per_hour == pytest.approx(hits * 200 * 6000)
    assert 300_000 < native.tokens_saved_per_hour < 1_200_000
    # Not told how busy the engine is, the plan says that this decided it.
    unsure = _plan(ALL - {"workload.other_traffic_tokens_per_s"}, **TENANT)
    assert unsure.recommendation == "neither"  # type: ignore[attr-defined]
    names = [d.name for d in unsure.decisive]  # type: ignore[attr-defined]
    assert "other_traffic_tokens_per_s" in names


def test_70b_fp8_kv_from_a_hard_disk_ceph_pool_against_recompute_on_an_h100() -> None:
    model = PlanModelShape(num_layers=80, dtype_bytes=1, weights_gib=66)
    ceph = {"remote_gib": 20000, "network_gbps": 0.15, "network_latency_s": 0.03}
    hw = Hardware(**{**H100, **ceph}, dram_gib=0, prefill_tokens_per_s=3500)
    wl = WorkloadShape(prompt_tokens=4096, reuse_fraction=1.0, prefix_groups=100, request_rate=1)
    plan = make_plan(model, hw, wl, ALL)
    e = plan.evaluation
    assert e.break_even["remote"] is None  # 1.09 ms a token to read, 0.29 ms to recompute
    remote = e.tiers["remote"]
    assert remote.load_s(4096, model.kv_bytes_per_token) > 3 * prefill_s(hw, 0, 4096)
    assert e.options["shared"].available and e.options["shared"].seconds_saved_per_hour < 0
    assert plan.recommendation == "neither"


def test_sub_1k_unique_prompts_get_neither() -> None:
    unique = _plan(prompt_tokens=800, reuse_fraction=0.0, request_rate=20)
    assert unique.recommendation == "neither"  # type: ignore[attr-defined]
    assert "nothing to load" in unique.reason  # type: ignore[attr-defined]
    short = _plan(prompt_tokens=300, reuse_fraction=0.5, request_rate=20)
    assert short.recommendation == "neither"  # type: ignore[attr-defined]
    shortest = short.evaluation.break_even["cpu"]  # type: ignore[attr-defined]
    assert shortest is not None and 150 < shortest < 1000
    assert "shorter than the shortest load that pays" in short.reason  # type: ignore[attr-defined]


def test_preemption_heavy_workload_whose_kv_exceeds_hbm() -> None:
    heavy = {"prompt_tokens": 16000, "output_tokens": 1000, "reuse_fraction": 0.0,
             "request_rate": 1, "hbm_kv_usage": 0.95, "preemptions_per_hour": 2000,
             "dram_gib": 256}  # fmt: skip
    plan = _plan(**heavy)
    assert plan.recommendation == "native"  # type: ignore[attr-defined]
    options = plan.evaluation.options  # type: ignore[attr-defined]
    assert options["native"].preempted_tokens_recovered_per_hour == 2000 * 16500
    assert options["local"].preempted_tokens_recovered_per_hour == 2000 * 16000  # prompt chunks
    on_cpu = _plan(**heavy, accelerator="cpu")  # vLLM's CPU build refuses native offload
    assert on_cpu.recommendation == "local"  # type: ignore[attr-defined]
    assert not on_cpu.evaluation.options["native"].available  # type: ignore[attr-defined]


def test_break_even_hbm_utilisation() -> None:
    plan = _plan(**TENANT, other_traffic_tokens_per_s=2000)
    usage = plan.break_even_hbm_usage  # type: ignore[attr-defined]
    assert usage is not None and 0 < usage < 1
    below = _plan(**TENANT, other_traffic_tokens_per_s=2000, hbm_kv_usage=usage * 0.9)
    above = _plan(**TENANT, other_traffic_tokens_per_s=2000, hbm_kv_usage=min(0.999, usage + 0.01))
    assert below.recommendation == "neither" != above.recommendation  # type: ignore[attr-defined]


def plan_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvstack", "plan", *args], capture_output=True, text=True
    )


def test_cli_prints_one_recommendation_with_its_numbers(tmp_path: Path) -> None:
    config = tmp_path / "plan.yaml"
    config.write_text("workload: {prompt_tokens: 6500, prefix_groups: 1, requests_per_hour: 200}\n")
    out = tmp_path / "plan.json"
    presets = ("--model-preset", "llama-3-8b", "--hardware-preset", "h100-80gb")
    done = plan_cli(*presets, "--config", str(config), "--reuse-fraction", "0.923",
                    "--json", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert text.count("recommendation: ") == 1
    figures = ("break-even HBM utilisation", "shortest context for which a load pays",
               "prefill tokens not recomputed/hour", "decided by a missing input: ")  # fmt: skip
    for figure in figures:
        assert figure in text, figure
    document = json.loads(out.read_text())
    assert document["inputs"]["workload"]["prompt_tokens"] == 6500
    assert "workload.prefix_groups" in document["given"]
    assert "workload.hbm_kv_usage" not in document["given"]
    assert document["plan"]["recommendation"] in ("neither", "native", "local", "shared")


def test_cli_names_bad_values() -> None:
    done = plan_cli("--reuse-fraction", "1.5")
    assert (
        done.returncode == 2 and "workload.reuse_fraction" in done.stderr and "1.5" in done.stderr
    )


def test_fixed_costs_are_measured() -> None:
    from kvstack.bench.plan.measure import measure_fixed_costs

    costs = measure_fixed_costs(rounds=20)
    assert 0 < costs.total_s < 0.05
    assert costs.ipc_s[1] <= costs.ipc_s[0] <= costs.ipc_s[2]
    assert "load_fixed_s" in "\n".join(costs.lines())
