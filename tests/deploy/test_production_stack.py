"""``kvstack deploy import-production-stack``: production-stack values become kvstack values that
render with the chart, and everything without an equivalent is listed with its reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvstack.deploy.cli import run
from kvstack.deploy.production_stack import import_production_stack
from tests.deploy.rendered import engine_deployments, render

SOURCE = Path(__file__).parent / "data" / "production-stack-values.yaml"


def test_the_fleet_router_and_cache_carry_over() -> None:
    result = import_production_stack(yaml.safe_load(SOURCE.read_text()))
    llama, qwen = result.values["models"]
    assert llama["name"] == "llama3" and llama["servedModelName"] == llama["model"]
    assert (llama["replicas"], llama["gpus"], llama["maxModelLen"]) == (2, 1, 16384)
    assert llama["extraArgs"] == [
        "--enable-prefix-caching",
        "--dtype",
        "bfloat16",
        "--disable-log-requests",
    ]
    assert llama["kv"] == {"enabled": True, "cpu": {"size": "20GiB"}}
    assert llama["hfTokenSecret"] == {"name": "hf-secret", "key": "token"}
    assert llama["weights"] == {"enabled": True, "size": "50Gi", "accessMode": "ReadWriteOnce"}
    assert qwen["name"] == "qwen-small" and qwen["extraArgs"] == ["--max-num-seqs", "64"]
    router = result.values["router"]
    assert (router["policy"], router["sessionHeader"], router["replicas"]) == (
        "session",
        "x-user-id",
        1,
    )
    assert router["extraConfig"] == {"scrape": {"interval_s": 15}}
    assert result.values["redis"] == {"mode": "internal"}
    unmapped = "\n".join(result.unmapped)
    for path in (
        "servingEngineSpec.runtimeClassName",
        "servingEngineSpec.modelSpec[0].repository",
        "servingEngineSpec.modelSpec[0].lmcacheConfig.enableController",
        "servingEngineSpec.modelSpec[1].vllmConfig.swapSpace",
        "servingEngineSpec.modelSpec[1].hf_token: kvstack never takes a secret",
        "routerSpec.requestStatsWindow",
        "cacheserverSpec.serde",
    ):
        assert path in unmapped, path
    assert "hf_plaintext_token_for_the_test" not in unmapped  # a secret is never printed


def test_the_imported_values_render_with_the_chart() -> None:
    values = import_production_stack(yaml.safe_load(SOURCE.read_text())).values
    deployments = engine_deployments(render(values))  # the chart's schema checks the values
    assert len(deployments) == 2
    llama = next(d for d in deployments if "llama3" in d["metadata"]["name"])
    container = llama["spec"]["template"]["spec"]["containers"][0]
    args = " ".join(container.get("args", []) + container.get("command", []))
    assert "meta-llama/Llama-3.1-8B-Instruct" in args and "--enable-prefix-caching" in args
    assert "cpu://?size=20GiB" in args


def test_the_cli_writes_values_and_lists_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "kvstack-values.yaml"
    assert run("deploy", ["import-production-stack", str(SOURCE), "-o", str(out)]) == 0
    assert yaml.safe_load(out.read_text())["models"][0]["name"] == "llama3"
    err = capsys.readouterr().err
    assert "have no kvstack equivalent:" in err and "routerSpec.repository" in err
    assert run("deploy", ["import-production-stack", str(tmp_path / "none.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err
