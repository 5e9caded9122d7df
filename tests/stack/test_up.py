"""``kvstack up`` / ``down`` as a user runs them, with simulated engines."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from kvstack.index.auth import bearer_header
from kvstack.security import SecurityConfig, load_keys
from kvstack.stack.ports import free_port


def write_config(path: Path, run_dir: Path, router_port: int) -> Path:
    stack = {
        "run_dir": str(run_dir),
        "engines": [{"name": "sim", "kind": "sim", "replicas": 2}],
        "router": {"port": router_port},
        "index": {},
    }
    path.write_text(yaml.safe_dump({"stack": stack}))
    return path


def kvstack(
    *args: str,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    state: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``state``: the user's state directory (where ``up`` notes the stack for ``down``)."""
    extra = dict(env or {})
    if state is not None:
        extra["XDG_STATE_HOME"] = str(state)
    return subprocess.run(
        [sys.executable, "-m", "kvstack", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
        env={**os.environ, **extra} if extra else None,
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_up_serves_through_the_router_and_down_leaves_nothing(tmp_path: Path) -> None:
    port = free_port()
    cfg = write_config(tmp_path / "stack.yaml", tmp_path / "run", port)
    up = kvstack("up", "--config", str(cfg), "--detach", "--no-progress")
    assert up.returncode == 0, up.stderr
    state = yaml.safe_load((tmp_path / "run" / "stack.json").read_text())
    pids = [c["pid"] for c in state["components"]]
    assert len(pids) == 4 and all(alive(pid) for pid in pids)
    try:
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            json={"model": "toy", "prompt": "hello world", "max_tokens": 4},
            timeout=30,
        )
        assert r.status_code == 200 and r.json()["choices"][0]["text"]
        assert r.headers["x-kvstack-backend"]
        # The router asked the index over ZMQ (the stack wires zmq:// for its lookups).
        (index,) = [c for c in state["components"] if c["name"] == "index"]
        keys = load_keys(SecurityConfig(cluster_secret_file=str(tmp_path / "run/cluster-secret")))
        assert keys is not None  # kvstack up made the stack a cluster of its own
        auth = {"authorization": bearer_header(keys)}
        assert httpx.get(f"{index['url']}/metrics", timeout=10).status_code == 401
        text = httpx.get(f"{index['url']}/metrics", timeout=10, headers=auth).text
        assert 'kvstack_index_requests_total{route="lookup",status="200"} 1.0' in text
    finally:
        down = kvstack("down", "--run-dir", str(tmp_path / "run"))
    assert down.returncode == 0, down.stderr
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids)
    assert not (tmp_path / "run" / "stack.json").exists()


def test_a_taken_port_is_a_clear_error_and_nothing_starts(tmp_path: Path) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        cfg = write_config(tmp_path / "stack.yaml", tmp_path / "run", port)
        up = kvstack("up", "--config", str(cfg), "--detach", "--no-progress")
    assert up.returncode == 1
    assert f"port {port} of router is already in use" in up.stderr
    assert not (tmp_path / "run" / "stack.json").exists()


def test_up_down_up_back_to_back_and_down_without_flags(tmp_path: Path) -> None:
    """The router's port keeps connections in TIME_WAIT after ``down`` (the router closed the
    client's keep-alive connection); ``up`` binds it again at once, as the router itself does.
    ``down`` without flags, from another directory, stops the stack ``up`` started."""
    port, state, elsewhere = free_port(), tmp_path / "state", tmp_path / "elsewhere"
    elsewhere.mkdir()
    cfg = write_config(tmp_path / "stack.yaml", tmp_path / "run", port)
    body = {"model": "toy", "prompt": "hi", "max_tokens": 1}
    for json_flag in ([], ["--json"]):  # the second round as a script would run it
        up = kvstack(
            "up", "--config", str(cfg), "--detach", "--no-progress", *json_flag, state=state
        )
        assert up.returncode == 0, up.stderr
        with httpx.Client() as client:  # kept open across 'down': the server closes it
            assert client.post(f"http://127.0.0.1:{port}/v1/completions", json=body).is_success
            down = kvstack("down", *json_flag, cwd=elsewhere, state=state)
        assert down.returncode == 0, down.stderr
        if json_flag:
            started, stopped = json.loads(up.stdout), json.loads(down.stdout)
            urls = {c["name"]: c["url"] for c in started["components"]}
            assert urls["router"] == f"http://127.0.0.1:{port}"
            assert sorted(stopped["stopped"]) == sorted(urls)
            assert stopped["run_dir"] == started["run_dir"] == str((tmp_path / "run").resolve())
        else:
            assert re.search(rf"^ +router  http://127\.0\.0\.1:{port}$", up.stdout, re.M)
            assert "logs in " in up.stdout and "router" in down.stdout
    again = kvstack("down", cwd=elsewhere, state=state)
    assert again.returncode == 1
    assert "no running stack in" in again.stderr and "pass --run-dir DIR" in again.stderr


