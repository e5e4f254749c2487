"""The pool and connection every topology's Redis client is built on (shared/backends.py
builds each; shared/connection.py hands it the URL): `PromptPool`, commands packed by
hiredis (`HiredisPacking`), a handshake retried (`HandshakeRetry`), the retries and their
backoff; and `HeldConnection`, one connection of a pool kept by a loop that sends a round
per token (a worker's stream writer, each of the API hub's lanes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast

import hiredis
from arq.connections import ArqRedis
from redis.asyncio import BlockingConnectionPool, ConnectionPool
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.commands.core import BasicKeyCommands, StreamCommands
from redis.exceptions import ConnectionError, ResponseError, TimeoutError

from compat.redis import unfit

__all__ = [
    "RETRIES",
    "HandshakeRetry",
    "HeldConnection",
    "HeldPipeline",
    "HiredisPacking",
    "PromptPool",
    "backoff_s",
    "pool_options",
    "pooled_client",
    "pooled_connection",
    "retry_policy",
]

# About 30 s of retries with backoff capped at 1 s: long enough for a Redis restart, or for
# Sentinels to notice a dead primary and promote its replica.
RETRIES = 40

# 50 ms doubling to 1 s: each client's retries, and every loop that waits for Redis to
# come back (`backoff_s`).
_BACKOFF = ExponentialBackoff(cap=1.0, base=0.05)


def backoff_s(failures: int) -> float:
    """How long a loop that has failed `failures` times in a row waits before it tries Redis
    again: as the clients' own retries wait."""
    return float(_BACKOFF.compute(failures))


def retry_policy(retries: int = RETRIES) -> Retry:
    """A client's retries: `retries` of them, waiting as `backoff_s` says."""
    return Retry(_BACKOFF, retries)


class PromptPool(BlockingConnectionPool):
    """redis-py's `BlockingConnectionPool`, minus an event-loop iteration per command.

    Before handing out a connection, redis-py 5 makes sure nothing is left to read on it
    with a zero-timeout read, which suspends the caller until the loop's next iteration:
    on a busy worker every command then waited behind everything else ready to run (the
    p99 of an XADD at 100 streams was 14 ms). redis-py 7 replaced that read (#4063); arq
    pins redis < 6. This pool looks at what the connection has already received instead
    (compat/redis.py): leftover bytes or the server's EOF mean it is not fit to reuse, so
    it reconnects. A connection that dies unnoticed fails its command, which the client's
    retry policy sends again on a fresh one.
    """

    async def ensure_connection(self, connection: AbstractConnection) -> None:
        await _ready(connection)


async def _ready(connection: AbstractConnection) -> None:
    """Connect `connection`, again if what it received says it is not fit to reuse."""
    await connection.connect()
    if unfit(connection):
        await connection.disconnect()
        await connection.connect()


