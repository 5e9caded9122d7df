"""``kvstack sim-engine`` as a process: a fleet on consecutive ports, clean shutdown, bad flags."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import httpx

from kvstack.stack.procs import wait_http_ok


def consecutive_free_ports(num: int) -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + num >= 65535:
            continue
        try:
            socks = []
            for port in range(base, base + num):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError("no free port range")


def kvstack(*args: str) -> list[str]:
    return [sys.executable, "-m", "kvstack", *args]


def test_fleet_process_serves_every_port_and_stops_on_sigterm() -> None:
    base = consecutive_free_ports(3)
    proc = subprocess.Popen(
        kvstack("sim-engine", "--fleet", "3", "--base-port", str(base), "--time-scale", "20",
                "--model", "m"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        for port in range(base, base + 3):
            wait_http_ok(f"http://127.0.0.1:{port}/health", 20, proc)
            r = httpx.post(f"http://127.0.0.1:{port}/v1/completions",
                           json={"model": "m", "prompt": "t20 t21", "max_tokens": 2})  # fmt: skip
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_bad_values_are_named() -> None:
    out = subprocess.run(kvstack("sim-engine", "--num-blocks", "0"), capture_output=True, text=True)
    assert out.returncode == 2
    assert "sim.num_blocks" in out.stderr and "greater than 0" in out.stderr
    out = subprocess.run(
        kvstack("sim-engine", "--num-blocks", "10", "--max-model-len", "1000"),
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 2 and "max_model_len (1000)" in out.stderr


def test_help_lists_engine_flags() -> None:
    out = subprocess.run(kvstack("sim-engine", "--help"), capture_output=True, text=True)
    assert out.returncode == 0 and "--kv-events-endpoint" in out.stdout
    assert "--prefill-tokens-per-s" in out.stdout


def test_vllm_spelled_flags(tmp_path: object) -> None:
    import json

    import msgspec
    import zmq

    from kvstack.stack.ports import free_port

    port, events = free_port(), free_port()
    config = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"tcp://*:{events}", "topic": "kv"}  # fmt: skip
    proc = subprocess.Popen(
        kvstack("sim-engine", "--port", str(port), "--served-model-name", "m2",
                "--kv-events-config", json.dumps(config), "--time-scale", "20"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    sub = zmq.Context.instance().socket(zmq.SUB)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http_ok(url + "/health", 20, proc)
        assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == "m2"
        sub.connect(f"tcp://127.0.0.1:{events}")
        sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        # A subscription takes a moment to reach the publisher; retry with new prompts.
        for attempt in range(10):
            prompt = list(range(1000 * attempt + 100, 1000 * attempt + 140))
            httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1})
            if sub.poll(1000):
                break
        topic, _, payload = sub.recv_multipart()
        assert topic == b"kv"
        assert msgspec.msgpack.decode(payload)[1][0]["type"] == "BlockStored"
    finally:
        sub.close(0)
        proc.terminate()
        proc.wait(10)


def test_the_api_key_comes_from_vllm_api_key_and_is_never_logged() -> None:
    import os

    from kvstack.stack.ports import free_port

    port = free_port()
    env = {**os.environ, "VLLM_API_KEY": "env-key-3f9a"}
    proc = subprocess.Popen(
        kvstack("sim-engine", "--port", str(port), "--time-scale", "20"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http_ok(url + "/health", 20, proc)
        assert httpx.get(url + "/v1/models").status_code == 401
        auth = {"authorization": "Bearer env-key-3f9a"}
        assert httpx.get(url + "/v1/models", headers=auth).status_code == 200
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=10)
    assert "env-key-3f9a" not in output and '"api_key": "**********"' in output
