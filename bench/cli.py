"""`python -m bench`: start everything, run the measurements, write docs/benchmarks.md."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from rich.console import Console

from bench import measurements, topology
from bench.cost import cost_per_token
from bench.first_word import first_word
from bench.gc_hold import collect_held, hold_full_collections
from bench.history import history_length
from bench.loads import forget_exchanges
from bench.neighbour import noisy_neighbour
from bench.peers import peers
from bench.processes import BENCH_ENV, ROOT, Cluster
from bench.report import Section, write
from bench.runner import Bench, Sizes, Ui, drive, echo_directives
from bench.turn_commands import turn_commands

PACKAGES = (
    "arq",
    "redis",
    "hiredis",
    "fastapi",
    "starlette",
    "uvicorn",
    "uvloop",
    "httptools",
    "sse-starlette",
    "langchain-core",
    "langchain-openai",
    "openai",
    "langgraph",
)


# In the order they run: the Redis section reads the figures the others left.
MEASUREMENTS = {
    **{k: v for k, v in measurements.MEASUREMENTS.items() if k != "redis"},
    "cost": cost_per_token,
    "history": history_length,
    "noisy-neighbour": noisy_neighbour,
    "first-word": first_word,
    "peers": peers,
    "turn-commands": turn_commands,
    "redis": measurements.MEASUREMENTS["redis"],
}
REPORT_ORDER = (
    "first-token",
    "relay",
    "throughput",
    "exactness",
    "redis",
    "turn-commands",
    "cancel",
    "memory",
    "worker-death",
    "cost",
    "history",
    "noisy-neighbour",
    "first-word",
    "peers",
)
DEFAULT_API = "api.main:app"
DEFAULT_WORKER = "worker.main.WorkerSettings"


async def warm_up(bench: Bench) -> None:
    """A few turns through every API, so lazy imports and pools are paid before measuring."""
    for endpoint in [s.endpoint for s in bench.cluster.apis]:
        await drive([endpoint], echo_directives("warm", 3, 20), system="pipeline", concurrency=1)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    names = ", ".join(MEASUREMENTS)
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Bernard's benchmarks: pipeline vs in-process baseline.",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--only", default="", help=f"comma-separated subset of: {names}")
    parser.add_argument("--skip", default="", help="comma-separated measurements to leave out")
    parser.add_argument(
        "--output",
        type=Path,
        help="report path (default: docs/benchmarks.md for a full run of everything, "
        "else benchmarks.md in the run's work directory)",
    )
    parser.add_argument(
        "--redis-url",
        help="use this Redis instead of starting one (command counts then include "
        "other clients' traffic)",
    )
    parser.add_argument(
        "--api-app",
        default=DEFAULT_API,
        help="what the API processes run (uvicorn target), to measure a design change "
        f"before making it (default {DEFAULT_API})",
    )
    parser.add_argument(
        "--worker-settings",
        default=DEFAULT_WORKER,
        help=f"what the worker processes run (arq target; default {DEFAULT_WORKER})",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="instead: exactness and relay capacity on one Redis, then on a 3-primary Redis "
        "Cluster, with each Redis server's CPU per token (bench/topology.py; a full run "
        "writes docs/scaling.md)",
    )
    return parser.parse_args(argv)


def selected(args: argparse.Namespace) -> list[str]:
    chosen = [n.strip() for n in args.only.split(",") if n.strip()] or list(MEASUREMENTS)
    skipped = {n.strip() for n in args.skip.split(",") if n.strip()}
    unknown = (set(chosen) | skipped) - set(MEASUREMENTS)
    if unknown:
        raise SystemExit(f"unknown measurement(s): {', '.join(sorted(unknown))}")
    return [n for n in MEASUREMENTS if n in chosen and n not in skipped]


def _machine() -> dict[str, str]:
    model = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal"):
            mem_kib = int(line.split()[1])
    return {
        "cpu": model,
        "cores": str(os.cpu_count()),
        "memory": f"{mem_kib / 1024 / 1024:.1f} GiB",
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def _commit() -> str:
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "api", "worker", "shared"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return f"{sha} (with uncommitted changes in api/worker/shared)" if dirty else sha


def _versions() -> str:
    out = []
    for name in PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out.append(f"{name} {importlib.metadata.version(name)}")
    return ", ".join(out)


def header(bench: Bench, names: list[str], started: dt.datetime, seconds: float, redis: str) -> str:
    machine = _machine()
    sizes = bench.sizes
    env = ", ".join(f"`{k}={v}`" for k, v in BENCH_ENV.items())
    return f"""
