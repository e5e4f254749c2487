"""One metered load through 1 API + 1 worker (bench/cost.py, bench/paced.py): the turns,
the wall time, each process's CPU and the Redis commands, optionally with py-spy on the API
and the worker."""

from __future__ import annotations

import math
import time
from pathlib import Path

from bench.client import request
from bench.flames import Profile
from bench.runner import Bench, Meter, Turn, drive, echo_directives, is_delta, wait_idle


class Run:
    """One load through 1 API + 1 worker: the turns, the wall time and each process's CPU."""

    def __init__(self, turns: list[Turn], seconds: float, meter: Meter, tokens: int) -> None:
        self.turns = turns
        self.seconds = seconds
        self.meter = meter
        self.tokens = tokens
        self.frames = sum(1 for t in turns for f in t.call.frames if is_delta(f.data))

    def cpu(self, bench: Bench, role: str) -> float:
        name = {
            "worker": bench.cluster.workers[0].name,
            "api": bench.cluster.apis[0].name,
            "redis": "redis",
        }[role]
        return self.meter.cpu.get(name, math.nan)

    @property
    def commands(self) -> int:
        """Commands Redis executed over the run (those Lua scripts ran counted too)."""
        return self.meter.cost.total

    @property
    def concurrency(self) -> float:
        """How many turns were open at once on average: their time summed over the wall."""
        open_s = sum(
            t.call.ended_at - t.call.sent_at for t in self.turns if t.call.ended_at is not None
        )
        return open_s / self.seconds if self.seconds else math.nan


async def load(
    bench: Bench,
    streams: int,
    tokens: int,
    profile_dir: Path | None = None,
    *,
    delay_ms: float = 0.0,
    prefix: str = "cost",
) -> tuple[Run, dict[str, list[tuple[str, int]]]]:
    """`streams` turns at once of `tokens` tokens, the upstream sending one every `delay_ms`
    (0: as fast as it can); paced answers start spread over one token's time, as real ones
    do not all start in the same millisecond. With `profile_dir`, py-spy records the worker
    and the API (`<prefix>-worker.txt`, `<prefix>-api.txt` there) and their stacks come back."""
    directives = echo_directives(prefix, streams, tokens, delay_ms)
    pace = f" at {1000 / delay_ms:g} tokens/s" if delay_ms else ""
    task = bench.ui.task(f"{prefix}: {streams} × {tokens} tokens{pace}", len(directives))
    profiles: dict[str, Profile] = {}
    if profile_dir is not None:
        for role, service in (("worker", bench.cluster.workers[0]), ("api", bench.cluster.apis[0])):
            profile = Profile.start(service.pid, profile_dir / f"{prefix}-{role}.txt")
            if profile is not None:
                profiles[role] = profile
    meter = await Meter(bench).start()
    started = time.monotonic()
    turns = await drive(
        [bench.api],
        directives,
        system="pipeline",
        concurrency=streams,
        stagger_s=delay_ms / 1000,
        on_done=lambda _t: bench.ui.advance(task),
    )
    seconds = time.monotonic() - started
    await meter.stop()
    stacks = {role: profile.stop() for role, profile in profiles.items()}
    bench.ui.done(task)
    await wait_idle(bench)
    await forget_exchanges(bench)
    return Run(turns, seconds, meter, streams * tokens), stacks


async def forget_exchanges(bench: Bench) -> None:
    """Have the upstream drop the exchanges it recorded (bench/upstream.py `/bench/reset`):
    it keeps every request it served, and a cost section's hundreds of thousands of chunks
    grew it from 150 to 384 MB. Nothing here reads them back (`/bench/exchange`)."""
    if bench.cluster.upstream is not None:
        await request(bench.cluster.upstream.endpoint, "POST", "/bench/reset")
