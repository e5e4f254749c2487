"""How many commands a turn sends Redis, counted at a Redis of the test's own (MONITOR): a
chat turn and a one-tool turn each within the figures docs/benchmarks.md gives ("Redis
commands per turn"), the idle work of the API and the worker (liveness, reapers, the memory
guard, arq's poll and health check) left out. A script is one command, its own commands
not counted; a pipeline of five is five.

A command more on either kind of turn is one more on every turn: when this fails, the
listing in its message says which; if the command is worth it, raise the figure here and in
docs/benchmarks.md with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from bench.turn_commands import Seen, monitor_lines, parse, phase_of, script_names
from shared import keys
from tests.support.chat import body
from tests.support.processes import private_redis, wait_for
from tests.support.sse import collect
from tests.support.stack import Stack, make_settings, run_stack
from tests.support.upstream import Reply, ScriptedUpstream

CHAT = "/v1/chat/completions"
# The most commands a turn of each kind sends: docs/benchmarks.md's figures (28.6 and 38.2),
# rounded down. They count the worker's extra poll between two turns (0.7), which is left
# out here: about one of slack for the relay's reads and the stream's writes, which batch
# as the turn's timing has it (27 and 37 when this was written, on a busy box as on a quiet).
AT_MOST = {"chat": 28, "tool": 38}
# What runs whether or not a turn does: the worker's poll of the queue is one (`pickup`
# below), and the rest `phase_of` files as idle.
_POLL = frozenset({"BLPOP", "ZRANGEBYSCORE"})


@contextlib.asynccontextmanager
async def monitored(url: str) -> AsyncIterator[list[Seen]]:
    """Every command the Redis at `url` runs while the block runs, MONITOR's own aside."""
    seen: list[Seen] = []
    async with monitor_lines(Redis.from_url(url)) as lines:
        yield seen
    seen += [s for s in map(parse, lines) if s is not None]


def turn_commands(seen: list[Seen], queue_name: str) -> Counter[str]:
    """The commands sent for the turn, by command (a script by its name): a script's own
    commands, the idle work and the worker's poll left out. The API and the worker share
    this process: which sent what is not told apart."""
    scripts = script_names()
    counted: Counter[str] = Counter()
    for command in seen:
        if command.client == "lua" or command.name == "MONITOR":
            continue
        phase, label = phase_of("worker", command, scripts, queue_name)
        if phase == "idle" or (phase == "pickup" and command.name in _POLL):
            continue
        counted[label] += 1
    return counted


async def one_turn(stack: Stack, upstream: ScriptedUpstream, kind: str) -> None:
    """A streamed turn of `kind`: the answer at once, after the calculator for "tool"."""
    if kind == "tool":
        upstream.script(Reply.tool_calls([("calculator", {"expression": "6 * 7"})]))
    upstream.script(Reply.text(["Sure"]))
    frames = await collect(stack.client, "POST", CHAT, json=body("bench", stream=True))
    assert frames[-1].done


async def settled(stack: Stack) -> None:
    """Until no turn runs, and the worker's end of the job is in."""

    async def idle() -> bool:
        return not await stack.redis.zcard(keys.RUNNING_TURNS)

    await wait_for(idle, timeout_s=5, interval_s=0.02)
    await asyncio.sleep(0.2)


@pytest.mark.parametrize("kind", ["chat", "tool"])
async def test_a_turn_sends_redis_no_more_commands_than_its_figure(
    upstream: ScriptedUpstream, tmp_path: Path, kind: str
) -> None:
    async with private_redis(tmp_path / "redis") as server:
        # One model for both roles, as the benchmark's (and `./run`'s) default.
        settings = make_settings(
            upstream, redis_url=server.url, router_model="model", response_model="model"
        )
        async with run_stack(settings) as stack:
            for _ in range(2):  # the scripts loaded, the pools' connections opened
                await one_turn(stack, upstream, kind)
                await settled(stack)
            async with monitored(server.url) as seen:
                await one_turn(stack, upstream, kind)
                await settled(stack)
    counted = turn_commands(seen, settings.queue_name)
    listing = "\n".join(f"{label}: {n}" for label, n in sorted(counted.items()))
    assert sum(counted.values()) <= AT_MOST[kind], listing
