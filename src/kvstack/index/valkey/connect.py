"""redis-py connections for the index (standalone, Sentinel, Cluster; blocking or async), one
pipeline per round trip, and the drivers that run a flow (:mod:`.reads`, :mod:`.writes`) on
them. Every redis-py failure becomes :class:`~kvstack.errors.IndexServiceError` (a timeout:
:class:`~kvstack.errors.IndexTimeoutError`) with the password kept out of the message.

Replies are parsed by hiredis (the ``redis`` extra installs it): with redis-py's pure-Python
parser, decoding the 512 entries of a 128K-token lookup took 2.6 ms of CPU on the 2-core
reference machine, with hiredis 0.3 ms.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from kvstack.errors import IndexServiceError, IndexTimeoutError
from kvstack.index.valkey.reads import Ahead, Command, Flow
from kvstack.index.valkey.url import ValkeyIndexOptions

try:  # the ``redis`` extra installs hiredis; without it, redis-py packs
    import hiredis
except ImportError:  # pragma: no cover - the extra installs it
    hiredis = None  # type: ignore[assignment]

__all__ = [
    "connect",
    "connect_async",
    "drive",
    "drive_ahead",
    "drive_ahead_async",
    "drive_async",
    "index_error",
]

T = TypeVar("T")
FAILURES = (RedisError, RedisClusterException, OSError)


def _common(options: ValkeyIndexOptions, asynchronous: bool) -> dict[str, Any]:
    retry_class: Any = AsyncRetry if asynchronous else Retry
    kwargs: dict[str, Any] = {
        "username": options.username,
        "password": options.password,
        "socket_timeout": options.timeout_s,
        "socket_connect_timeout": options.connect_timeout_s,
        "retry": retry_class(NoBackoff(), 1),
    }
    if options.tls:
        kwargs["ssl"] = True
        kwargs.update(options.ssl)
    return kwargs


# redis-py's cluster and sentinel modules are unannotated before 8.x and annotated since: called
# through Any, the same code type-checks against either.
_SYNC_CLUSTER: Any = redis.cluster
_SYNC_SENTINEL: Any = redis.sentinel
_ASYNC_SENTINEL: Any = redis.asyncio.sentinel


def connect(options: ValkeyIndexOptions) -> Any:
    """A blocking redis-py client for ``options`` (a cluster client connects at once)."""
    kwargs = _common(options, asynchronous=False)
    if options.cluster:
        nodes = [_SYNC_CLUSTER.ClusterNode(h, p) for h, p in options.seeds]
        return _SYNC_CLUSTER.RedisCluster(startup_nodes=nodes, **kwargs)
    if options.sentinel:
        sentinel = _SYNC_SENTINEL.Sentinel(
            options.seeds, sentinel_kwargs=_sentinel_kwargs(options, kwargs), **kwargs
        )
        return sentinel.master_for(options.sentinel, db=options.db)
    host, port = options.seeds[0]
    return redis.Redis(host=host, port=port, db=options.db, **kwargs)


def connect_async(options: ValkeyIndexOptions) -> Any:
    """An async redis-py client for ``options``; connects on first use."""
    kwargs = _common(options, asynchronous=True)
    if options.cluster:
        nodes = [redis.asyncio.cluster.ClusterNode(h, p) for h, p in options.seeds]
        return redis.asyncio.cluster.RedisCluster(startup_nodes=nodes, **kwargs)
    if options.sentinel:
        sentinel = _ASYNC_SENTINEL.Sentinel(
            options.seeds, sentinel_kwargs=_sentinel_kwargs(options, kwargs), **kwargs
        )
        return sentinel.master_for(options.sentinel, db=options.db)
    host, port = options.seeds[0]
    return redis.asyncio.Redis(host=host, port=port, db=options.db, **kwargs)


def _sentinel_kwargs(options: ValkeyIndexOptions, kwargs: dict[str, Any]) -> dict[str, Any]:
    """How to reach the Sentinels themselves: same timeouts and TLS, their own password."""
    own = {k: v for k, v in kwargs.items() if k not in ("username", "password")}
    if options.sentinel_password:
        own["password"] = options.sentinel_password
    return own


def index_error(exc: BaseException, where: str) -> IndexServiceError:
    """The index error for a redis-py failure at ``where`` (a masked URL)."""
    kind = IndexTimeoutError if isinstance(exc, RedisTimeoutError | TimeoutError) else None
    message = f"Valkey index at {where}: {type(exc).__name__}: {exc}"
    return (kind or IndexServiceError)(message)


def _routing(client: Any, command: Command) -> dict[str, Any]:
    """In a cluster, the node of the command's first key (an ``EVAL``'s first declared key).

    Without it redis-py asks a server which keys an ``EVAL`` touches (``COMMAND GETKEYS``: one
    more round trip per script in a pipeline, 16 per lookup with 16 buckets). A slot that moved
    is still followed: redis-py retries a ``MOVED`` reply at the node it names."""
    if not hasattr(client, "get_node_from_key"):
        return {}
    key = command[3] if command[0] == "EVAL" else command[1]
    return {"target_nodes": client.get_node_from_key(key)}


def run_sync(client: Any, commands: list[Command]) -> list[Any]:
    if len(commands) == 1:
        return [client.execute_command(*commands[0], **_routing(client, commands[0]))]
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command, **_routing(client, command))
    return list(pipe.execute())


async def run_async(client: Any, commands: list[Command]) -> list[Any]:
    if len(commands) == 1:
        return [await client.execute_command(*commands[0], **_routing(client, commands[0]))]
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command, **_routing(client, command))
    return list(await pipe.execute())


class _Trips:
    """Turns what a flow yields into round trips: an :class:`Ahead`'s commands wait for the
    next trip (``take`` gives None for it), a trip takes them first."""

    def __init__(self) -> None:
        self.ahead: list[Command] = []

    def take(self, item: list[Command] | Ahead) -> list[Command] | None:
        if isinstance(item, Ahead):
            self.ahead += item.commands
            return None
        commands, self.ahead = self.ahead + item, []
        return commands


def drive(flow: Flow[T], run: Callable[[list[Command]], list[Any]]) -> T:
    """Run ``flow`` to its answer, each round trip through ``run`` (an :class:`Ahead`'s
    commands go with the next trip)."""
    trips = _Trips()
    try:
        item = next(flow)
        while True:
            commands = trips.take(item)
            item = flow.send(run(commands) if commands else [])
    except StopIteration as done:
        result: T = done.value
        return result


async def drive_async(flow: Flow[T], run: Callable[[list[Command]], Awaitable[list[Any]]]) -> T:
    trips = _Trips()
    try:
        item = next(flow)
        while True:
            commands = trips.take(item)
            item = flow.send(await run(commands) if commands else [])
    except StopIteration as done:
        result: T = done.value
        return result


# -- sending ahead: one connection, commands written as the flow yields them ----------------
# redis-py's pipeline writes all its commands at once, so a flow's Ahead could only wait for
# the next trip. These drivers hold one pooled connection for the whole flow and write each
# Ahead to it at once; a round trip then reads every reply still owed, in order. Any failure
# disconnects the connection (replies may be left unread on it) before it goes back to the
# pool. A dropped connection or a timeout is retried once with a fresh flow, as redis-py's
# retry does for a pipeline; reads are idempotent. Standalone and Sentinel only: a cluster's
# commands go to several nodes (``drive`` with ``run_sync``/``run_async`` there).
RETRIED = (redis.ConnectionError, redis.TimeoutError)


def drive_ahead(make_flow: Callable[[], Flow[T]], client: Any) -> T:
    """Run the flow ``make_flow`` builds on one connection of ``client``'s pool, writing each
    :class:`Ahead` at once."""
    try:
        return _stream(make_flow(), client.connection_pool)
    except RETRIED:
        return _stream(make_flow(), client.connection_pool)


class _Wire:
    """What a send-ahead driver writes for each item a flow yields, and how many replies it
    then reads (None for an :class:`Ahead`: its replies are read with the next trip's)."""

    def __init__(self) -> None:
        self.owed = 0

    def take(self, item: list[Command] | Ahead) -> tuple[list[Command], int | None]:
        commands = item.commands if isinstance(item, Ahead) else item
        self.owed += len(commands)
        if isinstance(item, Ahead):
            return commands, None
        owed, self.owed = self.owed, 0
        return commands, owed


def _packed(conn: Any, commands: list[Command]) -> list[bytes]:
    """``commands`` in RESP, packed by hiredis in C when it is there.

    redis-py's own ``pack_commands`` checks and encodes every argument in Python before
    handing it to hiredis: for a 128K-token lookup (512 keys in 16 ``MGET``s and a script) it
    took 0.20 ms of the lookup's 1.7 ms of client CPU on the 2-core reference machine,
    hiredis alone 0.05 ms. A flow's commands hold only ``str``, ``bytes`` and ``int``
    arguments and single-word command names, which hiredis packs exactly as redis-py does
    (utf-8 for text); ``tests/index/test_valkey_send_ahead.py`` checks that they agree."""
    if hiredis is None:
        return conn.pack_commands(commands)
    return [b"".join([hiredis.pack_command(command) for command in commands])]


def _stream(flow: Flow[T], pool: Any) -> T:
    conn, wire = pool.get_connection(), _Wire()
    try:
        item = next(flow)
        while True:
            commands, read = wire.take(item)
            if commands:
                conn.send_packed_command(_packed(conn, commands))
            item = flow.send([conn.read_response() for _ in range(read or 0)])
    except StopIteration as done:
        result: T = done.value
        return result
    except BaseException:
        conn.disconnect()
        raise
    finally:
        flow.close()
        pool.release(conn)


async def drive_ahead_async(make_flow: Callable[[], Flow[T]], client: Any) -> T:
    try:
        return await _stream_async(make_flow(), client.connection_pool)
    except RETRIED:
        return await _stream_async(make_flow(), client.connection_pool)


async def _stream_async(flow: Flow[T], pool: Any) -> T:
    conn, wire = await pool.get_connection(), _Wire()
    try:
        item = next(flow)
        while True:
            commands, read = wire.take(item)
            if commands:
                await conn.send_packed_command(_packed(conn, commands))
            item = flow.send([await conn.read_response() for _ in range(read or 0)])
    except StopIteration as done:
        result: T = done.value
        return result
    except BaseException:
        await conn.disconnect()
        raise
    finally:
        flow.close()
        await pool.release(conn)
