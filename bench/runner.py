"""Driving turns and reading what they left behind: shared by every measurement.

`drive` runs turns through an endpoint with a given concurrency, keeping the client's work
per frame to the raw parse of `bench.client`. Everything else (checking each stream token
by token, fetching each entry's `at` from Redis, counting Redis commands) happens after
the turns, so it never competes with them for CPU.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from redis.asyncio import Redis
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from api.cursors import parse_cursor
from bench.client import Call, Endpoint, chat_body, connect, request_bytes, responses_body
from bench.processes import Cluster
from bench.upstream import Directive
from shared import keys
from shared.streams import STREAM_FIELD

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
_tags = itertools.count(1)
_RUN = f"{int(time.time()) % 100000:05d}"


def new_tag(prefix: str) -> str:
    """A tag unique to this run, so upstream exchanges and turns never mix."""
    return f"{prefix}{_RUN}x{next(_tags)}"


@dataclass(frozen=True, slots=True)
class Sizes:
    """How big each measurement is; `full()` is what the targets are set at, `quick()` a smoke
    run."""

    name: str
    warmup: int
    ft_sequential: int
    ft_tokens: int
    ft_concurrency: int
    ft_concurrent_turns: int
    ft_concurrent_tokens: int
    ft_concurrent_delay_ms: float
    relay_scales: tuple[int, ...]
    relay_rounds_single: int
    relay_tokens: dict[int, int]
    relay_delay_ms: dict[int, float]
    relay_baseline_scales: tuple[int, ...]
    capacity_streams: int
    capacity_rates: tuple[int, ...]
    capacity_step_s: float
    scale_streams: int
    scale_tokens: int
    exact_streams: int
    exact_tokens: int
    cancel_trials: int
    memory_streams: int
    death_trials: int
    death_scenarios: int
    # Cost per token: (streams, short answer, long answer) in tokens; the row py-spy profiles.
    cost_runs: tuple[tuple[int, int, int], ...]
    cost_profiled_streams: int
    # How often the profiled row and the fan-out run: their verdicts take the median (one
    # run of either moves by half between runs on a shared two-core box).
    cost_repeats: int
    cost_fanout_streams: int
    # Paced answers (issue 25): (answers at once, tokens/s each, short, long answer tokens).
    paced_runs: tuple[tuple[int, float, int, int], ...]
    cost_fanout_tokens: int
    burst_streams: int
    burst_tokens: int
    burst_delay_ms: float
    # First token against the history's length: stored exchanges, turns per length, tokens.
    history_lengths: tuple[int, ...]
    history_turns: int
    history_tokens: int
    # The noisy neighbour: the neighbour's turns beside each flood (as many on the quiet system).
    noisy_turns: int
    # The first word on a model's clock: turns per row (sequential, and at once), the
    # answer's tokens, the time to the first token and between two.
    fw_turns: int
    fw_concurrency: int
    fw_answer_tokens: int
    fw_first_ms: float
    fw_token_ms: float
    # CPU per turn beside the peer (bench/peers.py): turns per run, at once, tokens each,
    # tokens/s each, runs per system.
    peers_turns: int
    peers_at_once: int
    peers_tokens: int
    peers_rate: float
    peers_repeats: int

    @classmethod
    def full(cls) -> Sizes:
        return cls(
            name="full",
            warmup=10,
            ft_sequential=200,
            ft_tokens=50,
            ft_concurrency=50,
            ft_concurrent_turns=250,
            ft_concurrent_tokens=25,
            ft_concurrent_delay_ms=200,
            relay_scales=(1, 100, 1000),
            relay_rounds_single=3,
            relay_tokens={1: 200, 100: 25, 1000: 10},
            relay_delay_ms={1: 20, 100: 400, 1000: 4000},
            relay_baseline_scales=(1, 100),
            capacity_streams=100,
            capacity_rates=(1000, 2000, 4000, 8000, 0),
            capacity_step_s=3.0,
            scale_streams=100,
            scale_tokens=100,
            exact_streams=1000,
            exact_tokens=200,
            cancel_trials=50,
            memory_streams=1000,
            death_trials=3,
            death_scenarios=2,
            cost_runs=((1, 50, 2000), (100, 20, 200), (1000, 5, 30)),
            cost_profiled_streams=100,
            cost_repeats=3,
            cost_fanout_streams=1000,
            paced_runs=((100, 50, 5, 40), (1000, 50, 5, 30), (1000, 10, 5, 30)),
            cost_fanout_tokens=60,
            burst_streams=200,
            burst_tokens=100,
            burst_delay_ms=10,
            history_lengths=(2, 300, 2000),
            history_turns=40,
            history_tokens=20,
            noisy_turns=100,
            fw_turns=20,
            fw_concurrency=20,
            fw_answer_tokens=20,
            fw_first_ms=200,
            fw_token_ms=25,
            peers_turns=40,
            peers_at_once=20,
            peers_tokens=200,
            peers_rate=50,
            peers_repeats=3,
        )

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            name="quick",
            warmup=3,
            ft_sequential=20,
            ft_tokens=20,
            ft_concurrency=10,
            ft_concurrent_turns=30,
            ft_concurrent_tokens=10,
            ft_concurrent_delay_ms=100,
            relay_scales=(1, 100),
            relay_rounds_single=1,
            relay_tokens={1: 100, 100: 10},
            relay_delay_ms={1: 20, 100: 400},
            relay_baseline_scales=(1,),
            capacity_streams=50,
            capacity_rates=(2000, 0),
            capacity_step_s=1.5,
            scale_streams=30,
            scale_tokens=30,
            exact_streams=100,
            exact_tokens=50,
            cancel_trials=8,
            memory_streams=200,
            death_trials=1,
            death_scenarios=1,
            cost_runs=((1, 20, 300), (30, 10, 60)),
            cost_profiled_streams=30,
            cost_repeats=1,
            cost_fanout_streams=200,
            paced_runs=((30, 50, 5, 20), (100, 50, 5, 20), (100, 10, 5, 20)),
            cost_fanout_tokens=30,
            burst_streams=50,
            burst_tokens=50,
            burst_delay_ms=10,
            history_lengths=(2, 100, 200),
            history_turns=8,
            history_tokens=10,
            noisy_turns=12,
            fw_turns=4,
            fw_concurrency=4,
            fw_answer_tokens=20,
            fw_first_ms=200,
            fw_token_ms=25,
            peers_turns=6,
            peers_at_once=3,
            peers_tokens=40,
            peers_rate=50,
            peers_repeats=1,
        )


@dataclass(eq=False)
class Turn:
    """One turn as the client drove it."""

    directive: Directive
    call: Call
    system: str  # "pipeline", "baseline", or "responses" (the pipeline through /v1/responses)
    expected: list[str] | None = None  # the tokens to check against, when not the directive's

    @property
    def first_token_ms(self) -> float:
        """Request sent → first content frame received."""
        if self.call.first_content_at is None:
            return float("nan")
        return (self.call.first_content_at - self.call.sent_at) * 1000


class Ui:
    """Progress on the terminal (rich), redrawn from the event loop at most twice a second.

    No refresh thread: a redraw holds the GIL, and a thread doing it at random moments would
    delay the client's receive timestamps.
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            auto_refresh=False,
            transient=False,
        )
        self._drawn = 0.0

    def task(self, description: str, total: float) -> TaskID:
        task = self.progress.add_task(description, total=total)
        self._refresh(force=True)
        return task

    def advance(self, task: TaskID, amount: float = 1) -> None:
        self.progress.advance(task, amount)
        self._refresh()

    def done(self, task: TaskID) -> None:
        total = self.progress.tasks[self.progress.task_ids.index(task)].total
        self.progress.update(task, completed=total)
        self._refresh(force=True)

    def _refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._drawn >= 0.5:
            self._drawn = now
            self.progress.refresh()

    def log(self, message: str) -> None:
        self.progress.console.log(message)