Generated by `python -m bench{" --quick" if sizes.name == "quick" else ""}` on
{started:%Y-%m-%d %H:%M} UTC (commit {_commit()}), {sizes.name} sizes, measurements:
{", ".join(names)}; the run took {seconds / 60:.1f} min. Rerun it with `python -m bench`
(about 17 min on two cores; `--quick` for a smoke run, `--only`/`--skip` for a
subset).

## Setup

- **Machine:** {machine["cpu"]}, **{machine["cores"]} cores**, {machine["memory"]} RAM,
  {machine["os"]}, Python {machine["python"]}, Redis {redis} (our own `redis-server`,
  `--save "" --appendonly no`, started for the run{
        "" if bench.cluster.dedicated_redis else "; **shared**, see the caution in section 5"
    }).
- **Packages:** {_versions()}.
- **Processes**, each a real child process started as in the Procfile: Redis;
  `uvicorn api.main:app` (1, or 2 in the scale-out run); `python -m worker`
  (1, or 2); `uvicorn bench.baseline:app` (the baseline); the scripted upstream
  (`python -m bench.upstream`: `tests.support.upstream.ScriptedUpstream`, real HTTP and SSE on
  loopback); and the load generator (this process: uvloop, one raw HTTP/1.1 connection per
  stream, SSE split by hand, JSON parsed only after the run).
- **Settings:** defaults, except {env}; every process gets `REDIS_URL`,
  `OPENAI_BASE_URL` (the upstream), `OPENAI_API_KEY` and `BERNARD_QUEUE_NAME`.
- **Other load on the machine:** during the measured stretches
  ({bench.metered_s:.0f} s), processes outside the run used {bench.other_cpu_s:.0f} CPU-seconds
  ({100 * bench.other_cpu_s / max(bench.metered_s, 1):.0f} % of one core on average; it
  includes the synthetic writer of section 3 and processes that started and ended within a
  stretch). Each section's CPU lines give it as "everything else".
- **Two cores for everything.** The load generator, the upstream, Redis, the API, the worker
  and the baseline all share them, so every figure includes contention for CPU, and the
  pipeline (API + worker + Redis) has more processes competing than the baseline (one).
  Runs are paced to keep the box below saturation except where a measurement is about
  saturation (throughput, exactness).

## What the baseline is

