"""Config validation, the CLI's flags, request parsing, model routes and API key files."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kvstack.errors import ConfigError, NoBackendError, RequestError, UnknownModelError
from kvstack.router.cli import parse_args
from kvstack.router.config import AuthConfig, ModelRoute, RouterConfig
from kvstack.router.fleet.backends import Backend, BackendState
from kvstack.router.http.auth import ApiKeys, parse_keys_file
from kvstack.router.http.parse import parse_request
from kvstack.router.scheduling.model_routes import ModelRouter


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"backends": [{"url": "ftp://x"}]}, "must look like http://host:port"),
        ({"backends": [{"url": "http://x:1/v1"}]}, "must not carry a path"),
        ({"policy": "fastest"}, "policy 'fastest' is unknown; choose one of"),
        ({"port": 70000}, "less than or equal to 65535"),
        ({"retry": {"on_status": [404]}}, "5xx codes only"),
        ({"ejection": {"base_lease_s": 5, "max_lease_s": 1}}, "must be >= base_lease_s"),
        ({"limits": {"max_request_bytes": "lots"}}, "is not a size"),
        ({"models": [{"name": "a", "targets": [{"model": "x", "weight": 0}]}]}, "greater than 0"),
        ({"models": [{"name": "a", "targets": []}]}, "at least 1 item"),
        (
            {"models": [{"name": "a", "targets": [{"model": "x"}]}], "model_aliases": {"a": "y"}},
            "both as route and alias",
        ),
        ({"unknown_key": 1}, "Extra inputs are not permitted"),
    ],
)
def test_config_errors_name_the_value(data: dict, message: str) -> None:
    from kvstack.section import load_section

    with pytest.raises(ConfigError, match=message):
        load_section("router", RouterConfig, data, env={})


def test_cli_flags_file_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "router.yaml"
    path.write_text("router:\n  port: 9000\n  policy: session\n  backends: [{url: 'http://f:1'}]\n")
    monkeypatch.setenv("KVSTACK_ROUTER_HEALTH__INTERVAL_S", "7")
    config, _ = parse_args(
        ["--config", str(path), "--backend", "http://a:1", "--backend", "http://b:2",
         "--model-alias", "gpt=toy", "--max-attempts", "2"]
    )  # fmt: skip
    assert config.port == 9000 and config.policy == "session"
    assert [b.url for b in config.backends] == ["http://a:1", "http://b:2"]
    assert config.model_aliases == {"gpt": "toy"} and config.retry.max_attempts == 2
    assert config.health.interval_s == 7
    with pytest.raises(ConfigError, match="ALIAS=MODEL"):
        parse_args(["--model-alias", "gpt"])
    k8s, _ = parse_args(
        ["--discovery", "kubernetes", "--k8s-selector", "app=x", "--k8s-port", "81"]
    )
    assert k8s.discovery.kind == "kubernetes" and k8s.discovery.kubernetes.port == 81


def test_cli_refuses_to_start_without_backends(capsys: pytest.CaptureFixture[str]) -> None:
    from kvstack.router.cli import run

    assert run("router", []) == 2
    assert "no backends" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # argparse reports bad choices itself
        run("router", ["--policy", "nope"])
    assert exit_info.value.code == 2
    assert run("router", ["--backend", "ftp://x"]) == 2
    assert "must look like http://host:port" in capsys.readouterr().err


def test_request_parsing() -> None:
    headers = {"x-session-id": "s", "x-kvstack-priority": "critical"}
    r = parse_request("completions", b'{"model":"m","prompt":[1,2,3],"max_tokens":4}', headers)
    assert r.token_ids == [1, 2, 3] and r.estimated_prompt_tokens == 3
    assert (r.session_id, r.priority, r.max_tokens) == ("s", "critical", 4)
    content = b'[{"type":"text","text":"ab"},{"type":"image_url","image_url":{"url":"x"}}]'
    chat = b'{"model":"m","messages":[{"role":"user","content":' + content + b'}],"user":"u"}'
    r = parse_request("chat", chat, {})
    assert r.text == "ab" and r.session_id == "u" and r.user == "u"
    with pytest.raises(RequestError, match="max_tokens"):
        parse_request("completions", b'{"model":"m","prompt":"x","max_tokens":-1}', {})
    with pytest.raises(RequestError, match="prompt"):
        parse_request("completions", b'{"model":"m","prompt":[true]}', {})


def _states(**models: list[str]) -> list[BackendState]:
    return [
        BackendState(Backend(n, f"http://{n}:1", static_models=frozenset(m)))
        for n, m in models.items()
    ]


def test_model_routes_resolve_and_list() -> None:
    routes = [
        ModelRoute.model_validate(
            {"name": "s", "targets": [{"model": "v1", "weight": 3}, {"model": "v2"}]}
        )
    ]
    router = ModelRouter(routes, {"alias": "s", "b": "base"}, random.Random(0))
    states = _states(a=["v1", "v2", "base"])
    picks = [router.resolve("s", states).target for _ in range(400)]
    assert 0.68 < picks.count("v1") / 400 < 0.82
    assert router.resolve("alias", states).route == "s"
    assert router.resolve("b", states) == ("base", None)
    assert len({router.resolve("s", states, session_key="u1").target for _ in range(20)}) == 1
    # A target no backend serves is skipped while another target is served.
    assert {router.resolve("s", _states(a=["v2"])).target for _ in range(20)} == {"v2"}
    with pytest.raises(UnknownModelError) as err:
        router.resolve("zzz", states)
    assert err.value.known == ["alias", "b", "base", "s", "v1", "v2"] and err.value.status == 404
    with pytest.raises(NoBackendError, match="reported its models"):
        router.resolve("zzz", _states(a=[]))
    assert [e["id"] for e in router.listed()] == ["s", "alias", "b"]


def test_api_key_file_format(tmp_path: Path) -> None:
    keys = parse_keys_file("k1 t1\n\n# comment\nk2   # no tenant\n")
    assert sorted(keys.values()) == ["default", "t1"]
    with pytest.raises(ConfigError, match=":1: expected 'KEY \\[TENANT\\]'"):
        parse_keys_file("a b c\n", "keys")
    with pytest.raises(ConfigError, match="cannot load API keys"):
        ApiKeys(AuthConfig(api_keys_file=str(tmp_path / "missing")))
    off = ApiKeys(AuthConfig())
    assert not off.enabled and off.tenant({}) is None
