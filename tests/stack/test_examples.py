"""Every example stack file loads and plans (models are built, nothing is started)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvstack.config import load_config, load_section
from kvstack.lora.config import LoRAConfig
from kvstack.router.config import ROUTER_PORT, RouterConfig
from kvstack.stack.components import plan_stack
from kvstack.stack.config import StackConfig

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_plans(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvstack.models import toy

    # The examples use the ~150M toy model; planning needs only its directory.
    monkeypatch.setattr(toy, "SMALL", toy.TINY)
    config = load_config(path, env={})
    parts = plan_stack(config.stack, tmp_path)
    assert any(c.kind == "engine" for c in parts)
    router = tmp_path / "router.yaml"
    if config.stack.router is not None:
        section = yaml.safe_load(router.read_text())["router"]
        assert len(section["backends"]) == sum(c.kind == "engine" for c in parts)
        written = load_config(router, env={})  # the router accepts what the stack wrote
        if config.stack.lora is not None:
            assert written.router.adapters.enabled
            lora = load_section("lora", LoRAConfig, path=router, env={})
            lora_engines = [c for c in parts if c.lora is not None]
            assert [e.url for e in lora.engines] == [c.url for c in lora_engines]
            assert set(lora.base_models) == {e.base_model for e in lora.engines}
            assert lora.registry_url.startswith(f"sqlite:///{tmp_path.resolve()}")


def test_there_are_examples_for_each_shape() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {
        "single-machine",
        "two-engines-shared-disk",
        "fleet-redis-index",
        "prefill-decode",
        "multi-tenant-lora",
    } <= names


def test_the_cli_the_stack_and_the_examples_share_one_router_port() -> None:
    stack_router = StackConfig().router
    assert stack_router is not None and stack_router.port == RouterConfig().port == ROUTER_PORT
    assert ROUTER_PORT != 8000  # vLLM's own default: an engine on the same host would collide
    routers = [load_config(p, env={}).stack.router for p in EXAMPLES]
    assert {r.port for r in routers if r is not None} == {ROUTER_PORT}
