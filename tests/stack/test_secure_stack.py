"""``kvstack up`` makes its components one cluster: a cluster secret (0600, reused across
starts) in every component's environment, and a Redis password kept off every command line,
with simulated engines sealing the chunks they share through that Redis."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import httpx
import pytest
import yaml

from kvstack.index.auth import bearer_header
from kvstack.kv.format import HEADER_BYTES, parse_header
from kvstack.kv.seal import ChunkSealer
from kvstack.security import SecurityConfig, load_keys
from kvstack.stack.components import plan_stack
from kvstack.stack.config import StackConfig
from kvstack.stack.ports import free_port
from kvstack.stack.secrets import REDIS_PASSWORD_ENV, prepare_secrets
from tests.stack.test_up import kvstack


def stack_config(run: Path, router_port: int) -> dict[str, object]:
    return {
        "run_dir": str(run),
        "engines": [{"name": "sim", "kind": "sim", "replicas": 2, "connector": {
            "tiers": ["cpu://?size=16MiB", "{redis_url}"], "chunk_size": 16}}],
        "router": {"port": router_port} if router_port else None,
        "index": {},
        "redis": {},
    }  # fmt: skip


def test_the_plan_keeps_the_redis_password_off_every_command_line(tmp_path: Path) -> None:
    config = StackConfig.model_validate(stack_config(tmp_path / "run", free_port()))
    secrets = prepare_secrets(tmp_path / "run", SecurityConfig())
    secret = tmp_path / "run" / "cluster-secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    parts = plan_stack(config, tmp_path / "run", secrets)
    password = secrets.redis_password
    assert len(password) >= 24 and password not in repr(secrets)
    redis = parts[0]
    conf = Path(redis.argv[1])
    assert redis.argv == ["redis-server", str(conf)] and stat.S_IMODE(conf.stat().st_mode) == 0o600
    assert f">{password}" in conf.read_text() and "user default off" in conf.read_text()
    for part in parts:
        assert password not in " ".join(part.argv), part.name
        assert part.env["KVSTACK_SECURITY_CLUSTER_SECRET_FILE"] == str(secret.resolve())
    engines = [p for p in parts if p.kind == "engine"]
    assert all(p.env[REDIS_PASSWORD_ENV] == password for p in engines)
    argv = engines[0].argv
    tiers = [argv[i + 1] for i, a in enumerate(argv) if a == "--kv-tiers"][1]
    assert (
        tiers.startswith("redis://kvstack@")
        and tiers.endswith(f"/0?password_env={REDIS_PASSWORD_ENV}")
        and password not in tiers
    )
    again = prepare_secrets(tmp_path / "run", SecurityConfig())  # the next `kvstack up`
    assert again.cluster_secret_file == secrets.cluster_secret_file
    assert again.redis_password != password


@pytest.mark.redis
def test_up_shares_sealed_chunks_through_a_password_protected_redis(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cfg = tmp_path / "stack.yaml"
    cfg.write_text(yaml.safe_dump({"stack": stack_config(run, 0)}))  # engines, index, redis
    up = kvstack("up", "--config", str(cfg), "--detach", "--no-progress")
    assert up.returncode == 0, up.stderr
    try:
        state = yaml.safe_load((run / "stack.json").read_text())
        urls = {c["name"]: c["url"] for c in state["components"]}
        password = _password(run / "redis.conf")
        for c in state["components"]:  # no component's command line shows it
            assert password.encode() not in Path(f"/proc/{c['pid']}/cmdline").read_bytes()
        redis_port = int(urls["redis"].rsplit(":", 1)[1])
        assert _raw(redis_port, b"PING\r\n").startswith(b"-NOAUTH")  # no password, no answer
        prompt = " ".join(f"w{i}" for i in range(80))
        r = httpx.post(f"{urls['sim-0']}/v1/completions", timeout=30,
                       json={"model": "toy", "prompt": prompt, "max_tokens": 2})  # fmt: skip
        assert r.status_code == 200, r.text
        keys = load_keys(SecurityConfig(cluster_secret_file=str(run / "cluster-secret")))
        assert keys is not None
        values = _redis_values(redis_port, password)
        assert values, "the engines stored nothing in redis"
        sealer = ChunkSealer(keys)
        for value in values:
            header = parse_header(value[:HEADER_BYTES])
            assert header.seal is not None  # every chunk carries the cluster's MAC
            sealer.check(header, value[HEADER_BYTES:])
        assert httpx.get(f"{urls['index']}/instances", timeout=5).status_code == 401
        auth = {"authorization": bearer_header(keys)}
        assert httpx.get(f"{urls['index']}/instances", timeout=5, headers=auth).status_code == 200
    finally:
        down = kvstack("down", "--run-dir", str(run))
        assert down.returncode == 0, down.stderr


def _password(conf: Path) -> str:
    line = next(t for t in conf.read_text().splitlines() if t.startswith("user kvstack"))
    return next(part[1:] for part in line.split() if part.startswith(">"))


def _raw(port: int, command: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(command)
        return s.recv(64)


def _redis_values(port: int, password: str) -> list[bytes]:
    import time

    import redis

    client = redis.Redis(port=port, username="kvstack", password=password)
    deadline = time.monotonic() + 10
    names = []
    while not names and time.monotonic() < deadline:  # the sims store in the background
        names = client.keys("kvstack:*")
        time.sleep(0.1)
    values = [client.get(n) for n in names]
    client.close()
    return [v for v in values if v is not None]
