"""The base of every config section, how one section is loaded, and the size parser.

A leaf: it imports no section. Each package's section model lives with that package and
subclasses :class:`Section`; wiring code loads only its own section with :func:`load_section`.
Only the CLIs and the aggregate :mod:`kvstack.config` know the whole tree.

Sources, later ones winning: the YAML file named by ``KVSTACK_CONFIG`` (or passed explicitly),
a dict given in code, then environment variables ``KVSTACK_<SECTION>_<KEY>`` (nested keys joined
with ``__``, e.g. ``KVSTACK_ROUTER_HEALTH__INTERVAL_S=2``; lists, objects, quoted strings and
``null`` are parsed as JSON, anything else is a string that the field's type converts). Unknown
keys anywhere are errors.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from kvstack.errors import ConfigError
from kvstack.redact import redact_data

__all__ = [
    "CONFIG_ENV",
    "ENV_PREFIX",
    "SECTIONS",
    "Section",
    "ValueOrigins",
    "deep_merge",
    "env_overrides",
    "format_size",
    "load_section",
    "log_config_once",
    "parse_size",
    "read_config_file",
    "validate_section",
]

log = logging.getLogger(__name__)

ENV_PREFIX = "KVSTACK_"
CONFIG_ENV = "KVSTACK_CONFIG"
# The top-level sections of a config file (kvstack.config's tree; a test keeps the two equal).
# Kept here so that every loader, not only the whole tree's, refuses an unknown section.
SECTIONS = ("kv", "router", "epp", "lora", "index", "sim", "bench", "stack", "security")


class Section(BaseModel):
    """Base of every config section: unknown keys are errors; assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


S = TypeVar("S", bound=Section)


def load_section(
    name: str,
    cls: type[S],
    data: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    path: str | Path | None = None,
) -> S:
    """Load one section: its part of the YAML file, then ``data``, then ``KVSTACK_<NAME>_*``."""
    env = os.environ if env is None else env
    file_tree = read_config_file(path, env)
    from_file = file_tree.get(name, {}) or {}
    if not isinstance(from_file, Mapping):
        raise ConfigError(f"config section {name!r} must be a mapping, got {from_file!r}")
    merged = deep_merge(dict(from_file), dict(data or {}))
    merged = deep_merge(merged, env_overrides(env, (name,)).get(name, {}))
    origins = ValueOrigins.of(path or env.get(CONFIG_ENV), file_tree, data, env, (name,))
    return validate_section(cls, merged, name, origins)


_logged: set[str] = set()


def log_config_once(name: str, section: BaseModel) -> None:
    """Log the effective config of a component once per process: ``SecretStr`` values masked
    by pydantic, URL passwords in plain strings by :func:`kvstack.redact.redact_data`."""
    text = json.dumps(redact_data(section.model_dump(mode="json")), sort_keys=True)
    if f"{name}:{text}" in _logged:
        return
    _logged.add(f"{name}:{text}")
    log.info("effective %s config: %s", name, text)


@dataclass(frozen=True)
class ValueOrigins:
    """Where each configured value came from, so an error names the file and key or the
    environment variable the user has to fix. Later sources win: env, then ``data``, then file."""

    file: str | None = None
    file_tree: Mapping[str, Any] = field(default_factory=dict)
    data: Mapping[str, Any] = field(default_factory=dict)
    env_vars: Mapping[tuple[str, ...], str] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        file: str | Path | None,
        file_tree: Mapping[str, Any],
        data: Mapping[str, Any] | None,
        env: Mapping[str, str],
        sections: tuple[str, ...],
    ) -> ValueOrigins:
        """``data`` is one section's dict when ``sections`` holds one name, else the tree's."""
        tree = {sections[0]: dict(data or {})} if len(sections) == 1 else dict(data or {})
        return cls(str(file) if file else None, file_tree, tree, env_var_paths(env, sections))

    def describe(self, path: tuple[str | int, ...]) -> str:
        """``KVSTACK_ROUTER_PORT``, ``router.yaml: router.port`` or ``router.port``."""
        for end in range(len(path), 0, -1):
            var = self.env_vars.get(tuple(str(p).lower() for p in path[:end]))
            if var is not None:
                return f"environment variable {var}"
        dotted = ".".join(str(p) for p in path)
        if _holds(self.data, path) or not self.file or not _holds(self.file_tree, path):
            return dotted
        return f"{self.file}: {dotted}"