@dataclass(eq=False)
class Bench:
    """What every measurement gets: the processes, a Redis client, sizes and the UI."""

    cluster: Cluster
    redis: Redis
    sizes: Sizes
    ui: Ui
    workdir: Path
    failures: list[str] = field(default_factory=list)
    # CPU the machine spent outside the run's processes during metered stretches, and
    # how long those stretches were: other users of the box show up here.
    other_cpu_s: float = 0.0
    metered_s: float = 0.0

    @property
    def api(self) -> Endpoint:
        return self.cluster.apis[0].endpoint

    @property
    def baseline(self) -> Endpoint:
        assert self.cluster.baseline is not None
        return self.cluster.baseline.endpoint


async def start_turn(endpoint: Endpoint, directive: Directive, system: str) -> Turn:
    """Open a connection and send the chat request; the turn streams in the background."""
    call = await connect(endpoint)
    if system == "responses":
        request = request_bytes(endpoint, "POST", RESPONSES, responses_body(directive.message()))
    else:
        request = request_bytes(endpoint, "POST", CHAT, chat_body(directive.message()))
    call.send(request)
    return Turn(directive, call, system)


async def drive(
    endpoints: Sequence[Endpoint],
    directives: Sequence[Directive],
    *,
    system: str,
    concurrency: int,
    stagger_s: float = 0.0,
    on_done: Callable[[Turn], None] | None = None,
) -> list[Turn]:
    """Run every directive as a turn, `concurrency` at a time, round-robin over `endpoints`.

    With `stagger_s`, the `concurrency` client loops start spread evenly over that many
    seconds, so turns start at a steady pace instead of in bursts.
    """
    queue = list(enumerate(directives))
    queue.reverse()
    turns: list[Turn | None] = [None] * len(directives)

    async def loop(k: int) -> None:
        if stagger_s:
            await asyncio.sleep(stagger_s * k / concurrency)
        while queue:
            index, directive = queue.pop()
            turn = await start_turn(endpoints[index % len(endpoints)], directive, system)
            await turn.call.finished
            turns[index] = turn
            if on_done is not None:
                on_done(turn)

    await asyncio.gather(*(loop(k) for k in range(min(concurrency, len(directives)))))
    return [t for t in turns if t is not None]


