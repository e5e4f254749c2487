"""The noisy neighbour: one user's flood against another user's first token.

The attack it measures: with an upstream slow to answer summary calls, one user sending
requests whose history crosses the summary threshold (one request at a time, never a 429)
could fill every worker slot with summary jobs. Background jobs are admitted against
per-user and deployment budgets and take at most a share of a worker's slots, and a
saturated worker starts a backlog round-robin across users (shared/queue.py,
worker/queue.py).

This measurement runs its own API and worker (users with keys; their own queue on the
run's Redis and upstream) and times the neighbour's turns, one at a time, on a quiet
system and beside each flood, in the same run:

- **summaries**: the noisy user sends requests whose history crosses the threshold, each
  in a new conversation, one after another; the upstream holds each summary call for
  `SLOW_SUMMARY_S`.
- **live turns at the limit**: the noisy user keeps `BERNARD_MAX_ACTIVE_TURNS_PER_USER`
  slow streaming turns running.
- **a backlog**: three noisy users each at their limit, more turns than the worker's slots,
  so a backlog always waits. The neighbour's turn waits for a slot to free, but not
  behind the backlog.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

from bench.client import Endpoint, connect, request, request_bytes
from bench.processes import BENCH_ENV, Cluster
from bench.report import SUMMARY_HEADERS, Section, Table, Verdict, ms, summary_cells
from bench.runner import (
    CHAT,
    Bench,
    Turn,
    check_all,
    machine_busy_seconds,
    new_tag,
    pickup_ms,
    wait_idle,
)
from bench.stats import Summary, ratio
from bench.upstream import SLOW_SUMMARY, SLOW_SUMMARY_S, Directive
from shared import keys

QUEUE = "bernard:bench:neighbour"
CONCURRENCY = 40
USER_LIMIT = 20  # BERNARD_MAX_ACTIVE_TURNS_PER_USER's default
USERS = ("bob", "alice", "carol", "dave")  # bob is the neighbour
NEIGHBOUR = USERS[0]
# The bound each flood is held to: the neighbour's first token at most this many times
# its first token on the quiet system, or at most this many ms more.
RATIO_BOUND = 2.0
ADDED_MEDIAN_MS = 5.0
ADDED_P99_MS = 20.0
# The noisy users' live turns: slow streams, so a flood costs little CPU and its turns
# hold their slots for a while.
LIVE_TOKENS, LIVE_DELAY_MS = 25, 200.0
LIVE_S = LIVE_TOKENS * LIVE_DELAY_MS / 1000
_SPACING_S = LIVE_S / CONCURRENCY
# The neighbour's turns: short, a pause between them.
TURN_TOKENS, TURN_GAP_S = 5, 0.05
# Prompts small enough that a request of `CROWDED` messages asks for a summary.
ENV = {
    **BENCH_ENV,
    "BERNARD_WORKER_CONCURRENCY": str(CONCURRENCY),
    "BERNARD_MAX_ACTIVE_TURNS_PER_USER": str(USER_LIMIT),
    "BERNARD_MAX_STREAMS_PER_USER": "50",
    "BERNARD_API_KEYS": ",".join(f"key-{user}:{user}" for user in USERS),
    "BERNARD_CONTEXT_MAX_TOKENS": "3000",
    "BERNARD_CONTEXT_ANSWER_TOKENS": "300",
    "BERNARD_SUMMARY_THRESHOLD_MESSAGES": "20",
}
CROWDED = 100
# The summary flood's pace: a request (and so a summary asked for) every 100 ms, so what
# it measures is the summaries' hold on the worker, not the requests' CPU.
FLOOD_GAP_S = 0.1


def _auth(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer key-{user}"}


async def _turn(endpoint: Endpoint, user: str, directive: Directive) -> Turn:
    """One streamed turn of `user`, read to its end."""
    call = await connect(endpoint)
    body = {
        "model": "bernard-v1",
        "stream": True,
        "messages": [{"role": "user", "content": directive.message()}],
    }
    call.send(request_bytes(endpoint, "POST", CHAT, body, _auth(user)))
    await call.finished
    return Turn(directive, call, "pipeline")


async def _neighbour(endpoint: Endpoint, count: int) -> list[Turn]:
    turns = []
    for _ in range(count):
        turns.append(await _turn(endpoint, NEIGHBOUR, Directive(new_tag("nn"), tokens=TURN_TOKENS)))
        await asyncio.sleep(TURN_GAP_S)
    return turns


def _crowded(tag: str) -> list[dict[str, str]]:
    """A history whose new conversation needs a summary, slow to come (`SLOW_SUMMARY`)."""
    rows = []
    for n in range(CROWDED // 2):
        rows.append({"role": "user", "content": f"{tag} {SLOW_SUMMARY} question {n} " + "q" * 40})
        rows.append({"role": "assistant", "content": f"answer {n} " + "a" * 60})
    directive = Directive(new_tag("ns"), tokens=3)
    return [*rows, {"role": "user", "content": directive.message()}]


async def _summary_flood(endpoint: Endpoint, stop: asyncio.Event, statuses: Counter[int]) -> None:
    """Alice's requests, one at a time, each a new conversation asking for a summary."""
    while not stop.is_set():
        body = {"model": "bernard-v1", "messages": _crowded(new_tag("flood"))}
        call = await request(endpoint, "POST", CHAT, body, _auth("alice"))
        statuses[call.status] += 1
        await asyncio.sleep(FLOOD_GAP_S)


