"""The config tree: YAML, dicts and KVSTACK_* environment variables, in that order of precedence;
unknown keys and bad values are ConfigErrors that name the problem."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kvstack.config import (
    SECTION_NAMES,
    KVStackConfig,
    load_config,
    load_section,
    log_config_once,
)
from kvstack.errors import ConfigError, KVStackError, MissingExtraError, require
from kvstack.kv.config import KVConfig
from kvstack.log import IncidentLogger, setup_logging
from kvstack.metrics import counter, gauge, registered_metric_names
from kvstack.registry import Registry
from kvstack.section import SECTIONS, format_size, parse_size


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "kvstack.yaml"
    path.write_text(text)
    return path


def test_yaml_dict_env_precedence(tmp_path: Path) -> None:
    path = write(tmp_path, "kv:\n  model: from-file\n  chunk_size: 128\n  tp_size: 4\n")
    env = {"KVSTACK_CONFIG": str(path), "KVSTACK_KV_CHUNK_SIZE": "512"}
    cfg = load_section("kv", KVConfig, {"model": "from-dict", "chunk_size": 64}, env=env)
    assert (cfg.model, cfg.chunk_size, cfg.tp_size) == ("from-dict", 512, 4)
    assert load_section("kv", KVConfig, env={"KVSTACK_CONFIG": str(path)}).model == "from-file"


def test_explicit_path_and_whole_tree(tmp_path: Path) -> None:
    path = write(tmp_path, "kv:\n  model: m@1\nbench: {}\n")
    cfg = load_config(path, env={"KVSTACK_KV_SAVE_PARTIAL_CHUNKS": "true"})
    assert isinstance(cfg, KVStackConfig) and cfg.kv.model == "m@1" and cfg.kv.save_partial_chunks


def test_environment_values_take_the_field_type() -> None:
    env = {
        "KVSTACK_KV_MODEL": "123",  # stays a string
        "KVSTACK_KV_CHUNK_SIZE": "512",
        "KVSTACK_KV_TIERS": '["cpu://?size=1MiB", "cpu://?size=2MiB"]',
        "KVSTACK_KV_KV_DTYPE": "null",
        "KVSTACK_KV_PROMOTE_ON_HIT": "false",
        "KVSTACK_LOG_LEVEL": "DEBUG",  # not a section: ignored
        "HOME": "/root",
    }
    cfg = load_section("kv", KVConfig, {"kv_dtype": "float16"}, env=env)
    assert cfg.model == "123" and cfg.chunk_size == 512 and cfg.kv_dtype is None
    assert cfg.tiers == ["cpu://?size=1MiB", "cpu://?size=2MiB"] and cfg.promote_on_hit is False


def test_nested_keys_with_double_underscore(tmp_path: Path) -> None:
    path = write(tmp_path, "kv:\n  model_shape: {num_layers: 2, num_kv_heads: 2, head_dim: 64}\n")
    env = {"KVSTACK_CONFIG": str(path), "KVSTACK_KV_MODEL_SHAPE__NUM_LAYERS": "32"}
    shape = load_section("kv", KVConfig, env=env).model_shape
    assert shape is not None and (shape.num_layers, shape.num_kv_heads, shape.head_dim) == (
        32,
        2,
        64,
    )


@pytest.mark.parametrize(
    ("data", "env", "problem"),
    [
        ({"chunk_sise": 256}, {}, r"kv\.chunk_sise: unknown key; did you mean 'chunk_size'\?"),
        ({}, {"KVSTACK_KV_COLOUR": "red"}, r"environment variable KVSTACK_KV_COLOUR: unknown key"),
        ({"model_shape": {"num_layers": 2, "heads": 1}}, {}, r"kv\.model_shape\.heads"),
        ({"chunk_size": 0}, {}, r"kv\.chunk_size: Input should be greater than 0 \(got 0\)"),
        ({}, {"KVSTACK_KV_CHUNK_SIZE": "lots"}, r"KVSTACK_KV_CHUNK_SIZE: .*\(got 'lots'\)"),
        ({}, {"KVSTACK_KV_TIERS": "cpu://"}, r"KVSTACK_KV_TIERS: .*environment variables are JSON"),
        ({"tiers": ["cpu://?size=1GiB", "nfs://x"]}, {}, "unknown tier scheme 'nfs'"),
        ({"tiers": "cpu://"}, {}, r"kv\.tiers: Input should be a valid list"),
    ],
)
def test_bad_values_and_unknown_keys(
    data: dict[str, object], env: dict[str, str], problem: str
) -> None:
    with pytest.raises(ConfigError, match=problem):
        load_section("kv", KVConfig, data, env=env)


def test_errors_name_the_file_and_key_or_the_variable(tmp_path: Path) -> None:
    path = write(tmp_path, "kv:\n  chunk_size: 0\n  model: m\n")
    with pytest.raises(ConfigError, match=rf"{path}: kv\.chunk_size: Input should be greater"):
        load_section("kv", KVConfig, path=path, env={})
    env = {"KVSTACK_KV_CHUNK_SIZE": "-1"}  # the variable wins over the file, and is named
    with pytest.raises(ConfigError, match=r"variable KVSTACK_KV_CHUNK_SIZE: Input") as caught:
        load_config(path, env=env)
    assert "kv.chunk_size" not in str(caught.value)
    with pytest.raises(ConfigError, match=r"^invalid configuration: kv\.chunk_size: "):
        load_section("kv", KVConfig, {"chunk_size": 0}, path=path, env={})  # given in code


def test_the_sections_list_is_the_trees() -> None:
    assert SECTIONS == SECTION_NAMES


def test_unknown_sections_and_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown top-level section 'kvv'; did you mean 'kv'"):
        load_config(write(tmp_path, "kvv: {}\n"), env={})
    with pytest.raises(ConfigError, match=r"unknown top-level section 'routr'"):  # every loader
        load_section("kv", KVConfig, path=write(tmp_path, "routr: {}\n"), env={})
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(write(tmp_path, "kv: [unclosed\n"), env={})
    with pytest.raises(ConfigError, match="must hold a mapping at the top level"):
        load_config(write(tmp_path, "- a\n- b\n"), env={})
    with pytest.raises(ConfigError, match="config section 'kv' must be a mapping"):
        load_section("kv", KVConfig, env={"KVSTACK_CONFIG": str(write(tmp_path, "kv: 5\n"))})
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml", env={})


def test_effective_config_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    cfg = KVConfig(model="logged-once@1")
    with caplog.at_level(logging.INFO, logger="kvstack.section"):
        log_config_once("kv", cfg)
        log_config_once("kv", cfg)
    lines = [r.getMessage() for r in caplog.records if "logged-once@1" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("effective kv config: {")


@pytest.mark.parametrize(
    ("text", "num_bytes"),
    [
        ("8GiB", 8 << 30),
        ("512MB", 512_000_000),
        ("1.5G", 1_500_000_000),
        ("100", 100),
        (" 4 KiB ", 4096),
        (7, 7),
    ],
)
def test_parse_size(text: str | int, num_bytes: int) -> None:
    assert parse_size(text) == num_bytes


@pytest.mark.parametrize("text", ["-1GiB", "lots", "8 GiBs", "", "1e3"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="is not a size"):
        parse_size(text, "cpu tier size")
    with pytest.raises(ConfigError, match=">= 0 bytes, got -5"):
        parse_size(-5)


def test_format_size() -> None:
    assert [format_size(n) for n in (12, 32 << 20, 3 << 40)] == ["12 B", "32.0 MiB", "3.0 TiB"]


def test_registry_is_lazy_and_names_known_entries() -> None:
    reg: Registry[object] = Registry("widget")
    reg.register("path", "pathlib:Path")
    reg.register("obj", 42)
    assert reg.get("path") is Path and reg.get("obj") == 42 and list(reg) == ["obj", "path"]
    with pytest.raises(ConfigError, match="unknown widget 'nope'; known: obj, path"):
        reg.get("nope")
    with pytest.raises(ValueError, match="already registered"):
        reg.register("obj", 1)


def test_error_hierarchy() -> None:
    assert issubclass(ConfigError, ValueError) and issubclass(ConfigError, KVStackError)
    assert issubclass(MissingExtraError, ImportError)
    with pytest.raises(MissingExtraError, match=r"pip install 'kvstack\[nothing\]'"):
        require("kvstack_no_such_module", "nothing")


def test_incident_logger_reports_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    incidents = IncidentLogger(logging.getLogger("kvstack.test"), interval_s=3600)
    with caplog.at_level(logging.WARNING, logger="kvstack.test"):
        for i in range(5):
            incidents.warning("disk", "disk full %d", i)
        incidents.warning("net", "connection refused")
    assert [r.getMessage() for r in caplog.records] == ["disk full 0", "connection refused"]


@pytest.mark.parametrize(("level", "httpx_level"), [("INFO", "WARNING"), ("DEBUG", "NOTSET")])
def test_logging_keeps_httpx_request_lines_for_debug(level: str, httpx_level: str) -> None:
    httpx_logger = logging.getLogger("httpx")
    saved = httpx_logger.level
    try:
        httpx_logger.setLevel(logging.NOTSET)
        setup_logging(level)
        assert logging.getLevelName(httpx_logger.level) == httpx_level
    finally:
        httpx_logger.setLevel(saved)


def test_metrics_are_get_or_create() -> None:
    a = counter("kvstack_test_things_total", "things", ["kind"])
    assert counter("kvstack_test_things_total", "things", ["kind"]) is a
    with pytest.raises(ValueError, match="already exists as Counter"):
        gauge("kvstack_test_things_total", "things")
    a.labels("x").inc()
    assert "kvstack_test_things_total" in registered_metric_names()