`bench/baseline.py`: a FastAPI app served by uvicorn exactly like the API, with one route,
`POST /v1/chat/completions`. It validates the body with the API's own
`ChatCompletionRequest`, builds the `TurnContext` the worker builds (same `build_models`
`ChatOpenAI` models pointed at the same upstream, the worker's default tools), iterates
`worker.turn.turn_items` inside the request and encodes each event with the API's
`ChatEncoder` into the same `FrameResponse` (api/sse.py). No Redis, no turn record, no arq job, no
stream, no relay, and no conversation records (the pipeline's worker also records the
conversation in Redis; that is part of what it adds). Same client, same upstream, same
harness code: the difference is the pipeline.
"""


async def run(args: argparse.Namespace) -> int:
    if args.cluster:
        return await topology.run(args)
    names = selected(args)
    patched = (args.api_app, args.worker_settings) != (DEFAULT_API, DEFAULT_WORKER)
    sizes = Sizes.quick() if args.quick else Sizes.full()
    console = Console(stderr=True)
    workdir = Path(tempfile.mkdtemp(prefix="bernard-bench-"))
    ui = Ui(console)
    started = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    sections: list[Section] = []
    cluster = Cluster.create(workdir, args.redis_url, BENCH_ENV)
    cluster.api_target = args.api_app
    cluster.worker_target = args.worker_settings
    exit_code = 0
    output: Path | None = None
    try:
        with ui.progress:
            ui.log(f"work directory (logs): {workdir}")
            ui.log(f"Redis: {cluster.redis_url}")
            await cluster.start_upstream()
            await cluster.start_api()
            await cluster.start_worker()
            await cluster.start_baseline()
            redis = cluster.redis()
            info = await redis.info("server")
            await redis.config_resetstat()
            bench = Bench(cluster=cluster, redis=redis, sizes=sizes, ui=ui, workdir=workdir)
            # No full collection in this process or the upstream while a section measures:
            # each takes the one it held after every section (bench/gc_hold.py).
            hold_full_collections()
            ui.log(f"processes up in {time.monotonic() - t0:.1f} s; running {', '.join(names)}")
            for name in names:
                began = time.monotonic()
                failures = len(bench.failures)
                try:
                    section = await MEASUREMENTS[name](bench)
                except Exception:
                    exit_code = 1
                    ui.log(f"[red]{name} failed:\n{traceback.format_exc()}")
                    section = Section(name, f"{name} (failed)")
                    section.notes.append("```\n" + traceback.format_exc() + "\n```")
                    bench.failures.append(f"{name}: raised")
                section.seconds = time.monotonic() - began
                if len(bench.failures) > failures:
                    # Turns that failed (e.g. reaped as worker_lost) may still be running on
                    # their worker and would slow every later measurement down.
                    ui.log("[yellow]restarting the worker(s) before going on")
                    orphans = await cluster.restart_workers()
                    await warm_up(bench)
                    note = (
                        "_Turns failed in this measurement, so the benchmark then restarted "
                        "the worker processes (SIGKILL), since failed turns may still be "
                        "running on them"
                    )
                    if orphans:
                        note += (
                            f", and removed the {orphans} jobs of ended turns that the killed "
                            "workers left in arq's queue"
                        )
                    section.notes.append(note + "._")
                sections.append(section)
                await forget_exchanges(bench)
                collect_held()
                ui.log(f"{section.title}: done in {section.seconds:.0f} s")
                for verdict in section.verdicts:
                    mark = {True: "[green]met", False: "[red]missed", None: "[blue]—"}[verdict.met]
                    ui.log(f"  {verdict.target}: {verdict.measured} {mark}")
            await redis.aclose()
        # Report in the order of issue 5 (the Redis section runs last: it reads the others').
        order = {key: i for i, key in enumerate(REPORT_ORDER)}
        sections.sort(key=lambda section: order.get(section.key, len(order)))
        full_run = sizes.name == "full" and names == list(MEASUREMENTS) and not patched
        output = args.output or (
            ROOT / "docs" / "benchmarks.md" if full_run else workdir / "benchmarks.md"
        )
        text = header(
            bench, names, started, time.monotonic() - t0, str(info.get("redis_version", "?"))
        )
        if patched:
            text += (
                "\n**Not the stock processes:** the API ran `uvicorn "
                f"{args.api_app}` and the worker `arq {args.worker_settings}`.\n"
            )
        write(output, text, sections)
        console.print(f"report written to {output}")
        if bench.failures:
            exit_code = 1
            for failure in bench.failures:
                console.print(f"[red]{failure}")
    finally:
        cluster.stop_all()
        measurements.SHARED.costs.clear()
        report_in_workdir = output is not None and output.parent == workdir
        if not args.keep and exit_code == 0 and not report_in_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return exit_code


def main(argv: list[str] | None = None) -> None:
    """Entry point of `python -m bench`."""
    args = parse_args(argv)
    try:
        import uvloop

        code = uvloop.run(run(args))
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        code = asyncio.run(run(args))
    sys.exit(code)