def echo_directives(prefix: str, count: int, tokens: int, delay_ms: float = 0) -> list[Directive]:
    """`count` echo turns with unique tags."""
    return [Directive(tag=new_tag(prefix), tokens=tokens, delay_ms=delay_ms) for _ in range(count)]


# -- checking streams ------------------------------------------------------------------


def _id_key(frame_id: str) -> tuple[int, int, int]:
    # As the server reads a frame id back (`done:<k>` names the stream's last entry).
    cursor = parse_cursor(frame_id)
    if cursor is None:
        raise ValueError(f"no frame id: {frame_id!r}")
    ms, seq = cursor.key
    return ms, seq, cursor.frame if cursor.frame is not None else -1


def check_turn(turn: Turn) -> str | None:
    """None when the stream is exact; else what is wrong with it.

    Exact: HTTP 200; the role frame first; content frames that are, in order, runs of
    whole tokens that together are exactly the upstream's tokens (no loss, duplicate or
    reordering); a `stop` finish frame after all content; `[DONE]` once, last; and, through
    the pipeline, SSE ids strictly increasing.
    """
    call = turn.call
    if call.status != 200:
        return f"HTTP {call.status}: {bytes(call.body)[:200]!r}"
    if call.error:
        return call.error
    if turn.system == "responses":
        return _check_responses(turn)
    frames = call.frames
    if not frames or frames[-1].data != b"[DONE]":
        return "the stream does not end with [DONE]"
    if sum(1 for f in frames if f.data == b"[DONE]") != 1:
        return "[DONE] more than once"
    if turn.system == "pipeline":
        ids = [_id_key(f.id) for f in frames if f.id]  # keepalives carry no id
        if any(b <= a for a, b in itertools.pairwise(ids)):
            return "SSE ids do not strictly increase"
    expected = turn.expected if turn.expected is not None else turn.directive.expected_tokens()
    k = 0
    finish: str | None = None
    role_seen = False
    for frame in frames[:-1]:
        body = orjson.loads(frame.data)
        if "error" in body:
            return f"error frame: {body['error']}"
        choices = body.get("choices") or []
        if not choices:
            continue
        choice = choices[0]
        delta = choice.get("delta") or {}
        if delta.get("role") == "assistant":
            if role_seen or k:
                return "role frame not first"
            role_seen = True
        if choice.get("finish_reason"):
            finish = choice["finish_reason"]
            continue
        text = delta.get("content") or ""
        if not text:
            continue
        if finish is not None:
            return "content after the finish frame"
        j, length = k, 0
        while length < len(text) and j < len(expected):
            length += len(expected[j])
            j += 1
        if text != "".join(expected[k:j]):
            return f"content diverges at token {k}: got {text[:40]!r}"
        k = j
    if not role_seen:
        return "no role frame"
    if k != len(expected):
        return f"{k} of {len(expected)} tokens arrived"
    if finish != "stop":
        return f"finish_reason {finish!r}"
    return None


