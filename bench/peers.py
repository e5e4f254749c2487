"""Bernard's CPU per paced turn beside its peer's (`python -m bench --only peers`).

The same paced answers (a token every 20 ms, as a model streams them) through three systems
on the run's upstream, one after the other and round by round so drift hits all alike:
Bernard (API, worker and Redis), the in-process baseline (bench/baseline.py: Bernard's turn
with no queue, stream or relay), and LangGraph used as a library in one FastAPI process
(bench/langgraph_app.py). Each is judged by the CPU its own processes spent per turn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.processes import Service
from bench.report import Section, Table, Verdict, ms
from bench.runner import Bench, Meter, check_all, drive, echo_directives
from bench.stats import Summary

BERNARD = "Bernard (API + worker + Redis)"
BASELINE = "baseline: Bernard's turn in one process"
LANGGRAPH = "LangGraph as a library, one FastAPI process"
NAMES = (BERNARD, BASELINE, LANGGRAPH)
# Each system's kind of stream, for bench.runner.check_turn ("pipeline" checks the SSE ids
# a relay sends).
_SYSTEMS = {BERNARD: "pipeline", BASELINE: "baseline", LANGGRAPH: "langgraph"}


@dataclass(frozen=True, slots=True)
class PeerRun:
    """One system's load: its processes' CPU per turn, in ms, and the streams not exact."""

    cpu_ms: dict[str, float]
    problems: int

    @property
    def total_ms(self) -> float:
        return sum(self.cpu_ms.values())


def _services(bench: Bench, name: str) -> list[Service]:
    """The processes `name` runs on, the one clients call first."""
    cluster = bench.cluster
    services = {
        BERNARD: [cluster.apis[0], cluster.workers[0], cluster.redis_proc],
        BASELINE: [cluster.baseline],
        LANGGRAPH: [cluster.langgraph],
    }[name]
    return [s for s in services if s is not None]


async def _run(bench: Bench, name: str, count: int) -> PeerRun:
    sizes = bench.sizes
    services = _services(bench, name)
    delay_ms = 1000 / sizes.peers_rate
    directives = echo_directives("peers", count, sizes.peers_tokens, delay_ms)
    task = bench.ui.task(f"peers: {name}", len(directives))
    meter = await Meter(bench).start()
    turns = await drive(
        [services[0].endpoint],
        directives,
        system=_SYSTEMS[name],
        concurrency=sizes.peers_at_once,
        stagger_s=delay_ms / 1000,
        on_done=lambda _t: bench.ui.advance(task),
    )
    await meter.stop()
    bench.ui.done(task)
    exact, _ = check_all(turns)
    cpu = {s.name: meter.cpu.get(s.name, math.nan) * 1000 / len(turns) for s in services}
    return PeerRun(cpu, len(turns) - exact)


async def peers(bench: Bench) -> Section:
    sizes = bench.sizes
    if bench.cluster.langgraph is None:
        await bench.cluster.start_langgraph()
    names = list(NAMES)
    for name in names:  # lazy imports, connections, the graph's first run
        await _run(bench, name, sizes.peers_at_once)
    runs: dict[str, list[PeerRun]] = {name: [] for name in names}
    for i in range(sizes.peers_repeats):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            runs[name].append(await _run(bench, name, sizes.peers_turns))

    table = Table(
        ["system", "CPU ms / turn (median, range)", "of it: per process", "streams not exact"],
        title=(
            f"CPU per turn: {sizes.peers_turns} answers of {sizes.peers_tokens} tokens, "
            f"{sizes.peers_at_once} at once, {sizes.peers_rate:g} tokens/s each"
        ),
    )
    medians: dict[str, float] = {}
    for name in names:
        totals = Summary.of(r.total_ms for r in runs[name])
        medians[name] = totals.median
        parts = ", ".join(
            f"{process} {ms(Summary.of(r.cpu_ms[process] for r in runs[name]).median, 1)}"
            for process in runs[name][0].cpu_ms
        )
        table.add(
            name,
            f"{ms(totals.median, 1)} ({ms(totals.min, 1)}–{ms(totals.max, 1)})",
            parts,
            sum(r.problems for r in runs[name]),
        )
    section = Section(
        "peers",
        "12. CPU per turn beside LangGraph used as a library",
        intro=f"""
The same paced chat turns ({sizes.peers_tokens} tokens, one every
{1000 / sizes.peers_rate:g} ms; the calculator offered, no tool called: one model call each)
through each system on the run's upstream, {sizes.peers_repeats} runs each, round by round.
CPU is user + system from /proc of the system's own processes over the run, divided by its
turns; Bernard's counts its Redis server too (not when the run uses a Redis it did not start).
Bernard stores each turn (its record, the conversation's messages) and LangGraph's agent,
without a checkpointer, stores nothing.
""",
    )
    section.tables.append(table)
    section.verdicts.append(
        Verdict(
            f"CPU per {sizes.peers_tokens}-token turn, Redis included: Bernard at or below "
            "LangGraph as a library",
            f"{ms(medians[BERNARD], 1)} ms against {ms(medians[LANGGRAPH], 1)}",
            None if math.isnan(medians[BERNARD]) else medians[BERNARD] <= medians[LANGGRAPH],
        )
    )
    return section