class HiredisPacking:
    """A redis-py asyncio connection that packs commands with hiredis's C packer.

    redis-py 5's asyncio connection packs every command in Python (its sync one already
    uses hiredis): 4.4 µs for a turn's `XADD`, 9.4 µs for the `EVAL` that creates a turn,
    against 0.6 and 1.4 µs here (measured alone on this box; about 40 commands a turn
    between the API and the worker, and one `XADD` per streamed token). Arguments hiredis
    does not take (a bool, None) go through redis-py's packer, which refuses them with its
    own `DataError`. tests/shared/test_redis_packing.py holds the bytes to redis-py's.
    """

    def pack_command(self, *args: Any) -> list[bytes]:
        # As redis-py does: a command name with a space holds several words ("CONFIG GET").
        head = args[0]
        if isinstance(head, str):
            args = (*head.encode().split(), *args[1:])
        elif b" " in head:
            args = (*head.split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError:
            return cast(list[bytes], super().pack_command(*args))  # type: ignore[misc]


class HandshakeRetry:
    """A redis-py asyncio connection whose handshake (what it sends once its socket is open:
    HELLO, AUTH, SELECT, CLIENT SETNAME) is tried again when the server closes it first.

    A Redis restarting, or a primary failing over, may accept a connection and drop it
    before answering. redis-py retries the socket's connect by the connection's retry
    policy, but not the handshake, and a pool hands out connections outside the retries of
    the command that asked for one: that command failed at once (a worker finishing a job
    as its Redis restarted died of it, tests/test_faults.py). A handshake is tried
    `HANDSHAKES` times, each connect with its own retries.
    """

    HANDSHAKES = 3
    _handshaking = False

    async def connect(self) -> None:
        for tried in range(1, self.HANDSHAKES + 1):
            self._handshaking = False
            try:
                await super().connect()  # type: ignore[misc]
                return
            except ConnectionError:
                if not self._handshaking or tried == self.HANDSHAKES:
                    raise  # the socket's connect failed: its retries are spent
            await asyncio.sleep(backoff_s(tried))

    async def on_connect(self) -> None:
        self._handshaking = True
        await super().on_connect()  # type: ignore[misc]


class HeldConnection:
    """One connection of `pool` that a loop keeps for its pipelines, one in flight at a
    time (`pipeline`): what redis-py's pipeline does for a round of commands (pack them
    all, send them at once, read each reply, an error reply in its place, a lost
    connection retried by its retry policy), without taking a connection from the pool,
    building a client for the round and running each reply through the client's response
    callbacks. A round of one `XADD`, what a paced token costs a worker, was 67 µs of CPU
    through redis-py's pipeline and 36 here (tests/shared/test_redis_held.py holds the
    replies to a pipeline's; docs/benchmarks.md, "Cost per token"). Replies come as Redis
    sent them (bytes, not decoded).
    """

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool
        self._connection: AbstractConnection | None = None

    def pipeline(self) -> HeldPipeline:
        """A pipeline to queue a round on (its commands, as on a redis-py pipeline)."""
        return HeldPipeline(self)

    async def run(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Send `commands` in one write and read their replies, each error reply (a
        `ResponseError`) in its place; a lost connection fails or, by the pool's retry
        policy, sends the round again on a new one, as a pipeline does."""
        if not commands:
            return []
        connection = self._connection
        if connection is None:
            connection = self._connection = await self.pool.get_connection()
        return cast(
            list[Any],
            await connection.retry.call_with_retry(
                lambda: _exchange(connection, commands),
                lambda _error: connection.disconnect(),
            ),
        )

    async def aclose(self) -> None:
        """Give the connection back to the pool."""
        connection, self._connection = self._connection, None
        if connection is not None:
            await self.pool.release(connection)


async def _exchange(
    connection: AbstractConnection, commands: Sequence[tuple[Any, ...]]
) -> list[Any]:
    await _ready(connection)  # kept between rounds: the server may have closed it since
    await connection.send_packed_command(connection.pack_commands(commands))
    replies: list[Any] = []
    for _ in commands:
        try:
            replies.append(await connection.read_response(disable_decoding=True))
        except ResponseError as error:
            replies.append(error)
    return replies


class HeldPipeline(StreamCommands, BasicKeyCommands):
    """A round of commands for a `HeldConnection`: queued as on a redis-py pipeline (`xadd`,
    `expire`, `execute_command`), sent by `execute`."""

    def __init__(self, held: HeldConnection) -> None:
        self.held = held
        self.connection_pool = held.pool  # what redis-py's command methods expect of self
        self.commands: list[tuple[Any, ...]] = []

    def execute_command(self, *args: Any, **options: Any) -> HeldPipeline:
        self.commands.append(args)
        return self

    async def execute(self, raise_on_error: bool = False) -> list[Any]:
        """Send the round; its replies. Only `raise_on_error=False` (errors in place)."""
        if raise_on_error:
            raise ValueError("a held pipeline hands back error replies in their place")
        commands, self.commands = self.commands, []
        return await self.held.run(commands)

    async def __aenter__(self) -> HeldPipeline:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.commands = []


def pooled_connection(connection_class: type[AbstractConnection]) -> type[AbstractConnection]:
    """`connection_class` as Bernard's pools use it: packing its commands with hiredis
    (`HiredisPacking`), its handshake retried (`HandshakeRetry`)."""
    if issubclass(connection_class, HiredisPacking):
        return connection_class
    packed = _PACKED.get(connection_class)
    if packed is None:
        name = f"Hiredis{connection_class.__name__}"
        packed = type(name, (HiredisPacking, HandshakeRetry, connection_class), {})
        _PACKED[connection_class] = packed
    return packed


_PACKED: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def pool_options(
    retries: int, max_connections: int, overrides: dict[str, object]
) -> dict[str, Any]:
    """The options of a client's pool (a `PromptPool`'s, of any topology): it retries
    connection errors with backoff (`retries` times) and waits for a free connection past
    `max_connections`; `overrides` win."""
    return {
        "max_connections": max_connections,
        "timeout": 30,
        "retry": retry_policy(retries),
        "retry_on_error": [ConnectionError, TimeoutError, OSError],
        "health_check_interval": 30,
        **overrides,
    }


def pooled_client(pool: ConnectionPool) -> ArqRedis:
    """arq's `ArqRedis` on `pool`, packing its commands with hiredis and owning the pool."""
    # After `from_url`, which picks the class for the URL's scheme (TLS, a Unix socket).
    pool.connection_class = pooled_connection(pool.connection_class)
    client = ArqRedis(pool)
    client.auto_close_connection_pool = True  # the client owns its pool: aclose() closes it
    return client
