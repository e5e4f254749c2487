"""Lua scripts inside pipelines, on any client (shared/connection.py).

A script called on its own goes through redis-py's `register_script` (EVALSHA, loaded on
the node that answers NOSCRIPT, a Cluster's included). Inside a pipeline it goes as an
EVAL of its text instead: redis-py runs a `SCRIPT EXISTS` round trip before every plain
pipeline that holds a registered script, and a Cluster pipeline cannot hold one at all
(redis-py 5 awaits it as a command and so empties the pipeline). EVAL needs neither, and
Redis caches the compiled script by its hash as it does for EVALSHA.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.asyncio.client import Pipeline


def in_pipeline(pipe: Pipeline, script: str, keys: Sequence[str], args: Sequence[Any]) -> None:
    """Queue `script` on `pipe` with `keys` (all of one hash tag) and `args`."""
    pipe.execute_command("EVAL", script, len(keys), *keys, *args)


# KEYS: an index (a sorted set). ARGV: member, score, the index's TTL s, 'NX' to add only
# a member not there yet ('' to add or move it), the most members it keeps, the newest ('' any
# number). Adds the member, keeps the index to its size and renews it, in one step: an
# owner's index of turns (shared/turns/creation.py) and of conversations
# (shared/conversation_state.py), on every turn that starts one.
INDEX = """
if ARGV[4] == 'NX' then
  redis.call('ZADD', KEYS[1], 'NX', ARGV[2], ARGV[1])
else
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
end
if ARGV[5] ~= '' then redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -tonumber(ARGV[5]) - 1) end
redis.call('EXPIRE', KEYS[1], ARGV[3])
"""


def index(
    pipe: Pipeline,
    key: str,
    member: str,
    score: float,
    *,
    ttl_s: int,
    new_only: bool = False,
    keep: int | None = None,
) -> None:
    """Queue on `pipe` adding `member` to the index `key` at `score` (only if it is not
    there, `new_only`), the index kept to its newest `keep` and renewed for `ttl_s`."""
    args = [member, repr(score), ttl_s, "NX" if new_only else "", "" if keep is None else keep]
    in_pipeline(pipe, INDEX, [key], args)


# KEYS: a set of leased slots, a sorted set scored by the time each lapses. ARGV: now,
# limit, member, the member's lapse, the set's TTL s (at least any member's lapse). Takes
# a slot for `member` below `limit`, in one step, so the limit holds across processes;
# the lapsed members are dropped only when the set is at the limit (below it, they cannot
# change the answer, and the set never holds more than `limit` members: one command fewer
# per slot taken). Returns 1 taken, 0 at the limit. A user's queued and running turns
# (shared/turns/admission.py `admit`) and open streams (api/attachments.py) count so.
TAKE_SLOT = """
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
  if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
end
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""


def unless_refused(first: str, second: str) -> str:
    """One script that runs `first`, then `second` unless `first` answered a negative
    number (it refused), each over its own keys and arguments (`unless_refused_call` lays
    them out), and answers what `first` did. For a server that does not split by slot
    (`Backend.splits_by_slot`): the two may be of two hash tags. Each runs as a function
    whose parameters are named KEYS and ARGV, so either script's text is used as it is."""
    return f"""
local function first(KEYS, ARGV)
{first}
end
local function second(KEYS, ARGV)
{second}
end
local key_count, arg_count = tonumber(ARGV[1]), tonumber(ARGV[2])
local keys_1, args_1, keys_2, args_2 = {{}}, {{}}, {{}}, {{}}
for i = 1, #KEYS do
  if i <= key_count then keys_1[i] = KEYS[i] else keys_2[i - key_count] = KEYS[i] end
end
for i = 3, #ARGV do
  if i - 2 <= arg_count then args_1[i - 2] = ARGV[i] else args_2[i - 2 - arg_count] = ARGV[i] end
end
local answer = first(keys_1, args_1)
if tonumber(answer) >= 0 then second(keys_2, args_2) end
return answer
"""


def unless_refused_call(
    first_keys: Sequence[str],
    first_args: Sequence[Any],
    second_keys: Sequence[str],
    second_args: Sequence[Any],
) -> tuple[list[str], list[Any]]:
    """The keys and arguments of an `unless_refused` script: the first's, then the
    second's."""
    keys = [*first_keys, *second_keys]
    return keys, [len(first_keys), len(first_args), *first_args, *second_args]