async def _live_flood(
    endpoint: Endpoint, user: str, stop: asyncio.Event, statuses: Counter[int], delay_s: float
) -> None:
    """One of `user`'s `USER_LIMIT` loops: a slow streaming turn after another, the first
    after `delay_s`."""
    await asyncio.sleep(delay_s)
    while not stop.is_set():
        directive = Directive(new_tag("nl"), tokens=LIVE_TOKENS, delay_ms=LIVE_DELAY_MS)
        turn = await _turn(endpoint, user, directive)
        statuses[turn.call.status] += 1
        if turn.call.status == 429:  # its last turn still counted: it ends in a moment
            await asyncio.sleep(0.05)


async def _sample(bench: Bench, peaks: Counter[str], stop: asyncio.Event) -> None:
    """The most background jobs alice and the queue held (queued or running) at once."""
    while not stop.is_set():
        mine = await bench.redis.zcard(keys.background_jobs("alice"))
        everyone = await bench.redis.zcard(keys.queued_background(QUEUE))
        queued = await bench.redis.zcard(QUEUE)
        peaks["alice"] = max(peaks["alice"], mine)
        peaks["queue"] = max(peaks["queue"], everyone)
        peaks["waiting"] = max(peaks["waiting"], queued)
        await asyncio.sleep(0.05)


class _Load:
    """The machine's CPU outside the run's processes (other users of the box) over a
    stretch, in cores: what the rows' differences may owe to it."""

    def __init__(self, bench: Bench, procs: Cluster) -> None:
        run = bench.cluster
        candidates = [*run.apis, *run.workers, run.upstream, run.baseline, run.redis_proc]
        self.services = [s for s in [*candidates, *procs.apis, *procs.workers] if s is not None]
        self.started = (0.0, 0.0, 0.0)

    def _now(self) -> tuple[float, float, float]:
        ours = sum(s.cpu_seconds() for s in self.services if s.alive) + time.process_time()
        return time.monotonic(), machine_busy_seconds(), ours

    def start(self) -> None:
        self.started = self._now()

    def stop(self) -> float:
        wall, busy, ours = (b - a for a, b in zip(self.started, self._now(), strict=True))
        return max(busy - ours, 0.0) / wall if wall else 0.0


Flood = Callable[[asyncio.Event], list[Coroutine[Any, Any, None]]]


def _live_floods(
    bench: Bench,
    endpoint: Endpoint,
    users: tuple[str, ...],
    statuses: Counter[int],
    peaks: Counter[str],
) -> Flood:
    """Each of `users` at their limit of live turns."""

    def flood(stop: asyncio.Event) -> list[Coroutine[Any, Any, None]]:
        # One loop starts every `LIVE_S / CONCURRENCY`: the worker's slots then free at that
        # pace, evenly, turn after turn (started at once, they would all free together).
        loops = [
            _live_flood(endpoint, users[k % len(users)], stop, statuses, k * _SPACING_S)
            for k in range(len(users) * USER_LIMIT)
        ]
        return [*loops, _sample(bench, peaks, stop)]

    return flood


