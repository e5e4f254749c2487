"""Cost per token: CPU per streamed token in each process, a burst against the
same load sent straight to the upstream, and where the CPU goes (py-spy)."""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Sequence

import orjson

from bench.flames import summarize
from bench.loads import forget_exchanges, load
from bench.measurements import capacity_step
from bench.paced import paced_rows
from bench.report import Section, Table, Verdict, ms, num
from bench.runner import (
    OTHER,
    Bench,
    Meter,
    Turn,
    check_all,
    drive,
    echo_directives,
    is_delta,
    wait_idle,
    wait_quiet,
)
from bench.stats import Summary, ratio

# Targets of issue 12.
WORKER_US_PER_TOKEN = 100
WORKER_TOKENS_PER_S = 10_000
API_US_PER_FRAME = 40
API_FRAMES_PER_S = 25_000
BURST_WALL_RATIO = 1.5
BURST_FIRST_TOKEN_RATIO = 3.0
_CORES = os.cpu_count() or 1


async def cost_per_token(bench: Bench) -> Section:
    sizes = bench.sizes
    runs = ", ".join(f"{s:,} × {short} and × {long}" for s, short, long in sizes.cost_runs)
    paced = ", ".join(
        f"{s:,} answers at {rate:g} tokens/s of {short} and of {long} tokens"
        for s, rate, short, long in sizes.paced_runs
    )
    section = Section(
        "cost",
        "8. Cost per token",
        intro=f"""
**CPU per token.** Turns through 1 API + 1 worker, the upstream sending as fast as it can,
all of a row's turns at once: {runs} tokens. Each row is run at two answer lengths: the
difference between them is what one more token costs (**marginal**), free of what a turn
costs whatever its length (router call, records, claims: **per turn**); **all-in** divides
the long run's CPU by its tokens (or frames). Frames for the API are the content frames the
client received: the worker joins the tokens that reach it together into one entry, so an
unpaced frame carries several tokens (frames/turn), and the API is judged per token. CPU is
each process's user + system time from /proc over the run.

**Paced tokens.** The upstream streams each answer at a model's pace (a token
every 20 ms at 50 tokens/s, every 100 ms at 10 tokens/s), the answers starting spread over
one token's time: {paced}. Each row runs its answers twice, short and long, at the same
pace and concurrency; **µs/token** and **commands/token** are the long run less the short
one, divided by the tokens it added: what a paced token costs each process and Redis, free
of what a turn costs whatever its length (the all-in column divides the long run's CPU by
its tokens, the turn's fixed work included). **Open at once** is how many answers were
streaming on average (short / long run): on two cores the turns' fixed work can spread the
starts out. **Tokens/frame** says how many tokens a content frame carried: 1.00 means each
token travelled alone; above it, the processes fell behind the pace and tokens that waited
went on together (cheaper per token, and no longer the case the row is about). Commands
are `INFO commandstats` (a script's own commands counted). A last run of the first row's
long answers under py-spy says where the API's and the worker's CPU goes (below).

**Burst.** {sizes.burst_streams} clients start {sizes.burst_tokens}-token answers at once,
the upstream sending a token every {sizes.burst_delay_ms:g} ms; the same load sent by the
same client straight to the upstream runs before and after it, and the ratios take the
faster of those two. The burst saturates both cores, so its CPU seconds move with the
box (runs of one commit on the shared box put the API at 1.3 to 2.6 s and the worker at
2.6 to 4.2 s): **content frames/turn** and **Redis commands/turn** count the work itself,
and say whether a change in CPU is the code's or the box's (fewer frames a turn means the
worker fell behind and joined tokens, which costs less).

**Relay fan-out.** {sizes.cost_fanout_streams:,} clients attached to turns whose tokens a
synthetic worker (`python -m bench.writer`) writes as fast as it can: what one API process
relays, with every stream checked.
""",
    )
    table = Table(
        [
            "streams",
            "tokens/turn",
            "worker µs/token marginal",
            "worker all-in",
            "worker ms/turn",
            "API µs/frame marginal",
            "API all-in",
            "API µs/token all-in",
            "frames/turn",
            "Redis µs/token marginal",
            "tokens/s",
            "exact",
        ],
        title="CPU per token, 1 API + 1 worker",
    )
    flames: dict[str, list[tuple[str, int]]] = {}
    # Of each run of the profiled row: worker all-in, API all-in (per frame), tokens/s, API
    # all-in per token.
    profiled_runs: list[tuple[float, float, float, float]] = []
    loads = [
        (streams, short_tokens, long_tokens, repeat, repeats)
        for streams, short_tokens, long_tokens in sizes.cost_runs
        for repeats in [sizes.cost_repeats if streams == sizes.cost_profiled_streams else 1]
        for repeat in range(repeats)
    ]
    for streams, short_tokens, long_tokens, repeat, repeats in loads:
        profiled_row = streams == sizes.cost_profiled_streams
        short, _ = await load(bench, streams, short_tokens)
        profile_dir = bench.workdir if profiled_row and repeat == 0 else None
        long, profiled = await load(bench, streams, long_tokens, profile_dir)
        flames.update(profiled)
        cells = []
        for role, per in (("worker", "token"), ("api", "frame"), ("redis", "token")):
            unit_long = long.tokens if per == "token" else long.frames
            unit_short = short.tokens if per == "token" else short.frames
            marginal = (long.cpu(bench, role) - short.cpu(bench, role)) / max(
                unit_long - unit_short, 1
            )
            all_in = long.cpu(bench, role) / max(unit_long, 1)
            cells.append((marginal * 1e6, all_in * 1e6))
        (worker_marginal, worker_all_in), (api_marginal, api_all_in), (redis_marginal, _) = cells
        api_per_token = long.cpu(bench, "api") / max(long.tokens, 1) * 1e6
        per_turn = (short.cpu(bench, "worker") - worker_marginal / 1e6 * short.tokens) / streams
        exact, _ = check_all([*short.turns, *long.turns])
        table.add(
            num(streams) + (f" (run {repeat + 1} of {repeats})" if repeats > 1 else ""),
            f"{short_tokens} / {long_tokens}",
            num(worker_marginal),
            num(worker_all_in),
            ms(per_turn * 1e3),
            num(api_marginal),
            num(api_all_in),
            num(api_per_token),
            f"{long.frames / max(len(long.turns), 1):.1f}",
            num(redis_marginal),
            num(long.tokens / long.seconds),
            f"{exact}/{len(short.turns) + len(long.turns)}",
        )
        if exact != len(short.turns) + len(long.turns):
            bench.failures.append(f"cost: {streams} streams lost exactness")
        if profiled_row:
            profiled_runs.append(
                (worker_all_in, api_all_in, long.tokens / long.seconds, api_per_token)
            )
    section.tables.append(table)
    worker_at_100, api_at_100, worker_rate, api_token_at_100 = (
        statistics.median(run[k] for run in profiled_runs) for k in range(4)
    )

    await paced_rows(bench, section)
    fanout = await _fanout(bench, section)
    burst = await _burst(bench, section)

    for role, samples in flames.items():
        packages, functions = summarize(samples)
        if packages:
            section.notes.append(
                f"Where the {role}'s CPU went in the {sizes.cost_profiled_streams}-stream long "
                f"run (py-spy, {sum(c for _, c in samples):,} samples; self time): by package "
                f"{', '.join(packages)}; busiest functions {', '.join(functions)}."
            )
    if not flames:
        section.notes.append("_py-spy is not installed here: no profile of where the CPU went._")

    streams = sizes.cost_profiled_streams
    per_core = 1e6 / worker_at_100 if worker_at_100 else math.nan
    if sizes.cost_repeats > 1:
        section.notes.append(
            f"The {streams}-stream row and the fan-out ran {sizes.cost_repeats} times each; "
            "their verdicts below take the median of the runs."
        )
    section.verdicts += [
        Verdict(
            f"worker ≤ {WORKER_US_PER_TOKEN} µs CPU per token (all-in) at {streams} turns",
            f"{num(worker_at_100)} µs",
            worker_at_100 <= WORKER_US_PER_TOKEN,
        ),
        Verdict(
            f"one worker core ≥ {WORKER_TOKENS_PER_S:,} tokens/s (1 / CPU per token; "
            f"measured rate on the shared box {num(worker_rate)}/s)",
            f"{num(per_core)}/s",
            per_core >= WORKER_TOKENS_PER_S,
        ),
        # The worker joins the tokens that arrive together into one entry, so an unpaced
        # frame carries many tokens and a turn's fixed API cost falls on few frames: per
        # frame is shown, per streamed token is judged.
        Verdict(
            f"API ≤ {API_US_PER_FRAME} µs CPU per relayed frame (all-in) at {streams} turns "
            "(shown: a frame carries the tokens that arrived together; judged per token below)",
            f"{num(api_at_100)} µs",
            None,
        ),
        Verdict(
            f"API ≤ {API_US_PER_FRAME} µs CPU per streamed token (all-in) at {streams} turns",
            f"{num(api_token_at_100)} µs",
            api_token_at_100 <= API_US_PER_FRAME,
        ),
        Verdict(
            f"one API process relays ≥ {API_FRAMES_PER_S:,} frames/s to "
            f"{sizes.cost_fanout_streams:,} streams, exact",
            f"{num(fanout)}/s",
            fanout >= API_FRAMES_PER_S,
        ),
        Verdict(
            f"burst: wall time ≤ {BURST_WALL_RATIO}× straight to the upstream",
            f"{burst[0]:.2f}×",
            burst[0] <= BURST_WALL_RATIO,
        ),
        Verdict(
            f"burst: first token p50 ≤ {BURST_FIRST_TOKEN_RATIO:g}× straight to the upstream",
            f"{burst[1]:.2f}×",
            burst[1] <= BURST_FIRST_TOKEN_RATIO,
        ),
    ]
    return section


