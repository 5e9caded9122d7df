"""The secrets ``kvstack up`` hands its components: the cluster secret and a Redis password.

- **Cluster secret**: ``security.cluster_secret_file`` when the config names one, else
  ``<run_dir>/cluster-secret``, created with mode 0600 on the first ``kvstack up`` and reused
  by later ones (so chunks on a shared disk tier stay readable across restarts). Every
  component gets it as ``KVSTACK_SECURITY_CLUSTER_SECRET_FILE`` (and
  ``KVSTACK_SECURITY_PREVIOUS_SECRET_FILE`` during a rotation): the index and peer servers
  authenticate their callers with it, engines seal and check their chunks, the router signs its
  lookups.
- **Redis**: a fresh random password per start, for an ACL user ``kvstack`` (the ``default``
  user is switched off), written with the rest of redis-server's settings to
  ``<run_dir>/redis.conf`` (mode 0600): it never appears on a command line. Engines receive it
  in ``KVSTACK_STACK_REDIS_PASSWORD``; ``{redis_url}`` expands to
  ``redis://kvstack@host:port/0?password_env=KVSTACK_STACK_REDIS_PASSWORD``, so tier URLs name
  the variable, not the password.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from kvstack.security import SecurityConfig, load_keys, write_secret_file

__all__ = ["REDIS_PASSWORD_ENV", "REDIS_USER", "StackSecrets", "prepare_secrets", "redis_conf"]

REDIS_USER = "kvstack"
REDIS_PASSWORD_ENV = "KVSTACK_STACK_REDIS_PASSWORD"
SECRET_NAME = "cluster-secret"


@dataclass(frozen=True)
class StackSecrets:
    cluster_secret_file: Path
    previous_secret_file: Path | None = None
    redis_password: str = field(default="", repr=False)

    def component_env(self) -> dict[str, str]:
        """What every component's environment gets."""
        env = {"KVSTACK_SECURITY_CLUSTER_SECRET_FILE": str(self.cluster_secret_file)}
        if self.previous_secret_file is not None:
            env["KVSTACK_SECURITY_PREVIOUS_SECRET_FILE"] = str(self.previous_secret_file)
        return env


def prepare_secrets(run_dir: Path, security: SecurityConfig) -> StackSecrets:
    """The configured cluster secret (checked), or the run directory's own (created 0600)."""
    if security.cluster_secret_file is not None:
        load_keys(security)  # a missing or short file fails before anything starts
        previous = security.previous_secret_file
        return StackSecrets(
            Path(security.cluster_secret_file).resolve(),
            None if previous is None else Path(previous).resolve(),
            secrets.token_urlsafe(24),
        )
    path = (run_dir / SECRET_NAME).resolve()
    if not path.exists():
        write_secret_file(path)
    load_keys(SecurityConfig(cluster_secret_file=str(path)))  # readable, long enough
    return StackSecrets(path, None, secrets.token_urlsafe(24))


def redis_conf(run_dir: Path, host: str, port: int, password: str) -> Path:
    """redis-server's config file (mode 0600 from creation): port, no persistence, and the
    ``kvstack`` ACL user as the only one."""
    path = run_dir / "redis.conf"
    lines = [
        f"port {port}",
        f"bind {host}",
        'save ""',
        "appendonly no",
        f'dir "{run_dir.resolve()}"',
        "user default off",
        f"user {REDIS_USER} on >{password} ~* &* +@all",
    ]
    path.unlink(missing_ok=True)  # a new password each start; never chmod'ed after creation
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("\n".join(lines) + "\n")
    return path
