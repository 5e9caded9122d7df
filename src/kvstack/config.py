"""The aggregate configuration tree: every component's section under one root.

Only the CLIs import this module (``kvstack config show``, ``kvstack up`` and tools that need
the whole tree). Everything else loads its own section with :func:`kvstack.section.load_section`;
see that module for the sources (file, dict, ``KVSTACK_*`` environment) and their order.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from kvstack.bench.config import BenchConfig
from kvstack.cluster.config import IndexConfig
from kvstack.kv.config import KVConfig
from kvstack.lora.config import LoRAConfig
from kvstack.router.config import RouterConfig
from kvstack.router.epp.config import EppConfig
from kvstack.section import (
    CONFIG_ENV,
    Section,
    ValueOrigins,
    deep_merge,
    env_overrides,
    format_size,
    load_section,
    log_config_once,
    parse_size,
    read_config_file,
    validate_section,
)
from kvstack.security import SecurityConfig
from kvstack.sim.config import SimConfig
from kvstack.stack.config import StackConfig

__all__ = [
    "SECTION_NAMES",
    "KVStackConfig",
    "Section",
    "format_size",
    "load_config",
    "load_section",
    "log_config_once",
    "parse_size",
]


class KVStackConfig(Section):
    """The whole tree; each attribute is one component's section."""

    kv: KVConfig = Field(default_factory=KVConfig)
    router: RouterConfig = Field(default_factory=RouterConfig)
    epp: EppConfig = Field(default_factory=EppConfig)
    lora: LoRAConfig = Field(default_factory=LoRAConfig)
    index: IndexConfig = Field(default_factory=IndexConfig)
    sim: SimConfig = Field(default_factory=SimConfig)
    bench: BenchConfig = Field(default_factory=BenchConfig)
    stack: StackConfig = Field(default_factory=StackConfig)
    security: SecurityConfig = Field(default_factory=SecurityConfig)


SECTION_NAMES = tuple(KVStackConfig.model_fields)


def load_config(
    path: str | Path | None = None,
    data: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> KVStackConfig:
    """Load the whole tree from a YAML file, a dict and the environment (in that order)."""
    env = os.environ if env is None else env
    file_tree = read_config_file(path, env)
    merged = deep_merge(file_tree, dict(data or {}))
    merged = deep_merge(merged, env_overrides(env, SECTION_NAMES))
    origins = ValueOrigins.of(path or env.get(CONFIG_ENV), file_tree, data, env, SECTION_NAMES)
    return validate_section(KVStackConfig, merged, "config", origins)