async def _fanout(bench: Bench, section: Section) -> float:
    """Frames per second one API process relays to many streams (the median of
    `cost_repeats` runs; 0 if any lost exactness), and its CPU per frame."""
    streams = bench.sizes.cost_fanout_streams
    repeats = bench.sizes.cost_repeats
    table = Table(
        ["streams", "entries written/s", "frames delivered/s", "API µs/frame", "exact"],
        title="Relay fan-out, 1 API process, writer unthrottled",
    )
    rates = []
    for repeat in range(repeats):
        task = bench.ui.task(f"cost: relay to {streams:,} streams", 1)
        meter = Meter(bench)
        step = await capacity_step(
            bench.redis,
            bench.api,
            bench.cluster.redis_url,
            queue_url=bench.cluster.queue_url,
            streams=streams,
            rate=0,
            tokens=bench.sizes.cost_fanout_tokens,
            meter=meter,
        )
        bench.ui.done(task)
        delivered = step.delivered
        api_cpu = meter.cpu.get(bench.cluster.apis[0].name, math.nan)
        table.add(
            num(streams) + (f" (run {repeat + 1} of {repeats})" if repeats > 1 else ""),
            num(step.written),
            num(delivered),
            num(api_cpu / step.frames * 1e6 if step.frames else math.nan),
            f"{step.exact}/{len(step.turns)}",
        )
        if step.exact != len(step.turns):
            bench.failures.append("cost: relay fan-out lost exactness")
            delivered = 0.0
        rates.append(delivered)
    section.tables.append(table)
    return 0.0 if 0.0 in rates else statistics.median(rates)


