"""Fixtures of the LoRA control-plane tests: config, keys, a control plane on a temp dir."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvstack.lora.adapters import AdapterVersion
from kvstack.lora.audit import AuditLog
from kvstack.lora.config import AdapterEngineSpec, LoRAConfig, TenantPolicy
from kvstack.lora.manager import AdapterCacheManager
from kvstack.lora.plane import ControlPlane
from kvstack.lora.registry import AdapterRegistry
from kvstack.lora.resolver import Resolver
from kvstack.lora.signing import TrustedKeys, generate_keypair
from kvstack.lora.store.dir import DirStore
from kvstack.lora.verify import Verifier
from kvstack.sim.config import SimConfig
from kvstack.sim.server import FleetThread, fleet_specs
from kvstack.stack.ports import free_port
from tests.lora.adapters import TINY_DIMS, synthetic_adapter
from tests.lora.fakes import FakeDriver, ManualClock


@pytest.fixture(scope="session")
def keypair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("keys")
    generate_keypair(root / "signer.pem", root / "signer.pub.pem")
    return root / "signer.pem", root / "signer.pub.pem"


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    path = tmp_path / "sources"
    path.mkdir()
    return path


@pytest.fixture
def lora_config(tmp_path: Path, sources: Path, keypair: tuple[Path, Path]) -> LoRAConfig:
    return LoRAConfig(
        registry_url=f"sqlite:///{tmp_path / 'registry.db'}",
        artifact_store=f"file://{tmp_path / 'store'}",
        source_allowlist=[sources.as_uri() + "/"],
        trusted_keys=[str(keypair[1])],
    )


@pytest.fixture
def plane(lora_config: LoRAConfig) -> Iterator[ControlPlane]:
    verifier = Verifier(lora_config, {"toy": TINY_DIMS}, TrustedKeys.load(lora_config.trusted_keys))
    yield ControlPlane(
        lora_config,
        AdapterRegistry(lora_config.registry_url),
        DirStore(Path(lora_config.artifact_store[len("file://") :])),
        verifier,
        AuditLog(lora_config.registry_url),
    )


@pytest.fixture(scope="session")
def toy_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kvstack.models.toy import build_toy_model

    return build_toy_model(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def peft_dir(toy_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.lora.adapters import peft_adapter

    return peft_adapter(toy_model, tmp_path_factory.mktemp("peft") / "a1", seed=1)


def _pg_bin(name: str) -> str | None:
    import glob
    import shutil

    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A throwaway PostgreSQL server on a free port (skipped when the binaries are missing)."""
    import os
    import pwd
    import shutil
    import subprocess
    import tempfile

    from kvstack.stack.ports import free_port

    initdb, postgres = _pg_bin("initdb"), _pg_bin("postgres")
    if initdb is None or postgres is None:
        pytest.skip("PostgreSQL binaries (initdb, postgres) are not installed")
    # Not under pytest's tmp dir: it is private to its owner, and as root the server has to
    # run as the 'postgres' user (postgres refuses to run as root).
    root = Path(tempfile.mkdtemp(prefix="kvstack-pg-"))
    run_as: list[str] = []
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(root)
            pytest.skip("running as root and there is no 'postgres' user")
        os.chown(root, user.pw_uid, user.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    data = root / "data"
    subprocess.run(
        [*run_as, initdb, "-D", str(data), "-A", "trust", "-U", "postgres"],
        check=True,
        capture_output=True,
    )
    port = free_port()
    log = open(root / "postgres.log", "wb")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen(
        [
            *run_as,
            postgres,
            "-D",
            str(data),
            "-p",
            str(port),
            "-k",
            str(root),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    try:
        _wait_pg(port, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def _wait_pg(port: int, proc: object) -> None:
    import socket
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:  # type: ignore[attr-defined]
            raise RuntimeError("postgres exited during start")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                time.sleep(0.3)  # accepting; give it a moment to finish recovery
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("postgres did not start in 30 s")


@dataclass
class Setup:
    """A control plane with registered, signed adapters and a manager over fake engines."""

    plane: ControlPlane
    manager: AdapterCacheManager
    driver: FakeDriver
    clock: ManualClock
    sources: Path

    def add(
        self,
        adapter_id: str,
        version: str = "1",
        tier: str = "gold",
        tenant: str = "acme",
        seed: int = 0,
        activate: bool = True,
    ) -> AdapterVersion:
        src = synthetic_adapter(self.sources / f"{adapter_id}-{version}", seed=seed)
        self.plane.register(
            str(src),
            adapter_id,
            version,
            "toy",
            tenant,
            tier,
            actor="test",
            activate_first=activate,
        )
        key = Path(self.plane.config.trusted_keys[0]).with_name("signer.pem")
        adapter = self.plane.sign(adapter_id, version, key, actor="test")
        self.manager.resolver.refresh()
        return adapter


ENGINE_URLS = ("http://engine-a", "http://engine-b")


@pytest.fixture
def make_setup(plane: ControlPlane, sources: Path, tmp_path: Path) -> Callable[..., Setup]:
    def make(
        gpu_slots: int = 2, host_slots: int = 4, num_engines: int = 1, **policy: object
    ) -> Setup:
        config = plane.config.model_copy(deep=True)
        config.adapter_cache_policy = config.adapter_cache_policy.model_copy(
            update={
                "gpu_slots_per_base_model": gpu_slots,
                "host_slots_per_base_model": host_slots,
                **policy,
            }
        )
        config.tenants = {"acme": TenantPolicy(allow_base_fallback=True)}
        config.slot_wait_s = 0.2
        config.engines = [
            AdapterEngineSpec(
                url=url,
                base_model="toy",
                served_model_name="toy-base",
                warm_dir=str(tmp_path / f"warm-{i}"),
            )
            for i, url in enumerate(ENGINE_URLS[:num_engines])
        ]
        clock, driver = ManualClock(), FakeDriver()
        resolver = Resolver(plane.registry, config)
        manager = AdapterCacheManager(
            config, resolver, plane.store, plane.verifier, plane.audit, driver, clock
        )
        return Setup(plane, manager, driver, clock, sources)

    return make


@pytest.fixture(scope="module")
def fleet() -> Iterator[FleetThread]:
    """Two simulated engines with LoRA slots (2 hot, 4 host), serving ``toy-base``."""
    config = SimConfig(
        model="toy-base",
        enable_lora=True,
        max_loras=2,
        max_cpu_loras=4,
        lora_load_s=0.02,
        num_blocks=1024,
        max_model_len=4096,
    )
    base = free_port()
    specs = fleet_specs(config, 1, base, "127.0.0.1")
    specs += fleet_specs(config, 1, free_port(), "127.0.0.1")
    with FleetThread(specs) as f:
        yield f
