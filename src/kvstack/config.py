"""One typed configuration tree for every kvstack component.

Sources, later ones winning: the YAML file named by ``KVSTACK_CONFIG`` (or passed explicitly),
a dict given in code, then environment variables ``KVSTACK_<SECTION>_<KEY>`` (nested keys joined
with ``__``, e.g. ``KVSTACK_ROUTER_HEALTH__INTERVAL_S=2``; lists, objects, quoted strings and
``null`` are parsed as JSON, anything else is a string that the field's type converts). Unknown
keys anywhere are errors. Each component takes only its
own section (``kv``, ``router``, ``lora``, ``index``, ``sim``, ``bench``, ``stack``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, Field, ValidationError

from kvstack.bench.config import BenchConfig
from kvstack.errors import ConfigError
from kvstack.index.config import IndexConfig
from kvstack.kv.config import KVConfig
from kvstack.lora.config import LoRAConfig
from kvstack.router.config import RouterConfig
from kvstack.section import Section, format_size, parse_size
from kvstack.sim.config import SimConfig
from kvstack.stack.config import StackConfig

__all__ = [
    "KVStackConfig",
    "Section",
    "format_size",
    "load_config",
    "load_section",
    "log_config_once",
    "parse_size",
]

log = logging.getLogger(__name__)
S = TypeVar("S", bound=Section)

ENV_PREFIX = "KVSTACK_"
CONFIG_ENV = "KVSTACK_CONFIG"


class KVStackConfig(Section):
    """The whole tree; each attribute is one component's section."""

    kv: KVConfig = Field(default_factory=KVConfig)
    router: RouterConfig = Field(default_factory=RouterConfig)
    lora: LoRAConfig = Field(default_factory=LoRAConfig)
    index: IndexConfig = Field(default_factory=IndexConfig)
    sim: SimConfig = Field(default_factory=SimConfig)
    bench: BenchConfig = Field(default_factory=BenchConfig)
    stack: StackConfig = Field(default_factory=StackConfig)


SECTION_NAMES = tuple(KVStackConfig.model_fields)


def load_config(
    path: str | Path | None = None,
    data: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> KVStackConfig:
    """Load the whole tree from a YAML file, a dict and the environment (in that order)."""
    env = os.environ if env is None else env
    merged = _deep_merge(_read_file(path, env), dict(data or {}))
    merged = _deep_merge(merged, _env_overrides(env, SECTION_NAMES))
    return _validate(KVStackConfig, merged, "config")


def load_section(
    name: str,
    cls: type[S],
    data: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    path: str | Path | None = None,
) -> S:
    """Load one section: its part of the YAML file, then ``data``, then ``KVSTACK_<NAME>_*``."""
    env = os.environ if env is None else env
    from_file = _read_file(path, env).get(name, {}) or {}
    if not isinstance(from_file, Mapping):
        raise ConfigError(f"config section {name!r} must be a mapping, got {from_file!r}")
    merged = _deep_merge(dict(from_file), dict(data or {}))
    merged = _deep_merge(merged, _env_overrides(env, (name,)).get(name, {}))
    return _validate(cls, merged, name)


_logged: set[str] = set()


def log_config_once(name: str, section: BaseModel) -> None:
    """Log the effective config of a component once per process (secrets masked by pydantic)."""
    text = json.dumps(section.model_dump(mode="json"), sort_keys=True)
    if f"{name}:{text}" in _logged:
        return
    _logged.add(f"{name}:{text}")
    log.info("effective %s config: %s", name, text)


def _validate(cls: type[S], data: dict[str, Any], where: str) -> S:
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{where}.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
            + (f" (got {err['input']!r})" if err["type"] != "missing" else "")
            for err in exc.errors()
        )
        raise ConfigError(f"invalid configuration: {problems}") from None


def _read_file(path: str | Path | None, env: Mapping[str, str]) -> dict[str, Any]:
    path = path or env.get(CONFIG_ENV)
    if not path:
        return {}
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    try:
        loaded = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping at the top level")
    return loaded


def _env_overrides(env: Mapping[str, str], sections: tuple[str, ...]) -> dict[str, Any]:
    """``KVSTACK_KV_CHUNK_SIZE=512`` -> ``{"kv": {"chunk_size": 512}}`` for the given sections."""
    out: dict[str, Any] = {}
    for var, raw in env.items():
        if not var.startswith(ENV_PREFIX) or var == CONFIG_ENV:
            continue
        section, _, rest = var[len(ENV_PREFIX) :].partition("_")
        section = section.lower()
        if section not in sections or not rest:
            continue
        node = out.setdefault(section, {})
        *parents, leaf = rest.lower().split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = _parse_env_value(raw)
    return out


def _parse_env_value(raw: str) -> Any:
    """JSON for lists, objects, quoted strings and ``null``; everything else stays a string
    and is converted by the field's type (so ``KVSTACK_KV_MODEL=123`` is the string "123",
    while ``KVSTACK_KV_CHUNK_SIZE=512`` still becomes the integer 512)."""
    text = raw.strip()
    if text == "null" or text[:1] in ("[", "{", '"'):
        try:
            return json.loads(text)
        except ValueError:
            return raw
    return raw


def _deep_merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _deep_merge(dict(out[key]), value)
        else:
            out[key] = value
    return out
