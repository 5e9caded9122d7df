"""Which cores each vLLM CPU engine of a stack gets: the plan, and how `kvstack up` applies it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvstack.errors import ConfigError
from kvstack.section import load_section
from kvstack.stack.components import plan_stack
from kvstack.stack.config import StackConfig
from kvstack.stack.cores import format_cpu_list, plan_cores
from kvstack.stack.supervisor import Stack

CPUS_2, CPUS_16 = list(range(2)), list(range(16))


def engines(count: int, ranks: int = 1) -> dict[str, int]:
    return {f"engine-{i}": ranks for i in range(count)}


@pytest.mark.parametrize(
    ("cpus", "count", "cores", "reserved"),
    [
        # one core kept for the router, index and connector threads when there are spare ones
        (CPUS_2, 1, ["0"], "1"),
        (CPUS_2, 2, ["0", "1"], ""),  # as many cores as engines: one each, none reserved
        (CPUS_2, 4, ["0", "1", "0", "1"], ""),  # fewer: shared round-robin (and a warning)
        (CPUS_16, 1, ["0-14"], "15"),
        (CPUS_16, 2, ["0-6", "7-13"], "14-15"),  # equal shares; the odd core joins the reserve
        (CPUS_16, 4, ["0-2", "3-5", "6-8", "9-11"], "12-15"),
    ],
)
def test_each_engine_gets_its_own_equal_share(
    cpus: list[int], count: int, cores: list[str], reserved: str
) -> None:
    plan = plan_cores(engines(count), cpus)
    assert [plan.bind(name) for name in engines(count)] == cores
    assert format_cpu_list(plan.reserved) == reserved
    assert (plan.warning is not None) == (count > len(cpus))
    used = [core for name in engines(count) for core in plan.cores(name)]
    if count <= len(cpus):  # nobody computes on another engine's core or a reserved one
        assert len(set(used)) == len(used) and not set(used) & set(plan.reserved)
        assert len({len(plan.cores(name)) for name in engines(count)}) == 1


def test_fewer_cores_than_engines_is_a_clear_warning() -> None:
    plan = plan_cores(engines(4), CPUS_2)
    assert plan.warning is not None
    assert "4 vLLM CPU engines but only 2 core(s)" in plan.warning
    assert "slower" in plan.warning


def test_reserved_cores_can_be_chosen_and_stay_in_range() -> None:
    plan = plan_cores(engines(2), CPUS_16, reserved=4)
    assert [plan.bind(n) for n in engines(2)] == ["0-5", "6-11"]
    assert plan.reserved == (12, 13, 14, 15)
    assert plan_cores(engines(2), CPUS_16, reserved=0).reserved == ()
    tight = plan_cores(engines(2), CPUS_2, reserved=1)  # never at an engine's expense
    assert [tight.bind(n) for n in engines(2)] == ["0", "1"] and tight.reserved == ()
    with pytest.raises(ConfigError, match="reserved"):
        plan_cores(engines(1), CPUS_2, reserved=2)


def test_tensor_parallel_ranks_get_one_list_each() -> None:
    plan = plan_cores({"big": 2, "small": 1}, CPUS_16)
    assert plan.bind("big") == "0-4|5-9" and plan.bind("small") == "10-14"
    assert plan.summary() == "cores (16): big on 0-9, small on 10-14; reserved: 15"


def config(**stack: object) -> StackConfig:
    return load_section("stack", StackConfig, stack, env={})


def vllm_engine(name: str, replicas: int = 1, **more: object) -> dict[str, object]:
    return {"name": name, "kind": "vllm", "model": "/models/m", "replicas": replicas, **more}


def test_up_binds_vllm_engines_and_pins_the_rest_to_the_reserved_cores(tmp_path: Path) -> None:
    cfg = config(
        cores={"bind": "on", "cpus": CPUS_16},
        index={},
        engines=[
            vllm_engine("a", 2, connector={"tiers": ["cpu://"]}),
            vllm_engine("own", env={"VLLM_CPU_OMP_THREADS_BIND": "3"}),  # the operator's wins
            {"name": "sim", "kind": "sim"},
        ],
    )
    parts = {c.name: c for c in plan_stack(cfg, tmp_path)}
    assert parts["a-0"].env["VLLM_CPU_OMP_THREADS_BIND"] == "0-6"
    assert parts["a-1"].env["VLLM_CPU_OMP_THREADS_BIND"] == "7-13"
    assert parts["a-1"].cores == tuple(range(7, 14))
    assert parts["a-0"].env["KVSTACK_BACKGROUND_CPUS"] == "14-15"  # the connector's threads
    assert parts["own"].env["VLLM_CPU_OMP_THREADS_BIND"] == "3" and parts["own"].cores == ()
    assert "KVSTACK_BACKGROUND_CPUS" not in parts["own"].env  # no connector
    assert "VLLM_CPU_OMP_THREADS_BIND" not in parts["sim"].env
    assert parts["router"].cpus == parts["index"].cpus == (14, 15)


def test_binding_off_leaves_vllm_its_default(tmp_path: Path) -> None:
    cfg = config(cores={"bind": "off", "cpus": CPUS_2}, engines=[vllm_engine("a", 2)])
    parts = plan_stack(cfg, tmp_path)
    assert all("VLLM_CPU_OMP_THREADS_BIND" not in c.env and not c.cpus for c in parts)


def test_a_reference_engine_can_stay_out_of_the_router_on_anothers_cores(tmp_path: Path) -> None:
    cfg = config(  # what the demo does: vLLM alone on engine a-1's cores, for comparison
        cores={"bind": "on", "cpus": CPUS_2},
        engines=[
            vllm_engine("a", 2),
            vllm_engine("ref", routed=False, env={"VLLM_CPU_OMP_THREADS_BIND": "1"}),
        ],
    )
    parts = plan_stack(cfg, tmp_path)
    router = yaml.safe_load((tmp_path / "router.yaml").read_text())["router"]
    assert [b["name"] for b in router["backends"]] == ["a-0", "a-1"]
    assert [c.env["VLLM_CPU_OMP_THREADS_BIND"] for c in parts[:3]] == ["0", "1", "1"]


def test_up_warns_when_engines_outnumber_cores(capsys: pytest.CaptureFixture[str]) -> None:
    stack = Stack(config(cores={"bind": "on", "cpus": CPUS_2}, engines=[vllm_engine("a", 3)]))
    stack._announce_cores()
    assert "WARNING: 3 vLLM CPU engines but only 2 core(s)" in capsys.readouterr().err


def test_with_no_core_reserved_the_connectors_threads_may_use_every_core(tmp_path: Path) -> None:
    """Two engines on two cores: pinned to the cores its worker is not bound to (the default),
    each engine's connector threads would all sit on the other engine's compute core."""
    cfg = config(
        cores={"bind": "on", "cpus": CPUS_2},
        engines=[vllm_engine("a", 2, connector={"tiers": ["cpu://"]}), vllm_engine("plain")],
    )
    parts = {c.name: c for c in plan_stack(cfg, tmp_path)}
    assert [parts[n].env["VLLM_CPU_OMP_THREADS_BIND"] for n in ("a-0", "a-1")] == ["0", "1"]
    assert parts["a-0"].env["KVSTACK_BACKGROUND_CPUS"] == "0-1"
    assert parts["a-1"].env["KVSTACK_BACKGROUND_CPUS"] == "0-1"
    assert "KVSTACK_BACKGROUND_CPUS" not in parts["plain"].env
