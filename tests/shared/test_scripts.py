"""shared/scripts.py's own scripts against the real Redis: an index added to, kept to its
size and renewed in one step, and two scripts joined so the second runs only when the first
did not refuse."""

from __future__ import annotations

import uuid

from redis.asyncio import Redis

from shared import scripts


async def test_an_index_keeps_its_newest_members_and_lives_its_ttl(redis: Redis) -> None:
    key = f"test:index:{uuid.uuid4().hex}"
    try:
        for member, score in (("a", 1.0), ("b", 2.0), ("c", 3.0)):
            async with redis.pipeline(transaction=False) as pipe:
                scripts.index(pipe, key, member, score, ttl_s=100, keep=2)
                await pipe.execute()
        assert await redis.zrange(key, 0, -1, withscores=True) == [(b"b", 2.0), (b"c", 3.0)]
        assert 90 < await redis.ttl(key) <= 100

        async with redis.pipeline(transaction=False) as pipe:
            scripts.index(pipe, key, "b", 9.0, ttl_s=200, new_only=True)  # there: not moved
            scripts.index(pipe, key, "d", 1.5, ttl_s=200, new_only=True)
            await pipe.execute()
        assert await redis.zrange(key, 0, -1, withscores=True) == [
            (b"d", 1.5),
            (b"b", 2.0),
            (b"c", 3.0),
        ]
        assert 190 < await redis.ttl(key) <= 200
    finally:
        await redis.delete(key)


# Appends its argument to KEYS[1] and answers the list's length, or -1 (refuses) when the
# argument is "no"; the second appends its own to its own key.
_FIRST = """
if ARGV[1] == 'no' then return -1 end
return redis.call('RPUSH', KEYS[1], ARGV[1])
"""
_SECOND = "return redis.call('RPUSH', KEYS[1], ARGV[1], ARGV[2])"


async def test_joined_scripts_run_the_second_only_when_the_first_did_not_refuse(
    redis: Redis,
) -> None:
    first, second = f"test:first:{uuid.uuid4().hex}", f"test:second:{uuid.uuid4().hex}"
    joined = redis.register_script(scripts.unless_refused(_FIRST, _SECOND))
    try:
        for value in ("yes", "no", "again"):
            joined_keys, joined_args = scripts.unless_refused_call(
                [first], [value], [second], [f"{value}-1", f"{value}-2"]
            )
            answer = await joined(keys=joined_keys, args=joined_args)
            assert answer == (-1 if value == "no" else 1 if value == "yes" else 2)
        assert await redis.lrange(first, 0, -1) == [b"yes", b"again"]
        assert await redis.lrange(second, 0, -1) == [b"yes-1", b"yes-2", b"again-1", b"again-2"]
    finally:
        await redis.delete(first, second)
