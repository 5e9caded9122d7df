"""``kvstack bench serve`` as a command against a simulated engine process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.bench.conftest import SimProcessFactory


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvstack", "bench", "serve", "--no-progress", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_serve_reports_and_writes_json(sim_process: SimProcessFactory, tmp_path: Path) -> None:
    (url,) = sim_process(time_scale=20)
    out = tmp_path / "run.json"
    done = serve(
        "--url",
        url,
        "--workload",
        "multi-round-qa",
        "--rate",
        "4",
        "--duration",
        "20",
        "--time-scale",
        "20",
        "--seed",
        "3",
        "--set",
        "num_users=4",
        "--set",
        "system_prompt_tokens=100",
        "--set",
        "user_context_tokens=50",
        "--json",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    assert "workload multi-round-qa" in done.stdout and "TTFT" in done.stdout
    doc = json.loads(out.read_text())
    assert doc["workload"]["params"]["num_users"] == 4 and doc["plan"]["seed"] == 3
    overall = doc["summary"]["overall"]
    assert overall["num_ok"] == overall["num_requests"] > 40
    assert overall["prompt_tokens_mismatched"] == 0
    assert overall["cached_tokens"] > 0  # later rounds reuse the conversation so far
    assert len(doc["requests"]) == overall["num_requests"]
    assert {"ttft_s", "itl_s", "tpot_s", "scheduled_s", "priority"} <= doc["requests"][0].keys()


def test_lora_zipf_reports_per_class_and_adapter(
    sim_process: SimProcessFactory, tmp_path: Path
) -> None:
    (url,) = sim_process(time_scale=20, enable_lora=True, max_loras=2, max_cpu_loras=4)
    out = tmp_path / "lora.json"
    done = serve(
        "--url",
        url,
        "--workload",
        "lora-zipf",
        "--rate",
        "8",
        "--duration",
        "20",
        "--time-scale",
        "20",
        "--set",
        "num_adapters=6",
        "--load-adapters",
        str(tmp_path),
        "--json",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(out.read_text())["summary"]
    assert set(summary["by_priority"]) == {"critical", "sheddable"}
    assert set(summary["by_tenant"]) <= {"platinum", "gold", "standard"}
    assert "platinum-0000" in summary["by_adapter"]
    assert summary["overall"]["num_errors"] == 0
    assert "by adapter" in done.stdout


def test_serve_names_bad_input(sim_process: SimProcessFactory) -> None:
    (url,) = sim_process(time_scale=20)
    done = serve("--url", url, "--workload", "shared-prefix", "--rate", "1", "--set", "groups=0")
    assert done.returncode == 2 and "groups" in done.stderr
    done = serve("--url", url, "--workload", "shared-prefix", "--rate", "1", "--set", "oops")
    assert done.returncode == 2 and "KEY=VALUE" in done.stderr


def test_serve_reports_error_reasons_by_type(sim_process: SimProcessFactory) -> None:
    (url,) = sim_process(time_scale=20)
    args = ("--url", url, "--workload", "unique", "--rate", "5", "--duration", "1")
    done = serve(*args, "--time-scale", "20", "--model", "nope")
    assert done.returncode == 0, done.stderr
    reasons = done.stdout.split("errors by reason:\n", 1)[1].splitlines()
    assert "HTTP 404: The model `nope` does not exist" in reasons[0]