def _holds(tree: Any, path: tuple[str | int, ...]) -> bool:
    for part in path:
        if isinstance(tree, list) and isinstance(part, int) and part < len(tree):  # noqa: SIM114
            tree = tree[part]
        elif isinstance(tree, Mapping) and part in tree:
            tree = tree[part]
        else:
            return False
    return True


def validate_section(
    cls: type[S], data: dict[str, Any], where: str, origins: ValueOrigins | None = None
) -> S:
    """``cls`` from ``data``, or one ConfigError naming each problem, where its value came from
    (``origins``) and the fix. ``where`` is the section's path ("config": the whole tree)."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        prefix = () if where == "config" else tuple(where.split("."))
        problems = "; ".join(
            describe_problem(cls, err, prefix, origins or ValueOrigins()) for err in exc.errors()
        )
        raise ConfigError(f"invalid configuration: {problems}") from None


def describe_problem(
    cls: type[BaseModel], err: Any, prefix: tuple[str, ...], origins: ValueOrigins
) -> str:
    """One pydantic error as ``source: problem; fix``."""
    loc = tuple(err["loc"])
    source = origins.describe((*prefix, *loc))
    if err["type"] == "extra_forbidden":
        known = _keys_at(cls, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(known)}"
        return f"{source}: unknown key; {hint}"
    got = "" if err["type"] == "missing" else f" (got {err['input']!r})"
    text = f"{source}: {err['msg']}{got}"
    if source.startswith("environment variable") and err["type"] in _JSON_TYPES:
        text += '; lists and objects in environment variables are JSON, e.g. \'["a", "b"]\''
    return text


_JSON_TYPES = {"list_type", "dict_type", "model_type", "model_attributes_type", "tuple_type"}


def _keys_at(cls: type[BaseModel], loc: tuple[str | int, ...]) -> list[str]:
    """The keys the model accepts at ``loc`` (list indexes and dict keys stay on the item)."""
    model = cls
    for part in loc:
        if isinstance(part, str) and part in model.model_fields:
            inner = _inner_model(model.model_fields[part].annotation)
            if inner is None:
                return []
            model = inner
    return sorted(model.model_fields)


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def read_config_file(path: str | Path | None, env: Mapping[str, str]) -> dict[str, Any]:
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
    for name in loaded:
        if name not in SECTIONS:
            close = difflib.get_close_matches(str(name), SECTIONS, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"sections: {', '.join(SECTIONS)}"
            raise ConfigError(f"{path}: unknown top-level section {name!r}; {hint}")
    return loaded


def env_overrides(env: Mapping[str, str], sections: tuple[str, ...]) -> dict[str, Any]:
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
        node[leaf] = parse_env_value(raw)
    return out


def env_var_paths(env: Mapping[str, str], sections: tuple[str, ...]) -> dict[tuple[str, ...], str]:
    """``{("router", "port"): "KVSTACK_ROUTER_PORT"}``: which variable set which key."""
    out = {}
    for var in env:
        if not var.startswith(ENV_PREFIX) or var == CONFIG_ENV:
            continue
        section, _, rest = var[len(ENV_PREFIX) :].partition("_")
        if section.lower() in sections and rest:
            out[(section.lower(), *rest.lower().split("__"))] = var
    return out


def parse_env_value(raw: str) -> Any:
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


def deep_merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
    "t": 10**12, "tb": 10**12,
    "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30,
    "ti": 2**40, "tib": 2**40,
}  # fmt: skip
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int, what: str = "size") -> int:
    """Parse ``"8GiB"``, ``"512MB"``, ``"1.5G"`` or a plain byte count into bytes (>= 0)."""
    if isinstance(text, int):
        if text < 0:
            raise ConfigError(f"{what} must be >= 0 bytes, got {text}")
        return text
    match = _SIZE_RE.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _SIZE_UNITS:
        raise ConfigError(
            f"{what} {text!r} is not a size; use a number with an optional unit such as "
            "512MiB, 8GiB or 100GB"
        )
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def format_size(num_bytes: float) -> str:
    """Human-readable binary size, e.g. ``32.0 MiB``."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    raise AssertionError("unreachable")
