"""``bench compare`` end to end on a tiny simulated fleet: table, plots, per-run JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import yaml

from kvstack.bench.compare.experiment import load_experiment
from kvstack.bench.compare.fleet import SimBenchFleet
from kvstack.bench.compare.frontends import expand_command
from kvstack.bench.results import load

EXPERIMENT = {
    "name": "tiny",
    "fleet": {
        "kind": "sim",
        "engines": 2,
        "kv_events": True,
        "sim": {"time_scale": 20, "num_blocks": 256, "block_size": 16},
    },
    "workload": {
        "name": "shared-prefix",
        "params": {
            "groups": 4,
            "users_per_group": 2,
            "system_prompt_tokens": 300,
            "question_tokens": 20,
            "output_tokens": 8,
        },
    },
    "rates": [4, 8],
    "duration_s": 20,
    "frontends": [
        {  # a command with placeholders, here the round-robin proxy
            "name": "round-robin",
            "command": [
                "{python}",
                "-m",
                "kvstack.bench.compare.rr_proxy",
                "--port",
                "{port}",
                "{backends}",
            ],
        },
        # vllm-router's KV-event policy, fed the simulated engines' events
        {"name": "vllm-router kv_aware", "preset": "vllm-router:kv_aware"},
        # an arm that cannot start: a row that says so, and the other arms still run
        {"name": "broken", "command": ["{python}", "-c", "import sys; sys.exit(3)"]},
    ],
}


def test_compare_writes_table_plots_and_runs(tmp_path: Path) -> None:
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(EXPERIMENT))
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvstack",
            "bench",
            "compare",
            "--config",
            str(config),
            "--output",
            str(out),
            "--no-progress",
            "--json",
            str(tmp_path / "result.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    table = (out / "table.md").read_text()
    rows = [
        line for line in table.splitlines() if line.startswith("| 4 ") or line.startswith("| 8 ")
    ]
    assert len(rows) == 4
    assert all(" 0 | 0 |" in row for row in rows)  # no errors, no 429s
    for name in ("ttft_cdf.png", "throughput_vs_rate.png", "ttft_p90_vs_rate.png"):
        data = (out / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5000
    assert "- broken at 4: did not run: frontend broken: process exited with code 3" in table
    doc = load(tmp_path / "result.json")
    assert doc.command.endswith(f"--json {tmp_path / 'result.json'}")
    result = doc.result
    assert result["variant"] == "tiny" and result["slo"] == {"ttft_s": 2.0, "tpot_s": 0.1}
    assert result["fleet"]["engines"] == 2 and result["fleet"]["kv_events"] is True
    failed = [r for r in result["rows"] if "error" in r]
    assert [(r["frontend"], r["point"]) for r in failed] == [("broken", 4.0), ("broken", 8.0)]
    cells = [r for r in result["rows"] if "error" not in r]
    assert {(c["frontend"], c["point"]) for c in cells} == {
        (f, p) for f in ("round-robin", "vllm-router kv_aware") for p in (4.0, 8.0)
    }
    for cell in cells:
        assert cell["ok"] > 0 and cell["errors"] == 0
        assert sum(cell["engine_requests"]) == cell["ok"]  # a fresh fleet for every run
    rr = next(c for c in cells if c["frontend"] == "round-robin" and c["point"] == 8.0)
    assert rr["spread"] < 1.2  # round robin spreads evenly
    run = json.loads((out / "runs" / "round-robin-8.json").read_text())
    assert len(run["requests"]) == rr["requests"]
    assert "working set" in done.stdout


def test_placeholders_expand(tmp_path: Path) -> None:
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(EXPERIMENT))
    exp = load_experiment(config)
    fleet = SimBenchFleet(exp.fleet, tmp_path, 10)
    argv = expand_command(
        [
            "x",
            "--port",
            "{port}",
            "{backend_flags}",
            "{kv_event_sources}",
            "--m={model}",
            "{backends_csv}",
        ],
        fleet,
        1234,
    )
    u0, u1 = fleet.urls
    e0, e1 = fleet.event_endpoints
    assert argv == [
        "x",
        "--port",
        "1234",
        "--backend",
        u0,
        "--backend",
        u1,
        "--kv-event-source",
        f"{u0}={e0}",
        "--kv-event-source",
        f"{u1}={e1}",
        "--m=sim-model",
        f"{u0},{u1}",
    ]
    assert e0.startswith("tcp://127.0.0.1:")
    assert int(e1.rsplit(":", 1)[1]) == int(e0.rsplit(":", 1)[1]) + 1


def test_bad_experiments_are_named(tmp_path: Path) -> None:
    bad = dict(EXPERIMENT, rates=None)
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(bad))
    done = subprocess.run(
        [sys.executable, "-m", "kvstack", "bench", "compare", "--config", str(config)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "exactly one of rates and concurrencies" in done.stderr
    bad = dict(EXPERIMENT, fleet={"kind": "sim", "sim": {"num_blocks": -1}})
    config.write_text(yaml.safe_dump(bad))
    done = subprocess.run(
        [sys.executable, "-m", "kvstack", "bench", "compare", "--config", str(config)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "num_blocks" in done.stderr


def test_sim_fleet_loads_adapters_on_every_engine(tmp_path: Path) -> None:
    from kvstack.bench.compare.experiment import FleetSpec

    spec = FleetSpec(kind="sim", engines=2, sim={"time_scale": 20, "enable_lora": True,
                                                 "max_loras": 2, "lora_load_s": 0.1})  # fmt: skip
    fleet = SimBenchFleet(spec, tmp_path, 30)
    fleet.start()
    try:
        fleet.load_adapters(["a", "b", "c"])
        fleet.load_adapters(["a"])  # loading again is fine
        for url in fleet.urls:
            models = httpx.get(url + "/v1/models").json()["data"]
            assert sorted(m["id"] for m in models) == ["a", "b", "c", "sim-model"]
    finally:
        fleet.stop()
