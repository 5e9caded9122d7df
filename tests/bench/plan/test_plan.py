"""The decider on arithmetic that can be checked by hand."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from kvstack.bench.plan.model import (
    GIB,
    Hardware,
    PlanModelShape,
    TierFigures,
    WorkloadShape,
    break_even_tokens,
    evaluate,
    prefill_s,
)


def test_llama_3_8b_kv_is_128_kib_per_token() -> None:
    assert PlanModelShape().kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072


def test_hbm_capacity() -> None:
    model = PlanModelShape(weights_gib=15)
    hw = Hardware(hbm_gib=80, gpu_memory_utilization=0.9, reserve_gib=2)
    result = evaluate(model, hw, WorkloadShape())
    # (80 * 0.9 - 15 - 2) GiB = 55 GiB at 128 KiB per token
    assert result.tiers[0].capacity_tokens == 55 * GIB / 131072 == 450560


def test_break_even_linear() -> None:
    # recompute 1/10000 s per token; load 1 KB/token at 100 MB/s = 1e-5 s/token, latency 9 ms:
    # 0.009 + 1e-5 n = 1e-4 n  ->  n = 100 tokens
    tier = TierFigures("disk", 1e9, 0.009, 1e8)
    hw = Hardware(prefill_tokens_per_s=10000)
    assert break_even_tokens(tier, hw, 1000) == pytest.approx(100)
    slow = TierFigures("slow", 1e9, 0.0, 1e6)  # 1e-3 s/token: slower than recomputing
    assert break_even_tokens(slow, hw, 1000) is None


def test_break_even_with_quadratic_attention() -> None:
    # load 0.01 + 1e-3 n vs recompute 1e-4 n + 1e-6 n^2: 1e-6 n^2 - 9e-4 n - 0.01 = 0
    tier = TierFigures("net", 1e9, 0.01, 1e6)
    hw = Hardware(prefill_tokens_per_s=10000, attention_s_per_token2=1e-6)
    expected = (9e-4 + math.sqrt(9e-4**2 + 4 * 1e-6 * 0.01)) / (2 * 1e-6)
    assert break_even_tokens(tier, hw, 1000) == pytest.approx(expected)
    n = expected
    assert 0.01 + 1e-3 * n == pytest.approx(prefill_s(hw, 0, n))


def test_options_split_hits_by_capacity() -> None:
    # HBM holds 1/4 of the per-engine working set, DRAM all of it.
    model = PlanModelShape(num_layers=1, num_kv_heads=1, head_dim=1, dtype_bytes=512, weights_gib=0)
    hw = Hardware(
        hbm_gib=1,
        gpu_memory_utilization=1,
        reserve_gib=0,
        dram_gib=8,
        prefill_tokens_per_s=1000,
        pcie_gbps=1,
        dram_latency_s=0,
    )
    ws = 4 * GIB // 1024  # tokens of 1 KiB: 4 GiB
    wl = WorkloadShape(
        prompt_tokens=1000, reuse_fraction=0.5, working_set_tokens=ws, request_rate=1
    )
    r = evaluate(model, hw, wl)
    base, cpu = r.options[0], r.options[1]
    assert base.hit_fractions["hbm"] == pytest.approx(0.25) and base.miss_fraction == pytest.approx(
        0.75
    )
    assert cpu.hit_fractions["cpu"] == pytest.approx(0.75) and cpu.miss_fraction == pytest.approx(0)
    # base: 0.25 * 0.5 s (the new half) + 0.75 * 1 s; cpu adds 500 KiB over 1 GB/s per load
    assert base.prefill_s_per_request == pytest.approx(0.25 * 0.5 + 0.75 * 1.0)
    load = 500 * 1024 / 1e9
    assert cpu.prefill_s_per_request == pytest.approx(0.25 * 0.5 + 0.75 * (load + 0.5))
    assert r.cpu_offload_pays_above_tokens == pytest.approx(GIB / 1024)


def test_random_routing_makes_every_engine_see_everything() -> None:
    wl = WorkloadShape(working_set_tokens=1_000_000, routing="random")
    assert (
        evaluate(PlanModelShape(), Hardware(num_engines=4), wl).per_engine_working_set_tokens == 1e6
    )
    wl = WorkloadShape(working_set_tokens=1_000_000, routing="cache-aware")
    assert (
        evaluate(PlanModelShape(), Hardware(num_engines=4), wl).per_engine_working_set_tokens
        == 2.5e5
    )


def plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvstack", "plan", *args], capture_output=True, text=True
    )


def test_cli_with_presets_file_and_json(tmp_path: Path) -> None:
    config = tmp_path / "plan.yaml"
    config.write_text(
        "workload: {prompt_tokens: 8000, working_set_tokens: 5000000}\nhardware: {dram_gib: 512}\n"
    )
    out = tmp_path / "plan.json"
    done = plan(
        "--model-preset",
        "llama-3-8b",
        "--hardware-preset",
        "h100-80gb",
        "--config",
        str(config),
        "--request-rate",
        "4",
        "--json",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    assert (
        "CPU offload starts to pay once the per-engine working set exceeds 450,560" in done.stdout
    )
    assert "decision: use cpu tier" in done.stdout
    figures = json.loads(out.read_text())
    assert figures["inputs"]["workload"]["prompt_tokens"] == 8000
    assert figures["inputs"]["workload"]["request_rate"] == 4


def test_small_working_sets_do_not_need_tiers() -> None:
    done = plan("--working-set-tokens", "10000", "--dram-gib", "64")
    assert done.returncode == 0
    assert "kvstack tiers do not pay" in done.stdout


def test_cli_names_bad_values() -> None:
    done = plan("--reuse-fraction", "1.5")
    assert (
        done.returncode == 2 and "workload.reuse_fraction" in done.stderr and "1.5" in done.stderr
    )
