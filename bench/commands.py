"""Redis commands per paced token (issue 25): `python -m bench.commands`.

Slow streams through 1 API + 1 worker on a Redis of the run's own, each row's commands
counted with `INFO commandstats` (which counts what Lua scripts run too) over the row, and
divided by the tokens streamed. Command counts do not depend on how busy the box is, so
they hold on a shared machine; no CPU figure is given here for that reason.

A row is `streams×tokens@delay_ms`: that many answers at once (started over one `delay_ms`,
as the relay section does), each `tokens` tokens a token every `delay_ms`.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
from pathlib import Path

from rich.console import Console

from bench.processes import BENCH_ENV, Cluster
from bench.runner import Bench, Meter, Sizes, Ui, check_all, drive, echo_directives, wait_idle

DEFAULT_ROWS = ("1x200@20", "100x25@400", "100x100@20", "1000x10@4000")


def _row(text: str) -> tuple[int, int, float]:
    streams, rest = text.split("x", 1)
    tokens, delay = rest.split("@", 1)
    return int(streams), int(tokens), float(delay)


async def _measure(rows: list[tuple[int, int, float]]) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="bernard-paced-"))
    cluster = Cluster.create(workdir, None, BENCH_ENV)
    ui = Ui(Console(stderr=True))
    try:
        with ui.progress:
            await cluster.start_upstream()
            await cluster.start_api()
            await cluster.start_worker()
            redis = cluster.redis()
            bench = Bench(cluster=cluster, redis=redis, sizes=Sizes.quick(), ui=ui, workdir=workdir)
            idle = await Meter(bench).start()
            await asyncio.sleep(5)
            await idle.stop()
            lines = [
                f"idle, 1 API + 1 worker: {idle.cost.total / idle.cost.seconds:.1f} commands/s",
                "| row | turns | tokens | exact | commands | per turn | per token "
                "| top (per token) |",
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
            await redis.aclose()
        print("\n".join(lines))
    finally:
        cluster.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="*", default=list(DEFAULT_ROWS), help="streamsxtokens@ms")
    args = parser.parse_args()
    asyncio.run(_measure([_row(r) for r in args.rows]))


if __name__ == "__main__":
    main()
