"""PeerLocator: where chunks are, for the ``peer://`` tier (the tier's seam to the cluster).

A locator answers, for each chunk key, the peer-server addresses (``host:port``) of the engines
holding it, leaving out the asking engine. ``peer://?index=URL`` asks the cluster index through
:class:`kvstack.cluster.locator.IndexLocator`, found by name in :data:`LOCATORS` and imported only
when such a tier is built: the KV layer imports nothing of the index or the cluster, and an
install without the ``server`` extra fails there with one line naming it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from kvstack.errors import MissingExtraError
from kvstack.kv.keys import ChunkKey
from kvstack.registry import Registry

if TYPE_CHECKING:
    from kvstack.security import ClusterKeys

__all__ = ["LOCATORS", "PeerLocator", "default_instance_id", "make_locator"]


class PeerLocator(Protocol):
    def locate(self, keys: Sequence[ChunkKey], exclude: str) -> list[list[str]]:
        """Per key, the addresses of the peers holding it (not ``exclude``, the asking engine's
        instance id). May raise on failure (the tier counts it and treats it as a miss)."""
        ...

    def close(self) -> None: ...


class LocatorFactory(Protocol):
    def __call__(self, url: str, timeout_s: float, keys: ClusterKeys | None) -> PeerLocator: ...


LOCATORS: Registry[LocatorFactory] = Registry("peer locator")
LOCATORS.register("index", "kvstack.cluster.locator:IndexLocator")


def make_locator(
    kind: str, url: str, timeout_s: float, keys: ClusterKeys | None = None
) -> PeerLocator:
    """The locator registered as ``kind``, asking ``url`` (authenticated with ``keys``)."""
    try:
        factory = LOCATORS.get(kind)
    except ImportError as exc:
        if exc.name is None or exc.name.startswith("kvstack"):
            raise
        raise MissingExtraError(
            f"peer://?{kind}=... needs {exc.name!r}; install it with: pip install 'kvstack[server]'"
        ) from exc
    return factory(url, timeout_s, keys)


def default_instance_id() -> str:
    """This process's id in the cluster when none is configured: ``hostname:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"