def check_all(turns: Iterable[Turn]) -> tuple[int, list[str]]:
    """How many turns were exact; for the others, each kind of problem with its count."""
    exact = 0
    kinds: dict[str, int] = {}
    examples: dict[str, str] = {}
    for turn in turns:
        problem = check_turn(turn)
        if problem is None:
            exact += 1
            continue
        kind = problem
        if "error frame" in problem:
            kind = "error frame " + problem.split("'code': ", 1)[-1].split(",", 1)[0]
        elif "tokens arrived" in problem:
            kind = "tokens missing"
        elif "diverges" in problem:
            kind = "content diverges"
        kinds[kind] = kinds.get(kind, 0) + 1
        examples.setdefault(kind, f"{turn.directive.tag} ({turn.call.turn_id}): {problem}")
    problems = [f"{count} × {kind}, e.g. {examples[kind]}" for kind, count in kinds.items()]
    return exact, problems


def _check_responses(turn: Turn) -> str | None:
    """A Responses stream is exact when its events are numbered 0, 1, 2... with none
    missing, its text deltas are runs of whole tokens that together are the upstream's,
    and it ends with `response.completed`."""
    events = [orjson.loads(frame.data) for frame in turn.call.frames]
    if [event.get("sequence_number") for event in events] != list(range(len(events))):
        return "sequence numbers are not 0, 1, 2, ..."
    if not events or events[-1].get("type") != "response.completed":
        return f"the stream ends with {events[-1].get('type') if events else None!r}"
    expected = turn.expected if turn.expected is not None else turn.directive.expected_tokens()
    k = 0
    for event in events:
        if event.get("type") != "response.output_text.delta":
            continue
        text = event["delta"]
        j, length = k, 0
        while length < len(text) and j < len(expected):
            length += len(expected[j])
            j += 1
        if text != "".join(expected[k:j]):
            return f"content diverges at token {k}: got {text[:40]!r}"
        k = j
    if k != len(expected):
        return f"{k} of {len(expected)} tokens arrived"
    return None


# -- relay latency -----------------------------------------------------------------------


def is_delta(data: bytes) -> bool:
    """Whether an SSE data payload is a content (delta) chunk."""
    return data.startswith(b"{") and b'"delta":{"content":' in data


@dataclass
class RelayLatency:
    """Per content frame (ms): `total` = client receipt − `at`; through the pipeline also
    split at the time Redis executed the `XADD` (the ms part of the entry id, so each part
    is only good to ±1 ms): `to_redis` = entry id time − `at` (the worker's side), and
    `from_redis` = client receipt − entry id time (Redis, the API, the client)."""

    total: list[float] = field(default_factory=list)
    to_redis: list[float] = field(default_factory=list)
    from_redis: list[float] = field(default_factory=list)


async def relay_latencies(redis: Redis, turns: Sequence[Turn]) -> RelayLatency:
    """Per content frame: client receipt − the `at` its writer stamped.

    Through the pipeline `at` is read back from the stream entry the frame's SSE id names;
    from the baseline it is the yield time carried in the frame's id.
    """
    out = RelayLatency()
    pipeline_turns = []
    for turn in turns:
        if turn.system == "baseline":
            out.total += [
                (f.wall - float(f.id[1:])) * 1000 for f in turn.call.frames if is_delta(f.data)
            ]
        else:
            pipeline_turns.append(turn)
    for start in range(0, len(pipeline_turns), 100):
        batch = pipeline_turns[start : start + 100]
        async with redis.pipeline(transaction=False) as pipe:
            for turn in batch:
                pipe.xrange(keys.events(turn.call.turn_id))
            replies = await pipe.execute()
        for turn, entries in zip(batch, replies, strict=True):
            at = {
                entry_id.decode(): orjson.loads(fields[STREAM_FIELD.encode()])["at"]
                for entry_id, fields in entries
            }
            for frame in turn.call.frames:
                stamped = at.get(frame.id)
                if stamped is None or not is_delta(frame.data):
                    continue
                executed = int(frame.id.partition("-")[0]) / 1000
                out.total.append((frame.wall - stamped) * 1000)
                out.to_redis.append((executed - stamped) * 1000)
                out.from_redis.append((frame.wall - executed) * 1000)
    return out


