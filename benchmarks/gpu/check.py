"""The GPU check of kvstack's connector data path: one run, one JSON result, one table.

    python benchmarks/gpu/check.py --device cuda        # the full check, under 3 minutes
    python benchmarks/gpu/check.py --device cpu         # small shapes, the same code (CI)

Needs PyTorch and kvstack's core and ``kv`` dependencies, not vLLM (see benchmarks/gpu/README.md
for a machine without network). Writes ``benchmarks/results/gpu/check-<device>-<time>.json``
(or ``--json FILE``) and prints the table; exits 1 if any round trip changed a byte, 3 if a
dependency is missing. What it measures: ``kvstack.bench.micro.gpu_check``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# import name -> the distribution that provides it (the wheels to carry to an offline machine)
NEEDED = {
    "torch": "torch",
    "pydantic": "pydantic",
    "yaml": "pyyaml",
    "prometheus_client": "prometheus-client",
    "xxhash": "xxhash",
    "numpy": "numpy",
    "zstandard": "zstandard",
    "lz4": "lz4",
    "cryptography": "cryptography",
}


def missing_dependencies() -> list[str]:
    return [dist for module, dist in NEEDED.items() if importlib.util.find_spec(module) is None]


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    missing = missing_dependencies()
    if args.list_missing:  # for scripts/gpu-check.sh: what to install from carried wheels
        print(" ".join(missing))
        return 0
    if missing:
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        print(
            f"gpu check: missing {', '.join(missing)} for Python {version} "
            f"({sys.executable}). Download wheels for it with: pip download --only-binary=:all: "
            f"--python-version {version} --platform manylinux2014_x86_64 -d .device-wheels "
            f"{' '.join(missing)}",
            file=sys.stderr,
        )
        return 3
    if importlib.util.find_spec("kvstack") is None:
        sys.path.insert(0, str(ROOT / "src"))
    return _run(args, argv)


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    import torch

    from kvstack.bench.micro.gpu_check import plan_for, run_check
    from kvstack.bench.micro.gpu_report import failures, format_table, targets

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"gpu check: --device {args.device}, but torch sees no CUDA device", file=sys.stderr)
        return 3
    plan = plan_for(args.device, small=args.small or args.device == "cpu")
    started = time.time()
    result: dict[str, Any] = {"meta": _meta(args, argv, torch)}
    result.update(run_check(plan, Path(args.dir) if args.dir else None, _step))
    result["meta"]["elapsed_s"] = time.time() - started
    result["targets"] = targets(result)
    result["byte_mismatches"] = failures(result)
    result["byte_identical"] = not result["byte_mismatches"]
    out = Path(args.json) if args.json else _default_path(args.device, started)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(format_table(result))
    print(f"result: {out}")
    return 0 if result["byte_identical"] else 1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks/gpu/check.py", description=__doc__)
    p.add_argument("--device", default="cuda", help="torch device: cuda (default), cuda:1, cpu")
    p.add_argument("--small", action="store_true", help="small shapes (always on for cpu)")
    p.add_argument("--json", metavar="FILE", help="where to write the result")
    p.add_argument("--dir", help="directory for the file tier (default: the system temp dir)")
    p.add_argument("--commit", help="the git commit measured (default: git rev-parse HEAD)")
    p.add_argument("--list-missing", action="store_true", help="print missing distributions")
    return p


_START = time.monotonic()


def _step(text: str) -> None:
    print(f"[gpu check {time.monotonic() - _START:6.1f} s] {text}", file=sys.stderr, flush=True)


def _meta(args: argparse.Namespace, argv: list[str], torch: Any) -> dict[str, Any]:
    cuda = args.device.startswith("cuda")
    return {
        "command": " ".join(["python", "benchmarks/gpu/check.py", *_portable(argv)]),
        # settings read from the environment that change what is measured
        "env": {k: os.environ[k] for k in ("KVSTACK_PAGED_KERNELS",) if k in os.environ},
        "git_commit": args.commit or os.environ.get("KVSTACK_COMMIT") or _git_commit(),
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": args.device,
        "device_name": torch.cuda.get_device_name(args.device)
        if cuda
        else platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
    }


def _portable(argv: list[str]) -> list[str]:
    """The arguments without the machine's folders: the result file by name, the scratch
    folder as ``<dir>``."""
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg == "--json":
            out[i + 1] = Path(out[i + 1]).name
        elif arg == "--dir":
            out[i + 1] = "<dir>"
    return out


def _git_commit() -> str:
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
    except OSError:
        return "unknown"
    return proc.stdout.strip() if proc.returncode == 0 else "unknown"


def _default_path(device: str, started: float) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
    kind = device.split(":")[0]
    return ROOT / "benchmarks" / "results" / "gpu" / f"check-{kind}-{stamp}.json"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