async def _beside(
    endpoint: Endpoint, flood: Flood, count: int, warm_s: float, load: _Load
) -> tuple[list[Turn], float]:
    """The neighbour's turns while `flood` runs (started `warm_s` earlier), and the load
    outside the run meanwhile."""
    stop = asyncio.Event()
    tasks = [asyncio.create_task(job) for job in flood(stop)]
    try:
        await asyncio.sleep(warm_s)
        load.start()
        turns = await _neighbour(endpoint, count)
        return turns, load.stop()
    finally:
        stop.set()
        await asyncio.wait(tasks, timeout=60)
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def _drained(bench: Bench, timeout_s: float) -> None:
    """Wait until the queue is empty and no background job holds a slot."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        queued = await bench.redis.zcard(QUEUE)
        held = await bench.redis.zcard(keys.queued_background(QUEUE))
        if not queued and not held:
            break
        await asyncio.sleep(0.2)
    await wait_idle(bench)


async def noisy_neighbour(bench: Bench) -> Section:
    count = bench.sizes.noisy_turns
    assert bench.cluster.upstream is not None
    workdir = bench.workdir / "neighbour"
    workdir.mkdir(exist_ok=True)
    procs = Cluster(workdir, bench.cluster.redis_url, dict(ENV), queue_name=QUEUE)
    procs.upstream = bench.cluster.upstream
    task = bench.ui.task("noisy neighbour", 5 * count)
    statuses: dict[str, Counter[int]] = {}
    peaks: Counter[str] = Counter()
    rows: dict[str, list[Turn]] = {}
    # Cores busy outside the run while each row was measured.
    loads: dict[str, list[float]] = {"quiet": []}
    try:
        api = (await procs.start_api()).endpoint
        await procs.start_worker()
        load = _Load(bench, procs)
        await _neighbour(api, 5)  # warm
        load.start()
        quiet = await _neighbour(api, count // 2)
        loads["quiet"].append(load.stop())
        bench.ui.advance(task, count // 2)

        flooded: Counter[int] = Counter()
        statuses["summaries"] = flooded

        def summaries(stop: asyncio.Event) -> list[Coroutine[Any, Any, None]]:
            return [_summary_flood(api, stop, flooded), _sample(bench, peaks, stop)]

        # Bob starts once alice's flood has asked for as many summaries as the upstream
        # holds at once: before issue 20's fix, every slot of the worker by then.
        rows["summaries"], busy = await _beside(api, summaries, count, SLOW_SUMMARY_S, load)
        loads["summaries"] = [busy]
        bench.ui.advance(task, count)
        await _drained(bench, SLOW_SUMMARY_S + 30)

        for label, users in (("live", ("alice",)), ("backlog", ("alice", "carol", "dave"))):
            statuses[label] = Counter()
            flood = _live_floods(bench, api, users, statuses[label], peaks)
            warm_s = len(users) * USER_LIMIT * _SPACING_S + 1
            rows[label], busy = await _beside(api, flood, count, warm_s, load)
            loads[label] = [busy]
            bench.ui.advance(task, count)
            await _drained(bench, 30)
        load.start()
        quiet += await _neighbour(api, count - count // 2)
        loads["quiet"].append(load.stop())
        bench.ui.done(task)
    finally:
        await procs.scale(0, 0)
    pickups = {key: Summary.of(await pickup_ms(bench.redis, turns)) for key, turns in rows.items()}
    pickups["quiet"] = Summary.of(await pickup_ms(bench.redis, quiet))
    return _section(bench, quiet, rows, statuses, peaks, pickups, loads)


def _section(
    bench: Bench,
    quiet: list[Turn],
    rows: dict[str, list[Turn]],
    statuses: dict[str, Counter[int]],
    peaks: Counter[str],
    pickups: dict[str, Summary],
    loads: dict[str, list[float]],
) -> Section:
    live_s = LIVE_S
    labels = {
        "summaries": "alice floods summaries (slow upstream)",
        "live": f"alice keeps {USER_LIMIT} live turns running (her limit)",
        "backlog": f"alice, carol and dave at their limit ({3 * USER_LIMIT} > {CONCURRENCY} slots)",
    }
    section = Section(
        "noisy-neighbour",
        "10. Noisy neighbour",
        intro=f"""
