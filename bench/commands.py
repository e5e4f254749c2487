"""Redis commands per paced token: `python -m bench.commands`.

Slow streams through 1 API + 1 worker on a Redis of the run's own, each row's commands
counted with `INFO commandstats` (which counts what Lua scripts run too) over the row, and
divided by the tokens streamed. Command counts do not depend on how busy the box is, so
they hold on a shared machine; no CPU figure is given here for that reason.

A row is `streams×tokens@delay_ms`: that many answers at once (started over one `delay_ms`,
as the relay section does), each `tokens` tokens a token every `delay_ms`.

`python -m bench.commands --turn` instead attributes a turn's fixed cost: the
commands of 2 × 10 sequential 1-token turns (`INFO commandstats`, the idle rate taken out),
then every command of one more such turn, from its request until its processes are quiet,
as MONITOR saw it, by process (`lua`: run by a script). Run it at two commits and diff the
listings to see what a change added or removed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

from rich.console import Console

from bench.measurements import monitored
from bench.processes import BENCH_ENV, Cluster
from bench.runner import Bench, Meter, Sizes, Ui, check_all, drive, echo_directives, wait_idle

DEFAULT_ROWS = ("1x200@20", "100x25@400", "100x100@20", "1000x10@4000")


def _row(text: str) -> tuple[int, int, float]:
    streams, rest = text.split("x", 1)
    tokens, delay = rest.split("@", 1)
    return int(streams), int(tokens), float(delay)


@contextlib.asynccontextmanager
async def _started(prefix: str) -> AsyncIterator[Bench]:
    """1 API + 1 worker, the scripted upstream and a Redis of their own, stopped and their
    work directory removed after the block."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    cluster = Cluster.create(workdir, None, BENCH_ENV)
    ui = Ui(Console(stderr=True))
    try:
        with ui.progress:
            await cluster.start_upstream()
            await cluster.start_api()
            await cluster.start_worker()
            redis = cluster.redis()
            try:
                yield Bench(
                    cluster=cluster, redis=redis, sizes=Sizes.quick(), ui=ui, workdir=workdir
                )
            finally:
                await redis.aclose()
    finally:
        cluster.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)


async def _measure(rows: list[tuple[int, int, float]]) -> None:
    async with _started("bernard-paced-") as bench:
        ui = bench.ui
        idle = await Meter(bench).start()
        await asyncio.sleep(5)
        await idle.stop()
        lines = [
            f"idle, 1 API + 1 worker: {idle.cost.total / idle.cost.seconds:.1f} commands/s",
            "| row | turns | tokens | exact | commands | per turn | per token | top (per token) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for streams, tokens, delay in rows:
            directives = echo_directives("pc", streams, tokens, delay)
            task = ui.task(f"{streams} × {tokens} every {delay:g} ms", streams)
            meter = await Meter(bench).start()
            turns = await drive(
                [bench.api],
                directives,
                system="pipeline",
                concurrency=streams,
                stagger_s=delay / 1000 if streams > 1 else 0,
                on_done=lambda _t, task=task: ui.advance(task),  # type: ignore[misc]
            )
            await wait_idle(bench)
            await meter.stop()
            ui.done(task)
            exact, _ = check_all(turns)
            total = meter.cost.total
            ranked = sorted(meter.cost.commands.items(), key=lambda kv: -kv[1])
            top = ", ".join(f"{k} {v / (streams * tokens):.2f}" for k, v in ranked[:6])
            lines.append(
                f"| {streams} × {tokens} every {delay:g} ms | {streams} | {streams * tokens:,} "
                f"| {exact}/{streams} | {total:,} | {total / streams:.1f} "
                f"| **{total / (streams * tokens):.2f}** | {top} |"
            )
    print("\n".join(lines))


async def _one_turn(bench: Bench) -> list[str]:
    """Every command of one sequential 1-token turn, from its request until the processes
    are quiet, as MONITOR saw it: `ms process command` lines, then the count by process."""
    async with monitored(bench) as seen:
        sent = time.time()
        await drive([bench.api], echo_directives("turn", 1, 1), system="pipeline", concurrency=1)
        await wait_idle(bench)
    lines, by = [], Counter[str]()
    for command in seen:
        if command.at < sent:
            continue
        by[command.who] += 1
        lines.append(f"{(command.at - sent) * 1000:9.2f} {command.who:8} {command.text[:120]}")
    counts = ", ".join(f"{who} {n}" for who, n in sorted(by.items()))
    return [*lines, f"one turn, by process (? and the liveness ticks are idle work): {counts}"]


async def _turn_cost() -> None:
    async with _started("bernard-turn-") as bench:
        await drive([bench.api], echo_directives("warm", 5, 1), system="pipeline", concurrency=1)
        await wait_idle(bench)
        idle = await Meter(bench).start()
        await asyncio.sleep(5)
        await idle.stop()
        rate = idle.cost.total / idle.cost.seconds
        per_turn = []
        commands: Counter[str] = Counter()
        for _ in range(2):
            meter = await Meter(bench).start()
            await drive([bench.api], echo_directives("rc", 10, 1), system="pipeline", concurrency=1)
            await wait_idle(bench)
            await meter.stop()
            per_turn.append((meter.cost.total - rate * meter.cost.seconds) / 10)
            commands.update(meter.cost.commands)
        listing = await _one_turn(bench)
        top = ", ".join(f"{k} {v / 20:.1f}" for k, v in commands.most_common())
        print("\n".join(listing))
        print(
            f"commands per sequential 1-token turn, idle ({rate:.1f}/s) taken out: "
            f"{per_turn[0]:.1f}, {per_turn[1]:.1f} (two stretches of 10 turns); by command, "
            f"idle included: {top}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="*", default=list(DEFAULT_ROWS), help="streamsxtokens@ms")
    parser.add_argument(
        "--turn", action="store_true", help="instead: the commands of one turn, attributed"
    )
    args = parser.parse_args()
    if args.turn:
        asyncio.run(_turn_cost())
    else:
        asyncio.run(_measure([_row(r) for r in args.rows]))


if __name__ == "__main__":
    main()
