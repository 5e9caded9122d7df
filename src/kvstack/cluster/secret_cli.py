"""``kvstack security``: create and identify cluster secrets.

    kvstack security init-secret PATH [--bytes 32]   a new random secret, mode 0600 from creation
    kvstack security fingerprint PATH                its non-secret fingerprint (safe to log)
    kvstack security index-token PATH                the index's bearer token, for a scraper of
                                                     its /metrics (a credential: store it as one)

``init-secret`` and ``fingerprint`` print ``PATH  fingerprint F``, or with ``--json`` one JSON
document ``{"path": ..., "fingerprint": ...}``; ``index-token`` prints the bare token. The
secret itself is never printed. Point ``security.cluster_secret_file`` (or
``KVSTACK_SECURITY_CLUSTER_SECRET_FILE``) of every component at the file; to rotate, see
``docs/security.md``.
"""

from __future__ import annotations

import argparse
import sys

from kvstack.errors import ConfigError
from kvstack.output import add_json_flag, print_json
from kvstack.security import MIN_SECRET_BYTES, SecurityConfig, load_keys, write_secret_file

__all__ = ["run"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstack security", description="Cluster secrets.")
    verbs = p.add_subparsers(dest="verb", required=True)
    init = verbs.add_parser("init-secret", help="create a new random cluster secret file (0600)")
    init.add_argument("path", help="file to create (must not exist)")
    init.add_argument(
        "--bytes", type=int, default=MIN_SECRET_BYTES, help="random bytes (hex-encoded)"
    )
    show = verbs.add_parser("fingerprint", help="print a secret's non-secret fingerprint")
    show.add_argument("path", help="a cluster secret file")
    token = verbs.add_parser("index-token", help="print the index's bearer token (a credential)")
    token.add_argument("path", help="a cluster secret file")
    for verb in (init, show):
        add_json_flag(verb)
    return p


def run(command: str, argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.verb == "init-secret":
            if args.bytes < MIN_SECRET_BYTES:
                raise ConfigError(f"--bytes must be >= {MIN_SECRET_BYTES}, got {args.bytes}")
            path = write_secret_file(args.path, args.bytes)
        else:
            path = args.path
        keys = load_keys(SecurityConfig(cluster_secret_file=str(path)))
    except FileExistsError:
        print(f"kvstack {command}: {args.path} exists; not overwritten", file=sys.stderr)
        return 1
    except (ConfigError, OSError) as exc:
        print(f"kvstack {command}: {exc}", file=sys.stderr)
        return 1
    assert keys is not None
    if args.verb == "index-token":
        from kvstack.index.auth import bearer_header

        print(bearer_header(keys).removeprefix("Bearer "))
        return 0
    if args.json:
        return print_json({"path": str(path), "fingerprint": keys.fingerprint})
    print(f"{path}  fingerprint {keys.fingerprint}")
    return 0
