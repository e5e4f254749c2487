"""The benchmark's measurements (and the worker-death figure), one function each.

Each takes the running `Bench` and returns a `Section` for the report. They share the run's
processes: one API, one worker, the baseline server and the upstream, unless a measurement
says otherwise (the scale-out measurement adds a second API and worker for its duration;
worker death kills and restarts workers).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import orjson
from redis.asyncio import Redis

from bench.client import Call, Endpoint, HttpError, connect, request, request_bytes
from bench.processes import ROOT, Cluster
from bench.report import (
    SUMMARY_HEADERS,
    Section,
    Table,
    Verdict,
    ms,
    num,
    signed,
    summary_cells,
)
from bench.runner import (
    Bench,
    Meter,
    RedisCost,
    Turn,
    check_all,
    drive,
    echo_directives,
    is_delta,
    new_tag,
    pickup_ms,
    relay_latencies,
    start_turn,
    wait_idle,
)
from bench.stats import Noise, Summary, ratio
from bench.upstream import Directive
from bench.writer import synthetic_tokens
from shared import keys
from shared.requests import AgentRequest, TurnRequest
from shared.settings import MODEL_ID
from shared.streams import STREAM_FIELD
from shared.turn_record import TurnRecord
from shared.turns import TurnStore


@dataclass
class CostSample:
    """Redis commands over one stretch of a run, with the turns and tokens it streamed."""

    label: str
    cost: RedisCost
    turns: int
    tokens: int


@dataclass
class Shared:
    """Figures one measurement leaves for another (the Redis section reads the others')."""

    costs: list[CostSample] = field(default_factory=list)
    memory_per_turn: tuple[float, int, int] | None = None  # bytes per turn, turns, tokens


SHARED = Shared()


def _added(pipeline: Summary, baseline: Summary) -> tuple[float, float]:
    return pipeline.median - baseline.median, pipeline.p99 - baseline.p99


def _exactness_note(label: str, turns: Sequence[Turn]) -> tuple[str, bool]:
    exact, problems = check_all(turns)
    text = f"{label}: {exact} of {len(turns)} streams exact."
    if problems:
        text += " Problems: " + "; ".join(problems)
    return text, exact == len(turns)


def _cpu_line(meter: Meter, tokens: int) -> str:
    """CPU seconds per process over the stretch, and per 1,000 tokens."""
    parts = [
        f"{name} {seconds:.2f} s ({seconds / tokens * 1e6:.0f} µs/token)"
        for name, seconds in sorted(meter.cpu.items(), key=lambda kv: -kv[1])
        if seconds >= 0.01 and tokens
    ]
    return f"CPU over {meter.cost.seconds:.1f} s of wall time: " + ", ".join(parts) + "."


# -- where the first-token time goes ---------------------------------------------------

_SEGMENTS = (
    ("request sent → turn stored (API: parse, validate, conversation)", "created"),
    ("turn stored → job started (enqueue, wake, pickup, claim)", "pickup"),
    ("job started → first model request reaches the upstream", "to_router"),
    ("two models: router call at the upstream (request in → answer out)", "router"),
    ("two models: router answer → response-model request reaches the upstream", "to_response"),
    ("upstream: request in → first token out", "upstream_first"),
    ("first token out → delta stamped by the worker (`at`)", "llm_client"),
    ("delta stamped → client receipt (XADD, XREAD, SSE)", "relay"),
    ("first token out → client receipt (baseline: LLM client + SSE)", "first_to_client"),
)


async def _exchange(bench: Bench, tag: str) -> dict[str, dict[str, float]]:
    assert bench.cluster.upstream is not None
    call = await request(bench.cluster.upstream.endpoint, "GET", f"/bench/exchange?tag={tag}")
    found = call.json()
    return found if isinstance(found, dict) else {}


async def breakdown(bench: Bench, turns: Sequence[Turn]) -> dict[str, list[float]]:
    """Per turn, the segments of its time to first token (ms), from every clock we have.

    Wall-clock stamps: the client's send, the turn record (`created_at`, `started_at`), the
    first delta entry's `at`, the client's receipt. Monotonic stamps from the upstream
    process (router and response-model requests) are moved onto the wall clock with this
    process's offset between the two clocks (both are system-wide on Linux). When the roles
    share a model, a turn's one call is the streamed one, and no router call is timed.
    """
    offset = time.time() - time.monotonic()
    out: dict[str, list[float]] = {key: [] for _, key in _SEGMENTS}
    for turn in turns:
        call = turn.call
        found = await _exchange(bench, turn.directive.tag)
        router, stream = found.get("router"), found.get("stream")
        if not stream or call.first_content_at is None:
            continue
        up_stream_in = stream["started_at"] + offset
        up_first = stream["first_chunk_at"] + offset
        received = call.first_content_at + offset
        segments = {
            "upstream_first": up_first - up_stream_in,
            "first_to_client": received - up_first,
        }
        up_router_in = up_stream_in
        if router:
            up_router_in = router["started_at"] + offset
            up_router_out = router["completed_at"] + offset
            segments["router"] = up_router_out - up_router_in
            segments["to_response"] = up_stream_in - up_router_out
        if turn.system == "pipeline":
            created, started = await bench.redis.hmget(  # type: ignore[misc]
                keys.turn(call.turn_id), ["created_at", "started_at"]
            )
            first_delta = None
            for _, fields in await bench.redis.xrange(keys.events(call.turn_id), count=50):
                body = orjson.loads(fields[STREAM_FIELD.encode()])
                if body["type"] == "delta":
                    first_delta = body["at"]
                    break
            if created is None or started is None or first_delta is None:
                continue
            segments |= {
                "created": float(created) - call.sent_wall,
                "pickup": float(started) - float(created),
                "to_router": up_router_in - float(started),
                "llm_client": first_delta - up_first,
                "relay": received - first_delta,
            }
        else:
            segments["created"] = up_router_in - call.sent_wall
        for key, value in segments.items():
            out[key].append(value * 1000)
    return out


def breakdown_table(parts: dict[str, dict[str, list[float]]]) -> Table:
    """Median of each segment, per system."""
    systems = list(parts)
    table = Table(
        ["segment", *(f"{s} median" for s in systems)],
        title="Where the time to first token goes, sequential turns (ms)",
    )
    for label, key in _SEGMENTS:
        cells = []
        for system in systems:
            values = parts[system].get(key) or []
            cells.append(ms(Summary.of(values).median) if values else "")
        if any(cells):
            if key == "created":
                label = label + " (baseline: → first model request reaches the upstream)"
            table.add(label, *cells)
    return table


def _ports_by_process(bench: Bench, cluster: Cluster | None = None) -> dict[str, str]:
    """Local TCP port → process name, for the run's processes, or `cluster`'s (from /proc)."""
    inodes: dict[str, str] = {}
    cluster = cluster or bench.cluster
    for service in [*cluster.apis, *cluster.workers, cluster.baseline, cluster.upstream]:
        if service is None or not service.alive:
            continue
        fd_dir = f"/proc/{service.pid}/fd"
        for fd in os.listdir(fd_dir):
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes[target[8:-1]] = service.name
    ports: dict[str, str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                port = str(int(fields[1].rsplit(":", 1)[1], 16))
                if fields[9] in inodes:
                    ports[port] = inodes[fields[9]]
    return ports


@dataclass(frozen=True)
class Seen:
    """One command MONITOR saw: when (wall clock), whose (a process of the run, `lua` for
    a script's, `?` for anyone else's) and what."""

    at: float
    who: str
    text: str


@contextlib.asynccontextmanager
async def monitored(bench: Bench) -> AsyncIterator[list[Seen]]:
    """Every Redis command of the run's Redis while the block runs (MONITOR), in the list
    it yields, filled as the block's work runs and complete once it exits."""
    monitor_client = bench.cluster.redis()
    raw: list[dict[str, object]] = []
    seen: list[Seen] = []

    async def listen() -> None:
        async with monitor_client.monitor() as monitor:
            async for command in monitor.listen():
                raw.append(command)

    listener = asyncio.create_task(listen())
    await asyncio.sleep(0.3)
    ports = _ports_by_process(bench)
    try:
        yield seen
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
        await monitor_client.aclose()
        for command in raw:
            who = ports.get(
                str(command.get("client_port", "")),
                "lua" if command.get("client_type") == "lua" else "?",
            )
            at = float(command["time"])  # type: ignore[arg-type]
            seen.append(Seen(at, who, str(command["command"])))


async def trace_turn(bench: Bench) -> str:
    """Every Redis command (MONITOR) from one turn's request to its first delta's XADD."""
    directive = Directive(tag=new_tag("trace"), tokens=5)
    async with monitored(bench) as seen:
        turn = await start_turn(bench.api, directive, "pipeline")
        await turn.call.finished
        await asyncio.sleep(0.3)
    sent = turn.call.sent_wall
    rows = []
    counts: dict[str, int] = {}
    for command in seen:
        if command.at < sent:
            continue
        if command.who != "lua":
            counts[command.who] = counts.get(command.who, 0) + 1
        text = command.text
        rows.append(
            f"| {(command.at - sent) * 1000:.2f} | {command.who} | "
            f"`{text[:90].replace('|', '/')}` |"
        )
        if text.startswith("XADD") and '"type":"delta"' in text:
            break
    received = (turn.call.first_content_at or turn.call.sent_at) - turn.call.sent_at
    summary = ", ".join(f"{who} {n}" for who, n in sorted(counts.items()))
    return "\n".join(
        [
            f"<details><summary>Redis commands between the request and the first delta of one "
            f"sequential turn (MONITOR; {summary}; the client got the first token "
            f"{received * 1000:.1f} ms after sending; MONITOR itself slows Redis down)"
            f"</summary>",
            "",
            "| ms after the request | process | command |",
            "|---|---|---|",
            *rows,
            "",
            "</details>",
        ]
    )


# -- 1. first-token overhead -------------------------------------------------------------


async def first_token(bench: Bench) -> Section:
    """Time to the first content frame, pipeline vs baseline, sequential and concurrent."""
    sizes = bench.sizes
    api, base = bench.api, bench.baseline
    warm = sizes.warmup
    # "responses": the same pipeline, through `POST /v1/responses` (its own line).
    for system, endpoint in (("pipeline", api), ("responses", api), ("baseline", base)):
        await drive(
            [endpoint], echo_directives("warm", warm, sizes.ft_tokens), system=system, concurrency=1
        )
    await wait_idle(bench)

    # Sequential: pipeline and baseline turns alternate, so drift hits both alike.
    task = bench.ui.task("first token: sequential", 3 * sizes.ft_sequential)
    seq: dict[str, list[Turn]] = {"pipeline": [], "responses": [], "baseline": []}
    meter = await Meter(bench).start()
    for i in range(sizes.ft_sequential):
        order = [("pipeline", api), ("responses", api), ("baseline", base)]
        order = order[i % 3 :] + order[: i % 3]
        for system, endpoint in order:
            directive = Directive(tag=new_tag("fts"), tokens=sizes.ft_tokens)
            turn = await start_turn(endpoint, directive, system)
            await turn.call.finished
            seq[system].append(turn)
            bench.ui.advance(task)
    await meter.stop()
    bench.ui.done(task)
    SHARED.costs.append(
        CostSample(
            f"sequential turns, {sizes.ft_tokens} tokens unpaced, chat and Responses "
            "(baseline turns interleaved)",
            meter.cost,
            # Both pipeline lines' turns ran on this Redis while it was metered.
            2 * sizes.ft_sequential,
            2 * sizes.ft_sequential * sizes.ft_tokens,
        )
    )
    seq_pickup = await pickup_ms(bench.redis, seq["pipeline"])
    parts = {system: await breakdown(bench, seq[system]) for system in ("pipeline", "baseline")}
    trace = await trace_turn(bench)

    # Concurrent: blocks of each system in turn, twice, starts spread over one turn's length.
    conc: dict[str, list[Turn]] = {"pipeline": [], "responses": [], "baseline": []}
    delay = sizes.ft_concurrent_delay_ms
    ctokens = sizes.ft_concurrent_tokens
    turn_s = ctokens * delay / 1000
    half = max(sizes.ft_concurrent_turns // 2, sizes.ft_concurrency)
    task = bench.ui.task(f"first token: {sizes.ft_concurrency} concurrent", 6 * half)
    conc_meter: Meter | None = None
    cpu_lines = []
    for block in range(2):
        order = [("pipeline", api), ("responses", api), ("baseline", base)]
        if block:
            order.reverse()
        for system, endpoint in order:
            directives = echo_directives("ftc", half, ctokens, delay)
            meter = await Meter(bench).start()
            turns = await drive(
                [endpoint],
                directives,
                system=system,
                concurrency=sizes.ft_concurrency,
                stagger_s=turn_s,
                on_done=lambda _t: bench.ui.advance(task),
            )
            await meter.stop()
            conc[system] += turns
            if block == 0:
                cpu_lines.append(f"{system}: " + _cpu_line(meter, len(turns) * ctokens))
            if system == "pipeline" and conc_meter is None:
                conc_meter = meter
            await wait_idle(bench)
    bench.ui.done(task)
    if conc_meter is not None:
        SHARED.costs.append(
            CostSample(
                f"{sizes.ft_concurrency} concurrent turns, {ctokens} tokens every {delay:g} ms",
                conc_meter.cost,
                half,
                half * ctokens,
            )
        )
    conc_pickup = await pickup_ms(bench.redis, conc["pipeline"])

    section = Section(
        "first-token",
        "1. First-token overhead",
        intro=f"""
Client-observed time from sending `POST /v1/chat/completions` (`stream: true`, connection
already open) to receiving the first SSE frame with non-empty `delta.content`. Both roles
are one model (the default), so every turn makes one streamed model call, whose text is the
answer.
**Pipeline**: `uvicorn api.main:app` → Redis → `python -m worker` → stream →
API. **Baseline**: `uvicorn bench.baseline:app`, the same turn (`worker.turn.turn_items`)
run inside the request, no queue, no stream (see "What the baseline is" below).
Sequential: {sizes.ft_sequential} turns each of {sizes.ft_tokens} tokens sent as fast as the
upstream can, chat, Responses and baseline in turn (each round starting one later).
Concurrent: {sizes.ft_concurrency} client loops per system, {2 * half} turns per system in
two blocks, each turn streaming {ctokens} tokens {delay:g} ms apart (so about
{sizes.ft_concurrency} streams are live at all times, {sizes.ft_concurrency * 1000 / delay:.0f}
tokens/s in all, well below what the box can stream), loop starts
spread over one turn's length. **Responses**: the pipeline again,
through `POST /v1/responses` (`stream: true`), to the first `response.output_text.delta`
event, interleaved with the other two. Its line is within noise of the chat line when its
median is no higher than the chat line's plus the noise: how far either line's median moved
within the run, the larger of the two lines' differences between the medians of their
turns' first and second half (sequential: in the order sent; concurrent: their two blocks),
at least 1 ms. A Responses median lower by more than that passes, and is noted. All figures
in ms.
""",
    )
    table = Table(["run", "system", *SUMMARY_HEADERS], title="Time to first content frame (ms)")
    delta_table = Table(
        ["run", "added at median", "added at p99", "ratio of medians", "ratio of p99s"],
        title="Pipeline minus baseline",
    )
    exact_notes = []
    all_exact = True
    for label, runs in (("sequential", seq), (f"{sizes.ft_concurrency} concurrent", conc)):
        summaries = {s: Summary.of(t.first_token_ms for t in runs[s]) for s in runs}
        for system in ("pipeline", "responses", "baseline"):
            table.add(label, system, *summary_cells(summaries[system]))
        for system, named in (("pipeline", label), ("responses", f"{label}, Responses")):
            added_median, added_p99 = _added(summaries[system], summaries["baseline"])
            delta_table.add(
                named,
                signed(added_median),
                signed(added_p99),
                f"{ratio(summaries[system].median, summaries['baseline'].median):.2f}",
                f"{ratio(summaries[system].p99, summaries['baseline'].p99):.2f}",
            )
            section.verdicts += [
                Verdict(
                    f"{named}: adds < 5 ms at the median",
                    f"{signed(added_median)} ms",
                    added_median < 5,
                ),
                Verdict(f"{named}: adds < 20 ms at p99", f"{signed(added_p99)} ms", added_p99 < 20),
            ]
        chat, responses = (
            [t.first_token_ms for t in runs[system]] for system in ("pipeline", "responses")
        )
        noise = Noise.of(
            (responses[: len(responses) // 2], responses[len(responses) // 2 :]),
            (chat[: len(chat) // 2], chat[len(chat) // 2 :]),
        )
        halves = " / ".join(ms(m, 1) for m in noise.halves)
        section.verdicts.append(
            Verdict(
                f"{label}: Responses first token within noise of the chat line",
                f"{signed(noise.difference)} ms at the median (noise {ms(noise.noise)} ms; "
                f"halves' medians Responses, chat: {halves})",
                noise.within,
            )
        )
        if noise.below:
            section.notes.append(
                f"{label}: the Responses median is {-noise.difference:.2f} ms below the chat "
                f"line's, more than its noise ({ms(noise.noise)} ms)."
            )
        for system in ("pipeline", "responses", "baseline"):
            note, ok = _exactness_note(f"{label} {system}", runs[system])
            exact_notes.append(note)
            all_exact = all_exact and ok
    pickup_table = Table(["run", *SUMMARY_HEADERS], title="Enqueue → job start (ms)")
    seq_summary = Summary.of(seq_pickup)
    pickup_table.add("sequential (idle worker)", *summary_cells(seq_summary))
    pickup_table.add(f"{sizes.ft_concurrency} concurrent", *summary_cells(Summary.of(conc_pickup)))
    section.tables += [table, delta_table, breakdown_table(parts), pickup_table]
    section.verdicts.append(
        Verdict(
            "enqueue → start p50 < 5 ms, idle worker",
            f"{ms(seq_summary.median)} ms",
            seq_summary.median < 5,
        )
    )
    section.notes.append(trace)
    section.notes += [
        "Enqueue → job start is `started_at − created_at` of each turn record: the API stamps "
        "`created_at` just before it stores the turn and enqueues the job (so the figure "
        "includes storing, enqueueing and the wake-up push), the worker stamps `started_at` "
        "in the claim script when the job runs.",
        "CPU per process in the first concurrent block: " + " ".join(cpu_lines),
        " ".join(exact_notes),
    ]
    if not all_exact:
        bench.failures.append("first-token: some streams were not exact")
    return section


# -- 2. per-frame relay latency ---------------------------------------------------------


async def relay(bench: Bench) -> Section:
    """XADD → client receipt per content frame at 1, 100, 1000 concurrent streams."""
    sizes = bench.sizes
    section = Section(
        "relay",
        "2. Per-frame relay latency",
        intro="""
For every content frame: the client's receipt time (wall clock, taken once per TCP read)
minus the `at` the worker stamped into the stream entry when it wrote it (`shared.events.
encode`, called right before the `XADD`). The client finds the entry by the frame's SSE id
and reads `at` back from Redis after the run. For the baseline the same figure is "event
yielded by `turn_items` → client receipt" (the yield time travels in the frame's id).
Token pacing keeps the whole box below its token capacity (see section 3): the aggregate
offered rate is the same at 100 and 1,000 streams. All figures in ms.
""",
    )
    table = Table(
        ["streams", "system", "tokens/stream", "pace", "frames", *SUMMARY_HEADERS[1:]],
        title="Worker XADD → client receipt, per content frame (ms)",
    )
    split = Table(
        ["streams", "`at` → XADD executed: p50 / p99", "XADD executed → client: p50 / p99"],
        title="The same latency split where Redis executed the XADD (ms, ±1 ms: entry ids "
        "carry milliseconds)",
    )
    notes = []
    p99_at_100: float | None = None
    summaries: dict[tuple[int, str], Summary] = {}
    for scale in sizes.relay_scales:
        tokens = sizes.relay_tokens[scale]
        delay = sizes.relay_delay_ms[scale]
        count = sizes.relay_rounds_single if scale == 1 else scale
        systems = [("pipeline", bench.api)]
        if scale in sizes.relay_baseline_scales:
            systems.append(("baseline", bench.baseline))
        for system, endpoint in systems:
            task = bench.ui.task(f"relay: {scale} streams, {system}", count)
            directives = echo_directives(f"rl{scale}", count, tokens, delay)
            meter = await Meter(bench).start()
            turns = await drive(
                [endpoint],
                directives,
                system=system,
                concurrency=scale,
                stagger_s=delay / 1000 if scale > 1 else 0,
                on_done=lambda _t, task=task: bench.ui.advance(task),  # type: ignore[misc]
            )
            await meter.stop()
            bench.ui.done(task)
            latencies = await relay_latencies(bench.redis, turns)
            summary = Summary.of(latencies.total)
            summaries[(scale, system)] = summary
            if latencies.to_redis:
                to_redis = Summary.of(latencies.to_redis)
                from_redis = Summary.of(latencies.from_redis)
                split.add(
                    scale,
                    f"{ms(to_redis.median, 1)} / {ms(to_redis.p99, 1)}",
                    f"{ms(from_redis.median, 1)} / {ms(from_redis.p99, 1)}",
                )
            table.add(
                scale,
                system,
                tokens,
                f"{delay:g} ms",
                summary.n,
                *summary_cells(summary)[1:],
            )
            note, ok = _exactness_note(f"{scale} streams {system}", turns)
            if not ok:
                bench.failures.append(f"relay: {note}")
            notes.append(note + " " + _cpu_line(meter, count * tokens))
            if system == "pipeline":
                SHARED.costs.append(
                    CostSample(
                        f"{scale} concurrent stream{'s' if scale > 1 else ''}, {tokens} tokens "
                        f"every {delay:g} ms",
                        meter.cost,
                        count,
                        count * tokens,
                    )
                )
                if scale == 100:
                    p99_at_100 = summary.p99
            await wait_idle(bench)
    versus = Table(
        ["streams", "pipeline − baseline: median / p99", "ratio of medians / of p99s"],
        title="Pipeline against the baseline at the same load (ms)",
    )
    for (scale, system), summary in summaries.items():
        base = summaries.get((scale, "baseline"))
        if system == "pipeline" and base is not None:
            versus.add(
                scale,
                f"{signed(summary.median - base.median)} / {signed(summary.p99 - base.p99)}",
                f"{ratio(summary.median, base.median):.1f} / {ratio(summary.p99, base.p99):.1f}",
            )
    section.tables += [table, versus, split]
    section.notes += notes
    if p99_at_100 is not None:
        section.verdicts.append(
            Verdict("p99 < 2 ms at 100 streams", f"{ms(p99_at_100)} ms", p99_at_100 < 2)
        )
    return section


# -- 3. throughput and scale -------------------------------------------------------------


async def _synthetic_turns(redis: Redis, count: int) -> list[str]:
    """Turn records and streams created the way the API creates them, with no job enqueued."""
    store = TurnStore(redis, retention_s=3600, stream_maxlen=10_000)
    ids = []
    for _ in range(count):
        record = TurnRecord(
            id=new_tag("cap") + os.urandom(4).hex(),
            owner="local",
            request=TurnRequest(AgentRequest([{"role": "user", "content": "relay"}])),
            model=MODEL_ID,
        )
        await store.create(record, ttl_s=3600, queue_name=None)
        ids.append(record.id)
    return ids


async def _run_writer(spec: dict[str, object]) -> dict[str, float]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.writer",
        cwd=ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate(orjson.dumps(spec))
    result: dict[str, float] = orjson.loads(out)
    return result


class Metering(Protocol):
    """What counts a capacity step's cost while the writer runs (bench/runner.py Meter,
    bench/topology.py's meter of each server)."""

    async def start(self) -> object: ...

    async def stop(self) -> object: ...


def capacity_tokens(rate: int, fastest: float, step_s: float, streams: int) -> int:
    """Tokens per stream for a step of `step_s` seconds at `rate` entries/s (0: as fast as
    the writer can). The unthrottled step is sized from what the API delivered so far
    (`fastest` frames/s), to last the same."""
    nominal = rate or max(fastest * 1.5, 4000)
    return max(20, int(nominal * step_s / streams))


def kept_up(
    *, offered: float, written: float, delivered: float, p99_ms: float, exact: int, streams: int
) -> bool:
    """Whether the API kept up with a step: delivered ≥ 95 % of what was written (of the
    offered rate, if the writer outran it), p99 latency < 100 ms, every stream exact."""
    return (
        delivered >= 0.95 * min(written, offered or written) and p99_ms < 100 and exact == streams
    )


@dataclass(frozen=True, slots=True)
class CapacityStep:
    """One step of the relay capacity measurement: what was written, what was relayed."""

    turns: list[Turn]
    offered: int  # entries/s asked of the writer (0: as fast as it can)
    seconds: float  # the writer's, first entry to last
    written: float  # entries/s
    frames: int  # delta frames the clients received
    delivered: float  # frames/s, first frame to last
    latency: Summary  # ms, entry written → frame received
    exact: int  # streams received token for token

    @property
    def kept_up(self) -> bool:
        return kept_up(
            offered=self.offered,
            written=self.written,
            delivered=self.delivered,
            p99_ms=self.latency.p99,
            exact=self.exact,
            streams=len(self.turns),
        )


async def capacity_step(
    redis: Redis,
    api: Endpoint,
    redis_url: str,
    *,
    queue_url: str,
    streams: int,
    rate: int,
    tokens: int,
    meter: Metering,
) -> CapacityStep:
    """`streams` clients attached to synthetic turns, then the writer appends `tokens` to
    each at `rate` entries/s; `meter` runs while it writes. `redis_url` is the data role's,
    `queue_url` the queue role's (where the turns' ends are released)."""
    ids = await _synthetic_turns(redis, streams)
    calls: list[Call] = []
    for turn_id in ids:
        call = await connect(api)
        call.send(request_bytes(api, "GET", f"/v1/turns/{turn_id}/events"))
        calls.append(call)
    # Every client must be attached (it has the `start` frame) before the writer begins.
    await asyncio.wait_for(asyncio.gather(*(c.first_frame for c in calls)), 30)
    await meter.start()
    written = await _run_writer(
        {
            "redis_url": redis_url,
            "queue_url": queue_url,
            "turn_ids": ids,
            "tokens": tokens,
            "rate": rate,
            "maxlen": 10_000,
            "retention_s": 3600,
        }
    )
    await asyncio.wait_for(asyncio.gather(*(c.finished for c in calls)), 120)
    await meter.stop()
    turns = [
        Turn(Directive(tag=i), c, "pipeline", expected=synthetic_tokens(i, tokens))
        for i, c in zip(ids, calls, strict=True)
    ]
    frames = [f for t in turns for f in t.call.frames if is_delta(f.data)]
    span = max(f.wall for f in frames) - min(f.wall for f in frames) if frames else 0.0
    seconds = written["ended"] - written["started"]
    exact, _ = check_all(turns)
    return CapacityStep(
        turns=turns,
        offered=rate,
        seconds=seconds,
        written=written["entries"] / max(seconds, 1e-9),
        frames=len(frames),
        delivered=len(frames) / span if span > 0 else math.nan,
        latency=Summary.of((await relay_latencies(redis, turns)).total),
        exact=exact,
    )


async def throughput(bench: Bench) -> Section:
    """The API's relay capacity alone, then end to end: 1 + 1 vs 2 + 2 processes."""
    sizes = bench.sizes
    section = Section(
        "throughput",
        "3. Throughput and scale",
        intro=f"""
**Relay capacity of one API process.** {sizes.capacity_streams} clients attach to
`GET /v1/turns/{{id}}/events` of turns created the way the API creates them; a synthetic
worker (`python -m bench.writer`) appends one stream entry per token, encoded exactly as
the worker encodes them, at a fixed offered rate (0 = as fast as it can), then ends each
turn with the worker's own `TurnStore.finish`. No LLM client is in the loop, so what limits
the rate is the API process (and the client and Redis sharing the two cores with it).
Each step runs about {sizes.capacity_step_s:g} s. "Kept up" = delivered ≥ 95 % of what was
written, p99 latency < 100 ms, and every stream exact.

**End to end, 1 + 1 vs 2 + 2.** {sizes.scale_streams} concurrent turns of
{sizes.scale_tokens} tokens each, the upstream sending as fast as it can, through 1 API + 1
worker, then 2 APIs + 2 workers (clients alternate between the APIs) against the same
Redis; and the same load on the baseline server.
""",
    )
    cap = Table(
        [
            "offered entries/s",
            "written/s",
            "delivered frames/s",
            "p50 ms",
            "p99 ms",
            "API CPU µs/frame",
            "exact",
            "kept up",
        ],
        title=f"Relay capacity, 1 API process, {sizes.capacity_streams} streams",
    )
    best = 0.0
    task = bench.ui.task("throughput: relay capacity", len(sizes.capacity_rates))
    fastest = 0.0
    for rate in sizes.capacity_rates:
        tokens = capacity_tokens(rate, fastest, sizes.capacity_step_s, sizes.capacity_streams)
        meter = Meter(bench)
        step = await capacity_step(
            bench.redis,
            bench.api,
            bench.cluster.redis_url,
            queue_url=bench.cluster.queue_url,
            streams=sizes.capacity_streams,
            rate=rate,
            tokens=tokens,
            meter=meter,
        )
        api_cpu = meter.cpu.get(bench.cluster.apis[0].name, math.nan)
        per_frame = api_cpu / step.frames * 1e6 if step.frames else math.nan
        if step.kept_up:
            best = max(best, step.delivered)
        if not math.isnan(step.delivered):
            fastest = max(fastest, step.delivered)
        cap.add(
            num(rate) if rate else "max",
            num(step.written),
            num(step.delivered),
            ms(step.latency.median),
            ms(step.latency.p99),
            num(per_frame),
            f"{step.exact}/{len(step.turns)}",
            "yes" if step.kept_up else "no",
        )
        if step.exact != len(step.turns):
            bench.failures.append(f"throughput: relay capacity at {rate}/s lost exactness")
        bench.ui.advance(task)
    bench.ui.done(task)
    section.tables.append(cap)
    section.notes.append(
        f"Most frames per second one API process relayed while keeping up with every "
        f"stream exact: **{num(best)}**."
    )

    scale = Table(
        ["setup", "turns", "tokens/s", "frames/s", "first token p50 ms", "p99 ms", "exact"],
        title=f"End to end, {sizes.scale_streams} concurrent turns × {sizes.scale_tokens} tokens",
    )
    rates: dict[str, float] = {}
    cpu_notes = []
    for label, apis, workers in (
        ("baseline (1 process)", 0, 0),
        ("1 API + 1 worker", 1, 1),
        ("2 APIs + 2 workers", 2, 2),
    ):
        if apis:
            await bench.cluster.scale(apis, workers)
            endpoints = [s.endpoint for s in bench.cluster.apis]
            system = "pipeline"
        else:
            endpoints = [bench.baseline]
            system = "baseline"
        directives = echo_directives("sc", sizes.scale_streams, sizes.scale_tokens)
        task = bench.ui.task(f"throughput: {label}", len(directives))
        meter = await Meter(bench).start()
        started = time.monotonic()
        turns = await drive(
            endpoints,
            directives,
            system=system,
            concurrency=sizes.scale_streams,
            on_done=lambda _t, task=task: bench.ui.advance(task),  # type: ignore[misc]
        )
        elapsed = time.monotonic() - started
        await meter.stop()
        bench.ui.done(task)
        streamed = len(turns) * sizes.scale_tokens
        frame_count = sum(len(t.call.frames) for t in turns)
        rates[label] = streamed / elapsed
        first_token_ms = Summary.of(t.first_token_ms for t in turns)
        exact, _ = check_all(turns)
        scale.add(
            label,
            len(turns),
            num(streamed / elapsed),
            num(frame_count / elapsed),
            ms(first_token_ms.median, 0),
            ms(first_token_ms.p99, 0),
            f"{exact}/{len(turns)}",
        )
        cpu_notes.append(f"{label}: " + _cpu_line(meter, streamed))
        await wait_idle(bench)
    await bench.cluster.scale(1, 1)
    section.tables.append(scale)
    two = ratio(rates["2 APIs + 2 workers"], rates["1 API + 1 worker"])
    vs_base = ratio(rates["1 API + 1 worker"], rates["baseline (1 process)"])
    section.notes += [
        f"2 + 2 vs 1 + 1: **{two:.2f}×** the tokens per second. 1 + 1 vs the baseline: "
        f"**{vs_base:.2f}×**.",
        "CPU per process: " + " ".join(cpu_notes),
    ]
    section.verdicts.append(Verdict("2 + 2 vs 1 + 1 (reported as a ratio)", f"{two:.2f}×", None))
    return section


# -- 4. exactness under load --------------------------------------------------------------


async def exactness(bench: Bench) -> Section:
    """Many concurrent streams, every one checked token by token."""
    sizes = bench.sizes
    n, tokens = sizes.exact_streams, sizes.exact_tokens
    await wait_idle(bench)
    info_before = await bench.redis.info("memory")
    directives = echo_directives("ex", n, tokens)
    task = bench.ui.task(f"exactness: {n} streams × {tokens} tokens", n)
    meter = await Meter(bench).start()
    started = time.monotonic()
    turns = await drive(
        [bench.api],
        directives,
        system="pipeline",
        concurrency=n,
        on_done=lambda _t: bench.ui.advance(task),
    )
    elapsed = time.monotonic() - started
    await meter.stop()
    bench.ui.done(task)
    await wait_idle(bench)
    info_after = await bench.redis.info("memory")
    SHARED.memory_per_turn = (
        (int(info_after["used_memory"]) - int(info_before["used_memory"])) / n,
        n,
        tokens,
    )
    SHARED.costs.append(
        CostSample(f"{n} concurrent turns, {tokens} tokens unpaced", meter.cost, n, n * tokens)
    )
    exact, problems = check_all(turns)
    frames = sum(len(t.call.frames) for t in turns)
    first = Summary.of(t.first_token_ms for t in turns)
    table = Table(
        [
            "streams",
            "tokens each",
            "exact",
            "frames",
            "seconds",
            "tokens/s",
            "first token p50 / p99 ms",
        ]
    )
    table.add(
        n,
        tokens,
        f"{exact}/{n}",
        num(frames),
        f"{elapsed:.1f}",
        num(n * tokens / elapsed),
        f"{ms(first.median, 0)} / {ms(first.p99, 0)}",
    )
    section = Section(
        "exactness",
        "4. Exactness under load",
        intro=f"""
{n} turns started at once through 1 API + 1 worker, each streaming {tokens} tokens from the
upstream as fast as it sends them. Each client stream is checked after the run: HTTP 200,
the role frame first, content frames that are runs of whole tokens which, in order, are
exactly the tokens the upstream sent for that turn (no loss, no duplicate, no reordering),
one `stop` finish frame after all content, `[DONE]` exactly once and last, SSE ids
strictly increasing. The writer joins deltas that pile up while an `XADD` is in flight,
so there are fewer frames than tokens; the check is per token all the same. The 100-stream
version runs in the test suite (`tests/test_exactness.py`).
""",
        tables=[table],
    )
    section.notes.append(_cpu_line(meter, n * tokens))
    if problems:
        section.notes.append("Problems: " + "; ".join(problems))
        bench.failures.append(f"exactness: {n - exact} streams not exact")
    section.verdicts.append(
        Verdict(f"{n} × {tokens} tokens all exact", f"{exact}/{n} exact", exact == n)
    )
    return section


# -- 5. Redis cost ------------------------------------------------------------------------


async def redis_cost(bench: Bench) -> Section:
    """Commands per turn and per token from INFO commandstats, and memory per turn."""
    section = Section(
        "redis",
        "5. Redis cost",
        intro="""
Commands Redis executed (`INFO commandstats`, which also counts the commands that Lua
scripts run) over each stretch of the other measurements, divided by the turns and by the
upstream tokens streamed in it. "All told": every command of every process (API, worker,
arq's own bookkeeping, liveness renewals, the reapers, keepalives), with nothing but Bernard
on this Redis. Idle is measured with 1 API + 1 worker and no turns.
""",
    )
    if not bench.cluster.dedicated_redis:
        section.notes.append(
            "**Caution:** this run used a shared Redis (`--redis-url`), so other clients' "
            "commands may be counted."
        )
    idle = await Meter(bench).start()
    await asyncio.sleep(5)
    await idle.stop()
    idle_table = Table(["command", "per second"], title="Idle, 1 API + 1 worker (5 s)")
    for name, calls in sorted(idle.cost.commands.items(), key=lambda kv: -kv[1]):
        idle_table.add(name, f"{calls / idle.cost.seconds:.1f}")
    idle_table.add("**total**", f"**{idle.cost.total / idle.cost.seconds:.1f}**")

    own = 20 if bench.sizes.name == "full" else 5
    for tokens, label in ((1, "1 token"), (200, "200 tokens unpaced")):
        await wait_idle(bench)
        meter = await Meter(bench).start()
        await drive(
            [bench.api], echo_directives("rc", own, tokens), system="pipeline", concurrency=1
        )
        await wait_idle(bench)
        await meter.stop()
        SHARED.costs.insert(
            0, CostSample(f"sequential turns of {label}", meter.cost, own, own * tokens)
        )
    table = Table(
        [
            "stretch",
            "turns",
            "tokens",
            "commands",
            "per turn",
            "per token",
            "per token beyond a turn's fixed cost",
            "top commands (per token)",
        ],
        title="Commands, all told",
    )
    fixed = next(
        (c.cost.total / c.turns for c in SHARED.costs if c.tokens == c.turns), float("nan")
    )
    for sample in SHARED.costs:
        per_token = sample.cost.total / sample.tokens
        ranked = sorted(sample.cost.commands.items(), key=lambda kv: -kv[1])
        if sample.tokens == sample.turns:  # the 1-token turns: the fixed cost of a turn
            table.add(
                sample.label + " (≈ the fixed cost of a turn)",
                sample.turns,
                num(sample.tokens),
                num(sample.cost.total),
                num(sample.cost.total / sample.turns, 1),
                "",
                "",
                ", ".join(f"{k} {v / sample.turns:.1f}" for k, v in ranked[:10]) + " (per turn)",
            )
            continue
        beyond = (sample.cost.total - fixed * sample.turns) / sample.tokens
        table.add(
            sample.label,
            sample.turns,
            num(sample.tokens),
            num(sample.cost.total),
            num(sample.cost.total / sample.turns, 1),
            f"**{per_token:.2f}**",
            f"{beyond:.2f}",
            ", ".join(f"{k} {v / sample.tokens:.2f}" for k, v in ranked[:6]),
        )
        long_turns = sample.tokens / sample.turns >= 100
        section.verdicts.append(
            Verdict(
                f"≤ 1.2 commands per token: {sample.label}"
                + ("" if long_turns else " (short turns: shown, not judged)"),
                f"{per_token:.2f}",
                per_token <= 1.2 if long_turns else None,
            )
        )
    section.tables += [table, idle_table]
    section.notes.append(
        "A turn costs a fixed number of commands whatever its length (creating, enqueueing, "
        "claiming, recording and finishing it; arq's own bookkeeping), so stretches of short "
        'turns are shown but judged only where turns have at least 100 tokens. "Beyond a '
        "turn's fixed cost\" subtracts the 1-token turns' per-turn figure. A paced stream "
        "cannot coalesce: each token is one `XADD` by the worker and, when its hub lane's reader "
        "is waiting, one `XREAD` by the API that wakes for it."
    )
    section.tables.append(await _bytes_per_turn(bench))
    if SHARED.memory_per_turn is not None:
        per_turn, turns, tokens = SHARED.memory_per_turn
        sample_keys = await _turn_memory_breakdown(bench)
        mem = Table(["", "bytes"], title="Redis memory per retained turn")
        mem.add(f"`used_memory` growth / turn ({turns} turns × {tokens} tokens)", num(per_turn))
        for name, size in sample_keys:
            mem.add(f"one turn: {name}", num(size))
        section.tables.append(mem)
    return section


# A 10-message conversation's earlier messages: questions and answers of everyday length.
_EARLIER = [
    {
        "role": "user" if k % 2 == 0 else "assistant",
        "content": " ".join(f"word{k}_{i}" for i in range(12 if k % 2 == 0 else 40)),
    }
    for k in range(9)
]


async def _bytes_per_turn(bench: Bench) -> Table:
    """`MEMORY USAGE` of everything one turn leaves in Redis, for three kinds of turn."""
    kinds = [
        ("short turn: one question, a 20-token answer", 20, [], {}),
        ("10-message conversation, a 100-token answer", 100, _EARLIER, {}),
        (
            "the same, traced (`stream_options.trace`)",
            100,
            _EARLIER,
            {"stream_options": {"trace": True}},
        ),
    ]
    table = Table(
        ["turn", "turn record", "event stream", "conversation", "**total**"],
        title="Redis bytes one finished turn leaves (`MEMORY USAGE`, kept for the retention)",
    )
    for label, tokens, earlier, extra in kinds:
        directive = Directive(tag=new_tag("bytes"), tokens=tokens)
        question = {"role": "user", "content": directive.message()}
        body = {"model": MODEL_ID, "messages": [*earlier, question], "stream": True, **extra}
        call = await request(bench.api, "POST", "/v1/chat/completions", body)
        sizes = await _turn_bytes(bench, call.turn_id)
        table.add(label, *(num(size) for size in sizes), f"**{num(sum(sizes))}**")
    return table


async def _turn_keys(bench: Bench, turn_id: str) -> tuple[dict[str, str], dict[str, str]]:
    """The keys one finished turn leaves, by name: its own, and its conversation's (none
    for a turn outside a conversation)."""
    own = {"turn hash": keys.turn(turn_id), "event stream": keys.events(turn_id)}
    conversation, owner = await bench.redis.hmget(keys.turn(turn_id), ["conversation_id", "owner"])  # type: ignore[misc]
    if not (conversation and owner):
        return own, {}
    cid, user = conversation.decode(), owner.decode()
    return own, {
        "conversation hash": keys.conversation(user, cid),
        "conversation messages": keys.conversation_messages(user, cid),
        "conversation calls": keys.conversation_calls(user, cid),
    }


async def _memory_usage(bench: Bench, key: str) -> int:
    return int(await bench.redis.memory_usage(key, samples=0) or 0)


async def _turn_bytes(bench: Bench, turn_id: str) -> tuple[int, int, int]:
    """Bytes of the turn's record, its stream, and its conversation's keys."""
    own, conversation = await _turn_keys(bench, turn_id)
    record = await _memory_usage(bench, own["turn hash"])
    stream = await _memory_usage(bench, own["event stream"])
    stored = sum([await _memory_usage(bench, key) for key in conversation.values()])
    return record, stream, stored


async def _turn_memory_breakdown(bench: Bench) -> list[tuple[str, int]]:
    """MEMORY USAGE of the keys of the most recent finished turn and its conversation."""
    redis = bench.redis
    newest: tuple[float, str] | None = None
    async for key in redis.scan_iter(match="bernard:{*}:turn", count=1000):
        created = await redis.hget(key, "created_at")  # type: ignore[misc]
        if created and (newest is None or float(created) > newest[0]):
            newest = (float(created), key.decode())
    if newest is None:
        return []
    turn_id = keys.id_of(newest[1])
    own, conversation = await _turn_keys(bench, turn_id)
    out = []
    for name, key in {**own, **conversation}.items():
        size = await _memory_usage(bench, key)
        if size:
            out.append((name, size))
    return out


# -- 6. cancel latency --------------------------------------------------------------------


async def _wait_upstream_closed(bench: Bench, tag: str) -> float | None:
    assert bench.cluster.upstream is not None
    call = await request(
        bench.cluster.upstream.endpoint, "GET", f"/bench/exchange?tag={tag}&wait=5"
    )
    if call.status != 200:
        return None
    found = call.json()
    assert isinstance(found, dict)
    value = (found.get("stream") or {}).get("disconnected_at")
    return float(value) if value is not None else None


async def cancel(bench: Bench) -> Section:
    """Client disconnect or POST cancel → the upstream sees its connection closed."""
    sizes = bench.sizes
    results: dict[str, list[float]] = {}
    terminal: list[float] = []
    missing: dict[str, int] = {}
    modes = [("disconnect", "pipeline"), ("POST /cancel", "pipeline"), ("disconnect", "baseline")]
    task = bench.ui.task("cancel latency", sizes.cancel_trials * len(modes))
    for _ in range(sizes.cancel_trials):
        for mode, system in modes:
            endpoint = bench.api if system == "pipeline" else bench.baseline
            directive = Directive(tag=new_tag("cx"), mode="slow", delay_ms=10)
            turn = await start_turn(endpoint, directive, system)
            label = f"{mode} ({system})"
            try:
                await asyncio.wait_for(asyncio.shield(turn.call.first_content), 30)
            except (TimeoutError, HttpError):
                turn.call.abort()
                missing[label] = missing.get(label, 0) + 1
                bench.ui.advance(task)
                continue
            await asyncio.sleep(0.05)
            if mode == "disconnect":
                t0 = time.monotonic()
                turn.call.abort()
            else:
                canceller = await connect(bench.api)
                path = f"/v1/turns/{turn.call.turn_id}/cancel"
                t0 = time.monotonic()
                canceller.send(request_bytes(bench.api, "POST", path, {}))
            closed = await _wait_upstream_closed(bench, directive.tag)
            if closed is None:
                missing[label] = missing.get(label, 0) + 1
            else:
                results.setdefault(label, []).append((closed - t0) * 1000)
            if mode != "disconnect":
                await asyncio.wait_for(turn.call.finished, 30)
                frames = turn.call.frames
                if len(frames) >= 2 and b"turn_cancelled" in frames[-2].data:
                    terminal.append((frames[-1].mono - t0) * 1000)
            bench.ui.advance(task)
    bench.ui.done(task)
    await wait_idle(bench)
    table = Table(["trigger", *SUMMARY_HEADERS], title="Trigger → upstream connection closed (ms)")
    for label, values in results.items():
        table.add(label, *summary_cells(Summary.of(values)))
    pipe = Summary.of(results.get("disconnect (pipeline)", []))
    base = Summary.of(results.get("disconnect (baseline)", []))
    versus = Table(["", "median", "p99"], title="Disconnect: pipeline against the baseline")
    versus.add("added (ms)", signed(pipe.median - base.median), signed(pipe.p99 - base.p99))
    versus.add(
        "ratio", f"{ratio(pipe.median, base.median):.1f}", f"{ratio(pipe.p99, base.p99):.1f}"
    )
    term = Summary.of(terminal)
    table.add(
        "POST /cancel → client's `[DONE]` after the cancelled error frame", *summary_cells(term)
    )
    section = Section(
        "cancel",
        "6. Cancel latency",
        intro="""
A turn streams " tick" every 10 ms from the upstream; once the client holds the first
content frame, it either closes its connection or sends `POST /v1/turns/{id}/cancel` on a
connection opened beforehand. The figure is the client's monotonic time of that action to
the upstream's monotonic time of seeing its client (the worker's `ChatOpenAI`) disconnect
(both processes read the same system-wide `CLOCK_MONOTONIC`). The run sets
`BERNARD_DISCONNECT_GRACE_S=0`: with the default grace of 5 s a disconnect cancels 5 s plus
this figure later, by design. The baseline row is the in-process floor: the request's
generator is closed by the disconnect and closes the upstream response itself.
""",
        tables=[table, versus],
    )
    if missing:
        section.notes.append(
            "No first token within 30 s, or the upstream never saw a disconnect within 5 s, in: "
            + ", ".join(f"{k} ×{v}" for k, v in missing.items())
        )
    for label in ("disconnect (pipeline)", "POST /cancel (pipeline)"):
        summary = Summary.of(results.get(label, []))
        section.verdicts.append(
            Verdict(f"{label}: p99 < 50 ms", f"{ms(summary.p99)} ms", summary.p99 < 50)
        )
    return section


# -- 7. API memory per idle stream -------------------------------------------------------


async def memory(bench: Bench) -> Section:
    """RSS of the API process with N open, idle streams."""
    sizes = bench.sizes
    n = sizes.memory_streams
    await wait_idle(bench)
    # Fresh processes: a process that already served many streams reuses the memory it
    # freed, which would hide what open streams cost.
    await bench.cluster.scale(0, 0)
    await bench.cluster.scale(1, 1)
    await wait_idle(bench)
    api = bench.cluster.apis[0]
    worker = bench.cluster.workers[0]
    await drive([bench.api], echo_directives("memwarm", 5, 20), system="pipeline", concurrency=1)
    await wait_idle(bench)
    await asyncio.sleep(1)
    rss0, wrss0 = api.rss_bytes(), worker.rss_bytes()
    task = bench.ui.task(f"memory: {n} idle streams", n)
    turns: list[Turn] = []
    for start in range(0, n, 100):
        batch = [
            await start_turn(bench.api, Directive(tag=new_tag("mem"), mode="hold"), "pipeline")
            for _ in range(min(100, n - start))
        ]
        for turn in batch:
            await asyncio.wait_for(turn.call.first_content, 120)
            bench.ui.advance(task)
        turns += batch
    bench.ui.done(task)
    await asyncio.sleep(2)
    rss1, wrss1 = api.rss_bytes(), worker.rss_bytes()

    # While they sit open: what a new turn sees.
    probe = echo_directives("memprobe", 10, 20)
    probes = await drive([bench.api], probe, system="pipeline", concurrency=1)
    probe_first = Summary.of(t.first_token_ms for t in probes)
    probe_relay = Summary.of((await relay_latencies(bench.redis, probes)).total)

    for turn in turns:
        turn.call.abort()
    await wait_idle(bench, timeout_s=120)
    await asyncio.sleep(1)
    rss2 = api.rss_bytes()
    table = Table(["", "API", "worker"], title=f"Resident memory with {n} open idle streams")
    mib = 1024 * 1024
    table.add("before (MiB)", f"{rss0 / mib:.1f}", f"{wrss0 / mib:.1f}")
    table.add(f"{n} open (MiB)", f"{rss1 / mib:.1f}", f"{wrss1 / mib:.1f}")
    table.add(
        "**per open stream (KiB)**",
        f"**{(rss1 - rss0) / n / 1024:.1f}**",
        f"{(wrss1 - wrss0) / n / 1024:.1f}",
    )
    table.add("after they closed (MiB)", f"{rss2 / mib:.1f}", "")
    probe_table = Table(["", *SUMMARY_HEADERS], title=f"A new turn while {n} streams sit open (ms)")
    probe_table.add("first token", *summary_cells(probe_first))
    probe_table.add("relay latency per frame", *summary_cells(probe_relay))
    notes = [
        "Each idle turn holds an upstream connection; the worker's connection pools are sized "
        "to its concurrency (worker/llm.py `build_models`), so a new turn's model call does "
        "not wait for one."
    ]
    return Section(
        "memory",
        "7. API process memory per open idle stream",
        intro=f"""
{n} streaming turns whose upstream sends one token and then holds the response open: each
client holds an open SSE response and the worker a running turn, with nothing flowing.
Resident set size from `/proc/<pid>/statm` before, with all {n} open (after 2 s), and after
the clients closed (each close cancels its turn). The worker column is for comparison
(each of its idle turns also holds an upstream HTTP connection). Both are fresh processes,
warmed with 5 turns, so that growth is not hidden by memory freed in earlier runs. Then 10
sequential turns of 20 tokens ran while the {n} streams were open.
""",
        tables=[table, probe_table],
        notes=notes,
    )


# -- issue 4: worker death --------------------------------------------------------------


async def worker_death(bench: Bench) -> Section:
    """SIGKILL the worker running a turn → the attached client's terminal frame."""
    sizes = bench.sizes
    cluster = bench.cluster
    results: dict[str, list[float]] = {}
    notes: list[str] = []
    scenarios = [("only worker killed (the API reaps)", 1), ("1 of 2 workers killed", 2)]
    scenarios = scenarios[: sizes.death_scenarios]
    task = bench.ui.task("worker death", sizes.death_trials * len(scenarios))
    for label, workers in scenarios:
        await cluster.scale(1, workers)
        for _ in range(sizes.death_trials):
            directive = Directive(tag=new_tag("wd"), mode="slow", delay_ms=20)
            turn = await start_turn(bench.api, directive, "pipeline")
            try:
                await asyncio.wait_for(asyncio.shield(turn.call.first_content), 30)
            except (TimeoutError, HttpError):
                notes.append(f"{label}: no first token within 30 s; trial skipped")
                turn.call.abort()
                continue
            holder = await bench.redis.hget(keys.turn(turn.call.turn_id), "worker")  # type: ignore[misc]
            pid = int(holder.decode().split(":")[1]) if holder else -1
            victim = next((w for w in cluster.workers if w.pid == pid), None)
            if victim is None:
                notes.append(f"{label}: no worker found for a turn; trial skipped")
                turn.call.abort()
                continue
            t0 = time.monotonic()
            os.kill(victim.pid, signal.SIGKILL)
            victim.proc.wait()
            cluster.forget_worker(victim)
            try:
                await asyncio.wait_for(turn.call.finished, 30)
            except TimeoutError:
                notes.append(f"{label}: no terminal frame within 30 s")
                turn.call.abort()
            frames = turn.call.frames
            if len(frames) >= 2 and b"worker_lost" in frames[-2].data:
                results.setdefault(label, []).append((frames[-1].mono - t0) * 1000)
            elif turn.call.finished.done():
                notes.append(f"{label}: stream ended without worker_lost: {frames[-2:]}")
            status = await bench.redis.hget(  # type: ignore[misc]
                keys.turn(turn.call.turn_id), "status"
            )
            if status != b"failed":
                notes.append(f"{label}: turn status {status!r} after the kill")
            await cluster.scale(1, workers)
            bench.ui.advance(task)
    bench.ui.done(task)
    await cluster.scale(1, 1)
    table = Table(["scenario", *SUMMARY_HEADERS], title="SIGKILL → client's terminal frame (ms)")
    for label, _ in scenarios:
        table.add(label, *summary_cells(Summary.of(results.get(label, [])), 0))
    section = Section(
        "worker-death",
        "Worker death → terminal frame",
        intro="""
A turn streams slowly; once the client holds a content frame, the worker process its
record names (its id names the pid) gets SIGKILL. The figure is the kill to the client's
`[DONE]` after the `worker_lost` error frame. A worker's liveness key lives 5 s, renewed
every 1 s (shared/liveness.py); the turns of a worker whose key lapsed are reaped by every
worker (`TurnSupervisor._reap`) and by every API process
(`api.main._reap_forever`), each once per `BERNARD_LEASE_RENEW_S`, so with the only worker
dead the API is the one that ends the turn.
""",
        tables=[table],
        notes=notes,
    )
    for label, _ in scenarios:
        summary = Summary.of(results.get(label, []))
        section.verdicts.append(
            Verdict(
                f"{label}: within 10 s", f"max {ms(summary.max / 1000, 1)} s", summary.max < 10_000
            )
        )
    return section


MEASUREMENTS = {
    "first-token": first_token,
    "relay": relay,
    "throughput": throughput,
    "exactness": exactness,
    "cancel": cancel,
    "memory": memory,
    "worker-death": worker_death,
    "redis": redis_cost,
}