# -- turn records ----------------------------------------------------------------------


async def pickup_ms(redis: Redis, turns: Sequence[Turn]) -> list[float]:
    """Enqueue → job start per turn, from the turn record: `started_at − created_at`, ms."""
    values: list[float] = []
    for start in range(0, len(turns), 200):
        batch = turns[start : start + 200]
        async with redis.pipeline(transaction=False) as pipe:
            for turn in batch:
                pipe.hmget(keys.turn(turn.call.turn_id), ["created_at", "started_at"])
            replies = await pipe.execute()
        for created, started in replies:
            if created and started:
                values.append((float(started) - float(created)) * 1000)
    return values


# -- Redis accounting ------------------------------------------------------------------


@dataclass
class RedisCost:
    """Commands Redis executed (from `INFO commandstats`) over one stretch of a run."""

    commands: dict[str, int]
    seconds: float

    @property
    def total(self) -> int:
        return sum(self.commands.values())


async def command_counts(redis: Redis) -> dict[str, int]:
    """Calls per command so far (our own INFO calls are left out)."""
    stats: dict[str, Any] = await redis.info("commandstats")
    counts = {}
    for name, values in stats.items():
        command = name.removeprefix("cmdstat_")
        if command not in ("info",):
            counts[command] = int(values["calls"])
    return counts


MACHINE = "(machine)"
OTHER = "everything else"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds all CPUs of the machine spent busy since boot (/proc/stat)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / _CLOCK_TICKS


class Meter:
    """Counts Redis commands and process CPU between `start()` and `stop()`."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.before: dict[str, int] = {}
        self.cpu_before: dict[str, float] = {}
        self.started = 0.0
        self.cost = RedisCost({}, 0.0)
        self.cpu: dict[str, float] = {}

    def _cpu(self) -> dict[str, float]:
        cluster = self.bench.cluster
        services = [*cluster.apis, *cluster.workers, cluster.upstream, cluster.baseline]
        services += [cluster.langgraph, cluster.redis_proc]
        out = {s.name: s.cpu_seconds() for s in services if s is not None and s.alive}
        out["client"] = time.process_time()
        out[MACHINE] = machine_busy_seconds()
        return out

    async def start(self) -> Meter:
        self.before = await command_counts(self.bench.redis)
        self.cpu_before = self._cpu()
        self.started = time.monotonic()
        return self

    async def stop(self) -> Meter:
        seconds = time.monotonic() - self.started
        after = await command_counts(self.bench.redis)
        cpu = self._cpu()
        self.cpu = {k: cpu[k] - self.cpu_before[k] for k in cpu if k in self.cpu_before}
        # What the machine's CPUs did beyond the run's own processes (other users of the box,
        # processes started and ended within the stretch, the kernel's own work).
        busy = self.cpu.pop(MACHINE, 0.0)
        self.cpu[OTHER] = max(busy - sum(self.cpu.values()), 0.0)
        self.bench.other_cpu_s += self.cpu[OTHER]
        self.bench.metered_s += seconds
        diff = {k: v - self.before.get(k, 0) for k, v in after.items()}
        self.cost = RedisCost({k: v for k, v in diff.items() if v}, seconds)
        return self


async def wait_quiet(bench: Bench, timeout_s: float = 15, window_s: float = 0.25) -> None:
    """Wait until the run's processes have nearly stopped using CPU (under 5 % of a core
    each over `window_s`): work an earlier measurement left behind (streams being wound
    down, connections closing) must not fall into the next one."""
    cluster = bench.cluster
    services = [s for s in (*cluster.apis, *cluster.workers, cluster.upstream) if s is not None]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [s for s in services if s.alive]
        before = [s.cpu_seconds() for s in alive]
        await asyncio.sleep(window_s)
        after = [s.cpu_seconds() for s in alive]
        if all(b - a < 0.05 * window_s for a, b in zip(before, after, strict=True)):
            return
    bench.ui.log("[yellow]processes still busy after the wait; going on")


async def wait_idle(bench: Bench, timeout_s: float = 60) -> None:
    """Wait until no turn is running (the `bernard:running` set is empty)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not await bench.redis.zcard(keys.RUNNING_TURNS):
            return
        await asyncio.sleep(0.1)
    bench.ui.log("[yellow]turns still running after the wait; going on")
