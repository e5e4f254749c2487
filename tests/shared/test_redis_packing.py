"""Commands packed by hiredis (shared/redis_pool.py `HiredisPacking`) are the bytes
redis-py's own asyncio packer makes, and what it refuses is refused the same way."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from shared.connection import connect, connect_data
from shared.redis_pool import HiredisPacking, pooled_connection
from tests.support.session_redis import session_redis_url

LIBRARY = Connection()
PACKED = pooled_connection(Connection)()
SCRIPT = "local status = redis.call('HGET', KEYS[1], 'status')\nreturn status\n"


@pytest.mark.parametrize(
    "command",
    [
        ("PING",),
        ("XADD", "bernard:{t}:events", "MAXLEN", "~", 10000, "NOMKSTREAM", "*", "e", b'{"a":1}'),
        ("EVAL", SCRIPT, 3, "k1", "k2", "k3", 604800, "", b"\x00\xff", 1795641995.1572886, -1),
        ("XREAD", "BLOCK", 5000, "COUNT", 1000, "STREAMS", "a", "b", "0-0", "1795641995158-3"),
        ("CONFIG GET", "maxmemory-policy"),
        (b"CONFIG GET", b"save"),
        ("SET", "ünïcode 😀", "é" * 3),
        ("SET", "big", b"x" * 200_000),
        ("SET", "view", memoryview(b"bytes")),
        ("ZADD", "z", 1e-7, "m", 10**20, "n", float("inf"), "o"),
    ],
    ids=[
        "ping",
        "xadd",
        "eval",
        "xread",
        "two-word name",
        "two-word name, bytes",
        "unicode",
        "over the buffer cutoff",
        "memoryview",
        "numbers",
    ],
)
def test_the_same_bytes_as_redis_py(command: tuple[Any, ...]) -> None:
    ours = PACKED.pack_command(*command)
    theirs = LIBRARY.pack_command(*command)
    assert b"".join(ours) == b"".join(bytes(chunk) for chunk in theirs)


def test_a_pipeline_is_the_same_bytes_as_redis_py() -> None:
    commands = [("MULTI",), ("INCR", "n"), ("EXPIRE", "n", 60), ("EXEC",)]
    ours = b"".join(PACKED.pack_commands(commands))
    assert ours == b"".join(bytes(chunk) for chunk in LIBRARY.pack_commands(commands))


@pytest.mark.parametrize(
    ("argument", "error"),
    [(True, DataError), (None, DataError), ("\udc80", UnicodeEncodeError)],
    ids=["bool", "None", "lone surrogate"],
)
def test_what_redis_py_refuses_is_refused_alike(argument: Any, error: type[Exception]) -> None:
    with pytest.raises(error) as theirs:
        LIBRARY.pack_command("SET", "k", argument)
    with pytest.raises(error) as ours:
        PACKED.pack_command("SET", "k", argument)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6399/0",
        "rediss://127.0.0.1:6399/0",
        "unix:///tmp/nowhere.sock",
        "redis+sentinel://127.0.0.1:26399/mymaster",
        "redis+cluster://127.0.0.1:6399",
    ],
    ids=["plain", "tls", "unix socket", "sentinel", "cluster"],
)
async def test_every_client_packs_with_hiredis(url: str) -> None:
    """Whatever the URL (no connection is made), the connections the client will open
    keep the class the URL calls for (TLS, Unix socket, Sentinel-managed) and pack with
    hiredis."""
    client: Any = connect_data(url)
    try:
        if url.startswith("redis+cluster"):
            classes = [
                node.connection_class for node in client.nodes_manager.startup_nodes.values()
            ]
            classes.append(client.connection_kwargs["connection_class"])
        else:
            classes = [client.connection_pool.connection_class]
        assert classes
        for cls in classes:
            assert issubclass(cls, HiredisPacking)
        if url.startswith("rediss"):
            assert "SSL" in classes[0].__name__
        if url.startswith("unix"):
            assert "UnixDomainSocket" in classes[0].__name__
        if "sentinel" in url:
            assert "Sentinel" in classes[0].__name__
    finally:
        await client.aclose()


async def test_a_real_redis_reads_back_what_was_packed() -> None:
    client = connect(session_redis_url())
    key = "bernard:test:packing"
    try:
        await client.set(key, "ünïcode 😀", ex=60)
        assert (await client.get(key)).decode() == "ünïcode 😀"
        async with client.pipeline(transaction=True) as pipe:
            pipe.incrbyfloat(key + ":n", 1.5)
            pipe.expire(key + ":n", 60)
            assert (await pipe.execute())[0] == 1.5
    finally:
        await client.delete(key, key + ":n")
        await client.aclose()
