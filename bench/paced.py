"""Paced tokens: what a token costs when the upstream streams each answer at a
model's pace, so that each token travels alone through the worker, Redis and the API.

Each row runs its answers twice at the same pace and concurrency, short and long; the
difference is what the tokens cost, free of what a turn costs whatever its length (router
call, records, claims, the queue). Called by bench/cost.py's section.
"""

from __future__ import annotations

import math

from bench.flames import summarize
from bench.loads import Run, load
from bench.report import Section, Table, Verdict, num
from bench.runner import Bench, check_all

# Targets of issue 25, per paced token.
API_US = 40
WORKER_US = 40
REDIS_US = 10
COMMANDS = 1.5
_ROLES = ("api", "worker", "redis")


def _per_token(long: float, short: float, tokens: int) -> float:
    return (long - short) / tokens if tokens > 0 else math.nan


def _worst(values: list[float]) -> float:
    return math.nan if any(math.isnan(v) for v in values) else max(values)


async def paced_rows(bench: Bench, section: Section) -> None:
    """Run the paced rows of `bench.sizes.paced_runs`; add their table, the profile of the
    first row's long answers, and the targets' verdicts to `section`."""
    sizes = bench.sizes
    table = Table(
        [
            "answers at once",
            "tokens/s each",
            "tokens/answer",
            "open at once (mean)",
            "tokens/frame",
            "API µs/token",
            "worker µs/token",
            "Redis µs/token",
            "commands/token",
            "all-in API / worker / Redis µs",
            "exact",
        ],
        title="CPU per paced token, 1 API + 1 worker (the long run less the short, per token)",
    )
    rows: list[tuple[str, dict[str, float], float]] = []
    for streams, rate, short_tokens, long_tokens in sizes.paced_runs:
        delay_ms = 1000 / rate
        short, _ = await load(bench, streams, short_tokens, delay_ms=delay_ms, prefix="paced")
        long, _ = await load(bench, streams, long_tokens, delay_ms=delay_ms, prefix="paced")
        added = long.tokens - short.tokens
        per = {
            role: _per_token(long.cpu(bench, role), short.cpu(bench, role), added) * 1e6
            for role in _ROLES
        }
        commands = _per_token(long.commands, short.commands, added)
        all_in = " / ".join(num(long.cpu(bench, role) / long.tokens * 1e6) for role in _ROLES)
        exact, problems = check_all([*short.turns, *long.turns])
        total = len(short.turns) + len(long.turns)
        table.add(
            num(streams),
            f"{rate:g}",
            f"{short_tokens} / {long_tokens}",
            f"{short.concurrency:,.0f} / {long.concurrency:,.0f}",
            f"{long.tokens / max(long.frames, 1):.2f}",
            num(per["api"]),
            num(per["worker"]),
            num(per["redis"], 1),
            f"{commands:.2f}",
            all_in,
            f"{exact}/{total}",
        )
        rows.append((f"{streams:,} × {rate:g}/s", per, commands))
        if exact != total:
            bench.failures.append(f"paced: {streams} × {rate:g}/s lost exactness")
            for problem in problems[:3]:
                bench.ui.log(f"[red]paced: {problem}")
    section.tables.append(table)
    await _profile(bench, section)

    where = "; ".join(label for label, _, _ in rows)
    for role, target, label in (
        ("api", API_US, "API"),
        ("worker", WORKER_US, "worker"),
        ("redis", REDIS_US, "Redis"),
    ):
        values = [per[role] for _, per, _ in rows]
        worst = _worst(values)
        section.verdicts.append(
            Verdict(
                f"paced: {label} ≤ {target} µs CPU per paced token ({where})",
                " / ".join(num(v, 1 if role == "redis" else 0) for v in values) + " µs",
                None if math.isnan(worst) else worst <= target,
            )
        )
    counts = [commands for _, _, commands in rows]
    section.verdicts.append(
        Verdict(
            f"paced: ≤ {COMMANDS} Redis commands per paced token ({where})",
            " / ".join(f"{c:.2f}" for c in counts),
            _worst(counts) <= COMMANDS,
        )
    )


async def _profile(bench: Bench, section: Section) -> None:
    """Where the API's and the worker's CPU goes on the first row's long answers: one more
    run of them, under py-spy (its figures are not in the table: sampling costs CPU)."""
    streams, rate, _, tokens = bench.sizes.paced_runs[0]
    run: Run
    run, stacks = await load(
        bench, streams, tokens, bench.workdir, delay_ms=1000 / rate, prefix="paced-profile"
    )
    for role, samples in stacks.items():
        packages, functions = summarize(samples)
        if packages:
            section.notes.append(
                f"Where the {role}'s CPU went with {streams:,} answers at {rate:g} tokens/s "
                f"(py-spy, {sum(c for _, c in samples):,} samples over {run.seconds:.1f} s; "
                f"self time): by package {', '.join(packages)}; busiest functions "
                f"{', '.join(functions)}."
            )