async def _burst(bench: Bench, section: Section) -> tuple[float, float]:
    """Bernard vs straight to the upstream (the faster of two runs): wall-time ratio,
    first-token p50 ratio."""
    sizes = bench.sizes
    assert bench.cluster.upstream is not None
    table = Table(
        [
            "path",
            "turns",
            "wall s",
            "first token p50 ms",
            "p99 ms",
            "tokens/s",
            "content frames/turn",
            "Redis commands/turn",
            "exact",
        ],
        title=(
            f"Burst: {sizes.burst_streams} answers of {sizes.burst_tokens} tokens started at "
            f"once, a token every {sizes.burst_delay_ms:g} ms"
        ),
    )
    cpu = Table(
        [
            "path",
            "API",
            "worker",
            "Redis",
            "upstream",
            "client",
            "everything else",
            "total",
            f"total / {_CORES} cores",
        ],
        title=(
            "CPU seconds during each burst, by process: the last column is the shortest wall "
            "time this box could give that work"
        ),
    )
    # The same load straight to the upstream runs before and after Bernard's, and the
    # faster of the two is the reference: a moment the box stalls must not flatter Bernard.
    direct = ("straight to the upstream", bench.cluster.upstream.endpoint, "upstream")
    results: dict[str, list[tuple[float, Summary]]] = {"upstream": [], "pipeline": []}
    for label, endpoint, system in (
        (f"{direct[0]} (before)", *direct[1:]),
        ("Bernard (1 API + 1 worker)", bench.api, "pipeline"),
        (f"{direct[0]} (after)", *direct[1:]),
    ):
        directives = echo_directives(
            "burst", sizes.burst_streams, sizes.burst_tokens, sizes.burst_delay_ms
        )
        task = bench.ui.task(f"cost: burst, {label}", len(directives))
        await wait_quiet(bench)
        meter = await Meter(bench).start()
        started = time.monotonic()
        turns = await drive(
            [endpoint],
            directives,
            system=system,
            concurrency=len(directives),
            on_done=lambda _t, task=task: bench.ui.advance(task),  # type: ignore[misc]
        )
        seconds = time.monotonic() - started
        await meter.stop()
        bench.ui.done(task)
        cpu.add(label, *_burst_cpu(bench, meter))
        first = Summary.of(t.first_token_ms for t in turns)
        exact = _exact_count(turns) if system == "pipeline" else _complete_count(turns)
        table.add(
            label,
            len(turns),
            f"{seconds:.2f}",
            ms(first.median, 0),
            ms(first.p99, 0),
            num(len(turns) * sizes.burst_tokens / seconds),
            *(
                (f"{_frames(turns) / len(turns):.1f}", f"{meter.cost.total / len(turns):.1f}")
                if system == "pipeline"
                else ("—", "—")
            ),
            f"{exact}/{len(turns)}",
        )
        results[system].append((seconds, first))
        await wait_idle(bench)
        await forget_exchanges(bench)
    section.tables += [table, cpu]
    (pipeline_s, pipeline_first), *_ = results["pipeline"]
    direct_s = min(seconds for seconds, _ in results["upstream"])
    direct_first = min(first.median for _, first in results["upstream"])
    return ratio(pipeline_s, direct_s), ratio(pipeline_first.median, direct_first)


