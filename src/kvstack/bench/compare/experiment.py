"""The ``bench compare`` experiment file (YAML), validated.

```yaml
name: shared-prefix-16
fleet:
  kind: sim                 # sim | vllm
  engines: 16
  kv_events: true           # engines publish KV events (for event-driven routers)
  sim: {time_scale: 10, num_blocks: 1024, block_size: 16}   # the `sim` section, any field
workload:
  name: shared-prefix
  params: {groups: 16, users_per_group: 5, system_prompt_tokens: 900}
rates: [4, 8, 16]           # or concurrencies: [8, 32]
duration_s: 120
slo: {ttft_s: 2.0, tpot_s: 0.1}
frontends:
  - {name: round-robin, preset: rr-proxy}
  - {name: vllm-router cache_aware, preset: "vllm-router:cache_aware"}
  - {name: kvstack least_load, preset: "kvstack-router:least_load"}
  - name: custom
    command: ["{python}", "-m", "my.router", "--port", "{port}", "{backend_flags}"]
```
Rates, durations and latencies are in simulated seconds for a ``sim`` fleet with a time scale.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from kvstack.errors import ConfigError
from kvstack.section import Section
from kvstack.sim.config import SimConfig

__all__ = ["Experiment", "FleetSpec", "FrontendSpec", "VLLMFleetSpec", "load_experiment"]


class VLLMFleetSpec(Section):
    model: str = Field(default="toy", description="'toy' (built on first use) or a model path")
    max_model_len: int = Field(default=4096, gt=0, description="--max-model-len")
    kv_cache_space_gib: int = Field(default=1, gt=0, description="VLLM_CPU_KVCACHE_SPACE")
    block_size: int = Field(default=128, gt=0, description="--block-size (CPU: multiple of 32)")
    enable_lora: bool = Field(default=False, description="--enable-lora")
    max_loras: int = Field(default=1, ge=1, description="--max-loras")
    extra_args: list[str] = Field(default_factory=list, description="more vLLM arguments")


class FleetSpec(Section):
    kind: Literal["sim", "vllm"] = Field(default="sim", description="simulated or real engines")
    engines: int = Field(default=4, ge=1, le=256, description="number of engines")
    kv_events: bool = Field(default=False, description="publish KV events from every engine")
    sim: dict[str, Any] = Field(default_factory=dict, description="`sim` section for sim fleets")
    vllm: VLLMFleetSpec = Field(default_factory=VLLMFleetSpec, description="vLLM fleet options")
    load_adapters: bool = Field(
        default=True, description="load the workload's LoRA adapters on every engine first"
    )

    @model_validator(mode="after")
    def _check_sim(self) -> FleetSpec:
        if self.kind == "sim":
            self.sim_config()  # unknown or out-of-range fields fail here, at load time
        return self

    def sim_config(self) -> SimConfig:
        try:
            return SimConfig.model_validate(self.sim)
        except ValidationError as exc:
            e = exc.errors()[0]
            where = ".".join(str(p) for p in e["loc"])
            got = f" (got {e['input']!r})" if e["type"] != "missing" else ""
            raise ValueError(f"fleet.sim.{where}: {e['msg']}{got}") from None

    @property
    def time_scale(self) -> float:
        return self.sim_config().time_scale if self.kind == "sim" else 1.0


class FrontendSpec(Section):
    name: str = Field(min_length=1, description="label in the table and plots")
    preset: str | None = Field(
        default=None,
        description="rr-proxy | kvstack-router:POLICY | vllm-router:POLICY (instead of command)",
    )
    command: list[str] | None = Field(default=None, description="argv with placeholders")
    health_path: str = Field(default="/health", description="path polled until it answers 200")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment")

    @model_validator(mode="after")
    def _one_source(self) -> FrontendSpec:
        if (self.preset is None) == (self.command is None):
            raise ValueError(f"frontend {self.name!r}: give exactly one of preset and command")
        return self


class WorkloadSpec(Section):
    name: str = Field(
        description="multi-round-qa | shared-prefix | long-doc-qa | lora-zipf | unique"
    )
    params: dict[str, Any] = Field(default_factory=dict, description="workload parameters")


class SLOSpec(Section):
    ttft_s: float | None = Field(default=2.0, gt=0, description="time to first token bound")
    tpot_s: float | None = Field(default=0.1, gt=0, description="time per output token bound")


class Experiment(Section):
    name: str = Field(min_length=1, description="experiment name (output folder)")
    fleet: FleetSpec = Field(default_factory=FleetSpec)
    workload: WorkloadSpec
    rates: list[float] | None = Field(default=None, description="open-loop request rates")
    concurrencies: list[int] | None = Field(default=None, description="closed-loop users")
    duration_s: float = Field(default=60.0, gt=0, description="seconds of load per run")
    seed: int = Field(default=0, description="workload and arrival seed (same for every run)")
    slo: SLOSpec = Field(default_factory=SLOSpec)
    frontends: list[FrontendSpec] = Field(min_length=1, description="front ends to compare")
    output_dir: str | None = Field(
        default=None, description="default: bench-results/compare/<name>"
    )

    @model_validator(mode="after")
    def _load(self) -> Experiment:
        if (self.rates is None) == (self.concurrencies is None):
            raise ValueError("give exactly one of rates and concurrencies")
        points = self.rates or self.concurrencies or []
        if not points or any(p <= 0 for p in points):
            raise ValueError(f"rates/concurrencies must be positive, got {points}")
        names = [f.name for f in self.frontends]
        if len(set(names)) != len(names):
            raise ValueError(f"frontend names must be unique, got {names}")
        return self

    @property
    def points(self) -> list[float]:
        return [float(p) for p in (self.rates or self.concurrencies or [])]


def load_experiment(path: str | Path) -> Experiment:
    """Read and validate an experiment file; errors name the file and the bad field."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read experiment {str(path)!r}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"experiment {str(path)!r} is not valid YAML: {exc}") from None
    try:
        return Experiment.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'experiment'}: {e['msg']}"
            for e in exc.errors()
        )
        raise ConfigError(f"experiment {str(path)!r}: {problems}") from None
