"""The per-turn command count's reading of MONITOR (bench/turn_commands.py): a line as Redis
writes it is parsed back to the arguments sent, and a script is known by its name."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from bench.turn_commands import Seen, monitor_lines, parse, phase_of, script_names
from shared import keys
from shared.lifecycle import CREATE


def test_a_monitor_line_is_parsed_back_to_the_arguments_sent() -> None:
    line = rb'1796288633.512269 [0 127.0.0.1:50612] "EVAL" "a \"b\"\n\\c" "1" "k" "\xff\x00"'
    assert parse(line) == Seen(
        1796288633.512269, "127.0.0.1:50612", (b"EVAL", b'a "b"\n\\c', b"1", b"k", b"\xff\x00")
    )
    assert parse(b'1.5 [0 lua] "GET" "k"') == Seen(1.5, "lua", (b"GET", b"k"))
    assert parse(b"OK") is None


async def test_a_script_sent_as_eval_is_named_by_its_text(redis: Redis, redis_url: str) -> None:
    turn_keys = [keys.turn("t-named"), keys.events("t-named"), keys.attached("t-named")]
    async with monitor_lines(Redis.from_url(redis_url)) as lines:
        await asyncio.sleep(0.1)
        await redis.eval(CREATE, 3, *turn_keys, 5, "{}", "", 0, 1, "status", "queued")
    await redis.delete(*turn_keys)
    seen = [s for s in map(parse, lines) if s is not None and s.name == "EVAL"]
    scripts = script_names()
    assert [phase_of("api1", s, scripts, "q") for s in seen] == [("create", "lifecycle.CREATE")]


def test_every_script_of_a_turn_is_known_by_name() -> None:
    names = set(script_names().values())
    assert {
        "admission._ADMIT",
        "budgets.ACCOUNT",
        "conversation_state.SCRIPTS[create]",
        "lifecycle.CLAIM",
        "lifecycle.CREATE",
        "lifecycle.FINISH",
        "liveness.KEEP",
        "queue._TAKE",
        "writes._APPEND",
        "writes.COUNTED[writes._APPEND]",
    } <= names