def _burst_cpu(bench: Bench, meter: Meter) -> list[str]:
    """The cells of one burst's CPU row (the baseline server idles through it: left out)."""
    cluster = bench.cluster
    assert cluster.upstream is not None
    names = [cluster.apis[0].name, cluster.workers[0].name, "redis", cluster.upstream.name]
    names += ["client", OTHER]
    seconds = [meter.cpu.get(name, 0.0) for name in names]
    total = sum(meter.cpu.values())
    return [f"{s:.2f}" for s in seconds] + [f"{total:.2f}", f"{total / _CORES:.2f}"]


def _frames(turns: Sequence[Turn]) -> int:
    """The content frames the turns' clients received (a frame may carry several tokens)."""
    return sum(1 for turn in turns for frame in turn.call.frames if is_delta(frame.data))


def _exact_count(turns: Sequence[Turn]) -> int:
    return check_all(turns)[0]


def _text(data: bytes) -> str:
    """The content of an upstream chunk ("" for the role, finish and usage chunks)."""
    if not data.startswith(b"{"):
        return ""
    choices = orjson.loads(data).get("choices") or []
    return str((choices[0].get("delta") or {}).get("content") or "") if choices else ""


def _complete_count(turns: Sequence[Turn]) -> int:
    """Straight from the upstream: streams that ended with `[DONE]` after every token."""
    done = 0
    for turn in turns:
        frames = turn.call.frames
        content = sum(1 for f in frames if _text(f.data))
        if frames and frames[-1].data == b"[DONE]" and content == turn.directive.tokens:
            done += 1
    return done
