"""Planning a stack: commands, ports, tier URLs, router backends, bad configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kvstack.errors import ConfigError
from kvstack.section import load_section
from kvstack.stack.components import plan_stack
from kvstack.stack.config import StackConfig


def config(**stack: object) -> StackConfig:
    return load_section("stack", StackConfig, stack, env={})


def test_default_stack_is_two_simulated_engines_behind_a_router(tmp_path: Path) -> None:
    parts = plan_stack(config(), tmp_path)
    assert [(c.name, c.kind) for c in parts] == [
        ("engine-0", "engine"),
        ("engine-1", "engine"),
        ("router", "router"),
    ]
    assert len({c.port for c in parts}) == 3
    router_file = yaml.safe_load((tmp_path / "router.yaml").read_text())["router"]
    assert [b["url"] for b in router_file["backends"]] == [parts[0].url, parts[1].url]


def test_an_engine_without_kind_is_simulated(tmp_path: Path) -> None:
    (engine, *_) = plan_stack(config(engines=[{"name": "e"}]), tmp_path)
    assert "sim-engine" in engine.argv and not any("vllm" in arg for arg in engine.argv)


def test_vllm_engines_carry_the_connector_with_expanded_tiers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MALLOC_CONF", raising=False)
    monkeypatch.setenv("JE_MALLOC_CONF", "narenas:2")  # the operator's own setting wins
    cfg = config(
        redis={"port": 6390},
        engines=[
            {
                "name": "gpu",
                "kind": "vllm",
                "model": "/models/llama",
                "replicas": 2,
                "port": 9000,
                "role": "prefill",
                "connector": {"tiers": ["file://{run_dir}/kv?size=1GiB", "{redis_url}"]},
            }
        ],
        router=None,
    )
    parts = plan_stack(cfg, tmp_path)
    redis, first, second = parts
    assert redis.argv[:3] == ["redis-server", "--port", "6390"]
    # jemalloc keeps freed reply pages: large GETs do not fault every page in again
    assert redis.env == {"MALLOC_CONF": "dirty_decay_ms:-1", "JE_MALLOC_CONF": "narenas:2"}
    assert (first.port, second.port) == (9000, 9001) and first.role == "prefill"
    transfer = json.loads(first.argv[first.argv.index("--kv-transfer-config") + 1])
    assert transfer["kv_connector"] == "KVStackConnector"
    tiers = transfer["kv_connector_extra_config"]["tiers"]
    assert tiers == [f"file://{tmp_path.resolve()}/kv?size=1GiB", "redis://127.0.0.1:6390/0"]
    assert first.env["VLLM_CPU_KVCACHE_SPACE"] == "1"


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"engines": []}, "at least one engine"),
        ({"engines": [{"name": "a"}, {"name": "a"}]}, "unique"),
        ({"engines": [{"kind": "tgi"}]}, "kind"),
        ({"engines": [{"replicas": 0}]}, "replicas"),
        ({"routr": {}}, "routr"),
    ],
)
def test_bad_configs_name_the_problem(bad: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config(**bad)


def test_lora_needs_engines_with_slots_and_a_valid_section(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no engine has lora slots"):
        config(lora={})
    with pytest.raises(ConfigError, match="lora needs the router"):
        config(lora={}, router=None, engines=[{"kind": "sim", "lora": {}}])
    bad = config(engines=[{"kind": "sim", "lora": {}}], lora={"request_classes": {"x": {}}})
    with pytest.raises(ConfigError, match=r"stack\.lora"):
        plan_stack(bad, tmp_path)
    good = config(
        engines=[{"kind": "sim", "replicas": 2, "lora": {"max_loras": 3}}, {"name": "plain"}],
        lora={"trusted_keys": ["{run_dir}/keys/k.pub.pem"]},
    )
    parts = plan_stack(good, tmp_path)
    assert "--enable-lora" in parts[0].argv and "--enable-lora" not in parts[2].argv
    written = yaml.safe_load((tmp_path / "router.yaml").read_text())
    assert written["router"]["adapters"]["enabled"] is True
    lora = written["lora"]
    assert [e["url"] for e in lora["engines"]] == [parts[0].url, parts[1].url]
    assert lora["engines"][0]["gpu_slots"] == 3
    assert lora["trusted_keys"] == [f"{tmp_path.resolve()}/keys/k.pub.pem"]


def test_the_router_looks_prefixes_up_over_zmq_and_engines_announce_over_http(
    tmp_path: Path,
) -> None:
    cfg = config(
        index={"port": 8300, "zmq_port": 8301},
        engines=[{"name": "e", "kind": "vllm", "model": "/m", "connector": {"tiers": ["cpu://"]}}],
    )
    parts = plan_stack(cfg, tmp_path)
    index, engine, _router = parts
    assert index.argv[-4:] == ["--port", "8300", "--zmq-port", "8301"]
    router_file = yaml.safe_load((tmp_path / "router.yaml").read_text())["router"]
    assert router_file["prefix"]["index_url"] == f"zmq://{index.host}:8301"
    transfer = json.loads(engine.argv[engine.argv.index("--kv-transfer-config") + 1])
    announce = transfer["kv_connector_extra_config"]["index"]["announce"]
    assert announce["index_url"] == index.url  # http
