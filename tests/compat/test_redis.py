"""compat/redis.py: whether a redis-py asyncio connection is fit to reuse, told from what it
received, on a real server: a reply nobody read, the server closing it."""

from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.connection import Connection

from compat.redis import unfit
from tests.support.processes import wait_for
from tests.support.session_redis import session_redis_url


async def test_a_connection_is_unfit_once_a_reply_waits_unread_or_the_server_closed_it() -> None:
    client = Redis.from_url(session_redis_url())
    connection = Connection(**client.connection_pool.connection_kwargs)
    try:
        assert unfit(connection) is False, "not connected yet: nothing to say"
        await connection.connect()
        await connection.send_command("PING")
        assert await connection.read_response() == b"PONG"
        assert unfit(connection) is False
        await connection.send_command("PING")  # its reply is never read
        await wait_for(lambda: unfit(connection), 2.0, interval_s=0.01)
        await connection.read_response()
        assert unfit(connection) is False
        await connection.send_command("CLIENT", "ID")
        own_id = await connection.read_response()
        await client.client_kill_filter(_id=own_id)
        await wait_for(lambda: unfit(connection), 2.0, interval_s=0.01)
    finally:
        await connection.disconnect()
        await client.aclose()