def test_an_unhealthy_component_stops_the_stack_and_shows_its_log(tmp_path: Path) -> None:
    stack = {
        "run_dir": str(tmp_path / "run"),
        "engines": [{"name": "bad", "kind": "sim", "args": ["--no-such-flag"]}],
        "router": None,
    }
    cfg = tmp_path / "stack.yaml"
    cfg.write_text(yaml.safe_dump({"stack": stack}))
    up = kvstack("up", "--config", str(cfg), "--detach", "--no-progress")
    assert up.returncode == 1
    assert "bad exited" in up.stderr and "no-such-flag" in up.stderr


def test_multi_tenant_lora_stack_serves_a_registered_adapter(
    tmp_path: Path, toy_model: Path
) -> None:
    """A stack with adapter slots: the adapter CLI works on the router's own config file, and a
    signed adapter registered there is loaded and served through the router by its name."""
    from tests.lora.adapters import peft_adapter

    keys = tmp_path / "keys"
    assert kvstack("adapters", "keygen", "--out", str(keys)).returncode == 0
    peft_adapter(toy_model, tmp_path / "adapters" / "support-v1", seed=1)
    port, run = free_port(), tmp_path / "run"
    stack = {
        "run_dir": str(run),
        "engines": [
            {
                "name": "sim",
                "kind": "sim",
                "replicas": 2,
                "served_model_name": "toy",
                "lora": {"max_loras": 2, "max_cpu_loras": 4, "base_model": "toy"},
            }
        ],
        "router": {"port": port},
        "lora": {
            "source_allowlist": [(tmp_path / "adapters").as_uri() + "/"],
            "trusted_keys": [str(keys / "signing-key.pub.pem")],
            "base_models": {"toy": {"path": str(toy_model)}},
            "reconcile_interval_s": 0.5,
            "request_classes": {"interactive": {"cold_start_budget_s": 30}, "background": {}},
        },
    }
    cfg = tmp_path / "stack.yaml"
    cfg.write_text(yaml.safe_dump({"stack": stack}))
    up = kvstack("up", "--config", str(cfg), "--detach", "--no-progress")
    assert up.returncode == 0, up.stderr
    env = {**os.environ, "KVSTACK_CONFIG": str(run / "router.yaml")}

    def adapters(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "kvstack", "adapters", *args]
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)

    try:
        source = str(tmp_path / "adapters" / "support-v1")
        reg = adapters("register", source, "--id", "support", "--version", "1",
                       "--base-model", "toy", "--tenant", "acme", "--tier", "gold")  # fmt: skip
        assert reg.returncode == 0, reg.stderr
        signed = adapters("sign", "support@1", "--key", str(keys / "signing-key.pem"))
        assert signed.returncode == 0, signed.stderr
        deadline, answer = time.monotonic() + 30, None
        while time.monotonic() < deadline:  # the router reads the registry every 0.5 s
            answer = httpx.post(
                f"http://127.0.0.1:{port}/v1/completions",
                json={"model": "support", "prompt": "hello", "max_tokens": 4},
                timeout=60,
            )
            if answer.status_code == 200:
                break
            time.sleep(0.2)
        assert answer is not None and answer.status_code == 200, answer and answer.text
        assert answer.json()["model"] == "support@1"
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
        assert "support" in {m["id"] for m in models["data"]}
    finally:
        down = kvstack("down", "--run-dir", str(run))
    assert down.returncode == 0, down.stderr
