"""``kvstack deploy``: render for review, validate, and list vLLM's metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvstack.cli import main
from tests.deploy.rendered import EXAMPLES


def test_render_prints_every_object(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", "render", "--namespace", "llm", "--set", "router.replicas=3",
                 "--set", "router.autoscaling.enabled=false"]) == 0  # fmt: skip
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    (router,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "kvstack-router"
    ]
    assert router["spec"]["replicas"] == 3
    assert all(d["metadata"].get("namespace") in (None, "llm") for d in docs)


def test_render_validate_an_example_into_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = next(p for p in EXAMPLES if p.stem == "gpu-fleet")
    code = main(
        ["deploy", "render", "-f", str(example), "--output-dir", str(tmp_path), "--validate"]
    )
    err = capsys.readouterr().err
    assert code == 0, err
    files = sorted(tmp_path.glob("*.yaml"))
    assert len(files) > 10 and "0 problems" in err
    kinds = {yaml.safe_load(f.read_text())["kind"] for f in files}
    assert {"ScaledObject", "PodMonitor", "ServiceMonitor"} <= kinds


def test_bad_values_are_reported_with_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", "render", "--set", "router.replicas=zero"]) == 2
    assert "/router/replicas" in capsys.readouterr().err


def test_a_missing_values_file_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["deploy", "render", "-f", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read values file" in capsys.readouterr().err


def test_vllm_metrics_lists_types_and_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "loggers.py"
    source.write_text(
        'g = self._gauge_cls(\n    name="vllm:num_requests_waiting",\n    documentation="x")\n'
        'c = self._counter_cls(\n    name="vllm:prompt_tokens",\n    documentation="y")\n'
    )
    assert main(["deploy", "vllm-metrics", "--source", str(source)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith("#")]
    assert lines == ["gauge vllm:num_requests_waiting", "counter vllm:prompt_tokens"]