Bob's first token while other users flood the deployment, against bob's first token on
the quiet system, measured in the same run. Its own processes: one API and one worker
(`BERNARD_WORKER_CONCURRENCY={CONCURRENCY}`, `BERNARD_MAX_ACTIVE_TURNS_PER_USER={USER_LIMIT}`,
the background defaults: 4 jobs per user, 500 per deployment, 25 % of a worker's slots),
four users with keys, prompts of 3,000 tokens with a summary threshold of 20 messages.
Bob sends {len(quiet)} turns on the quiet system (half before the floods, half after) and
{bench.sizes.noisy_turns} beside each flood, one at a time ({TURN_TOKENS} tokens, echoed
at once). **Summaries**: alice sends requests of {CROWDED} messages, one after another
({FLOOD_GAP_S * 1000:g} ms apart), each in a new conversation, so each asks for a summary
(beyond her budget it is not queued); the upstream answers a summary
call after {SLOW_SUMMARY_S:g} s, and bob starts {SLOW_SUMMARY_S:g} s into the flood (by then,
without the background share, summaries would hold every slot). **Live**: alice keeps
{USER_LIMIT} streaming turns running ({LIVE_TOKENS} tokens
{LIVE_DELAY_MS:g} ms apart, {live_s:g} s each), starting the next as each ends (the loops
start {_SPACING_S * 1000:.0f} ms apart, so turns end as evenly spread).
**Backlog**: alice, carol and dave do the same, {3 * USER_LIMIT} turns for
{CONCURRENCY} slots, so about {3 * USER_LIMIT - CONCURRENCY} always wait: bob's turn
waits for the next slot to free (a slot frees every {live_s * 1000 / CONCURRENCY:.0f} ms
on average), not for the backlog (queue order would put it behind about
{(3 * USER_LIMIT - CONCURRENCY) * live_s / CONCURRENCY:.1f} s of it). Target for the first
two: within {RATIO_BOUND:g}× the quiet figure, or at most {ADDED_MEDIAN_MS:g} ms (median)
and {ADDED_P99_MS:g} ms (p99) more.
""",
    )
    quiet_summary = Summary.of(t.first_token_ms for t in quiet)
    table = Table(
        [
            "bob's turns",
            *SUMMARY_HEADERS,
            "median ratio",
            "p99 ratio",
            "enqueue → start median, p99",
            "exact",
        ],
        title="Bob's time to first content frame (ms)",
    )
    exact, _ = check_all(quiet)
    table.add(
        "quiet",
        *summary_cells(quiet_summary),
        "1.00",
        "1.00",
        _pickup(pickups["quiet"]),
        f"{exact}/{len(quiet)}",
    )
    for key, turns in rows.items():
        summary = Summary.of(t.first_token_ms for t in turns)
        median_ratio = ratio(summary.median, quiet_summary.median)
        p99_ratio = ratio(summary.p99, quiet_summary.p99)
        exact, problems = check_all(turns)
        table.add(
            f"beside: {labels[key]}",
            *summary_cells(summary),
            f"{median_ratio:.2f}",
            f"{p99_ratio:.2f}",
            _pickup(pickups[key]),
            f"{exact}/{len(turns)}",
        )
        if exact != len(turns):
            bench.failures.append(f"noisy-neighbour: {key}: " + "; ".join(problems))
        if key == "backlog":
            fifo_ms = (3 * USER_LIMIT - CONCURRENCY) * live_s / CONCURRENCY * 1000
            section.verdicts += [
                Verdict(
                    f"beside a backlog: median < ¼ of the backlog's wait ({fifo_ms:.0f} ms)",
                    f"{ms(summary.median)} ms",
                    summary.median < fifo_ms / 4,
                ),
                Verdict(
                    f"beside a backlog: p99 < ½ of the backlog's wait ({fifo_ms:.0f} ms)",
                    f"{ms(summary.p99)} ms",
                    summary.p99 < fifo_ms / 2,
                ),
            ]
            continue
        added_median = summary.median - quiet_summary.median
        added_p99 = summary.p99 - quiet_summary.p99
        section.verdicts += [
            Verdict(
                f"beside {key}: median ≤ {RATIO_BOUND:g}× quiet or ≤ +{ADDED_MEDIAN_MS:g} ms",
                f"{median_ratio:.2f}× ({added_median:+.2f} ms)",
                median_ratio <= RATIO_BOUND or added_median <= ADDED_MEDIAN_MS,
            ),
            Verdict(
                f"beside {key}: p99 ≤ {RATIO_BOUND:g}× quiet or ≤ +{ADDED_P99_MS:g} ms",
                f"{p99_ratio:.2f}× ({added_p99:+.2f} ms)",
                p99_ratio <= RATIO_BOUND or added_p99 <= ADDED_P99_MS,
            ),
        ]
    section.tables.append(table)
    floods = "; ".join(
        f"{key}: " + ", ".join(f"{n} × HTTP {status}" for status, n in sorted(counted.items()))
        for key, counted in statuses.items()
    )
    section.notes += [
        f"The floods' own requests: {floods} (a 429 is a turn over the user's limit, "
        "tried again 50 ms later).",
        "Cores busy outside the run's processes while bob's turns of each row ran (other "
        "work on the machine, which the rows' differences may owe something to): "
        + ", ".join(
            f"{key} {' and '.join(f'{cores:.2f}' for cores in busy)}" for key, busy in loads.items()
        )
        + ".",
        f"Sampled every 50 ms during the floods: alice held at most {peaks['alice']} "
        f"background jobs (queued or running; her budget is 4), the deployment at most "
        f"{peaks['queue']}, and at most {peaks['waiting']} jobs waited on the queue.",
    ]
    return section


def _pickup(summary: Summary) -> str:
    return f"{ms(summary.median)}, {ms(summary.p99)}"
