"""Redis commands per turn, counted at the server: `python -m bench --only turn-commands`.

Sequential chat turns (no tool) and one-tool turns (the calculator), each kind over a
stretch of its own, the system idle between two turns, then an idle stretch as long. Per
turn, with the idle stretch's taken out:

- **sent**: the commands the clients sent, as MONITOR saw them, a script's own commands
  left out (EVALSHA and EVAL are one each, a pipeline of five commands five, MULTI and
  EXEC one each): what the round trips carry;
- **executed**: what Redis ran (`INFO commandstats`, which counts a script's commands too);
- **socket reads**: the reads Redis made of its clients (`INFO stats`
  `total_reads_processed`): a pipeline is one, so this is about the round trips themselves.

MONITOR names each command's process (by its connection's port) and each script (by its
SHA1, against every Lua script of Bernard's modules), and `phase_of` files every command
under the part of a turn's life it serves; a script's commands go with the script.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import re
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from bench.client import request
from bench.measurements import _ports_by_process
from bench.processes import ROOT, Cluster
from bench.report import Section, Table, Verdict
from bench.runner import Bench, RedisCost, Turn, check_turn, command_counts, new_tag, start_turn
from bench.upstream import Directive
from shared import keys

KINDS = {
    "chat": "chat turn (no tool)",
    "tool": "one-tool turn (the calculator)",
    "titled": "chat turn and its title job",
}
# The kinds the target is on; a titled turn is shown beside them (titles are off in the
# run's processes: bench/processes.py `BENCH_ENV`).
JUDGED = ("chat", "tool")
# The commands sent per turn the issue asks for at most, for either kind.
TARGET_SENT = 40
# How long the system is left idle after each turn, before the next (its tail: the job's
# end, the releases, lands well within it; a title job, within the longer gap).
GAP_S = {"chat": 0.25, "tool": 0.25, "titled": 1.0}
# Commands of the bench's own, which no process of the run sends.
_OWN = frozenset({"info", "monitor"})

# -- what MONITOR saw ---------------------------------------------------------------------

_LINE = re.compile(rb"^(\d+\.\d+) \[\d+ ([^\]]+)\] (.*)$", re.S)
_ARG = re.compile(rb'"((?:[^"\\]|\\.)*)"', re.S)
_ESCAPE = re.compile(rb"\\(x[0-9a-fA-F]{2}|.)", re.S)
_ESCAPES = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"a": b"\a", b"b": b"\b"}


def _unescape(raw: bytes) -> bytes:
    """An argument as sent, from MONITOR's quoted form (Redis's `sdscatrepr`)."""

    def one(match: re.Match[bytes]) -> bytes:
        code = match.group(1)
        if code.startswith(b"x") and len(code) == 3:
            return bytes([int(code[1:], 16)])
        return _ESCAPES.get(code, code)

    return _ESCAPE.sub(one, raw)


@dataclass(frozen=True, slots=True)
class Seen:
    """One command MONITOR saw: when (epoch s), from which client (`lua` for a script's
    own) and its arguments, the command's name first."""

    at: float
    client: str
    args: tuple[bytes, ...]

    @property
    def name(self) -> str:
        return self.args[0].decode(errors="replace").upper() if self.args else ""

    def arg(self, index: int) -> str:
        return self.args[index].decode(errors="replace") if len(self.args) > index else ""


def parse(line: bytes) -> Seen | None:
    """A MONITOR line as a `Seen` (None for anything else)."""
    match = _LINE.match(line)
    if match is None:
        return None
    at, client, rest = match.groups()
    args = tuple(_unescape(arg) for arg in _ARG.findall(rest))
    return Seen(float(at), client.decode(), args)


@dataclass
class Stretch:
    """What one stretch of the run cost: the commands MONITOR saw (with each client's
    process), the counts `INFO commandstats` gained, the socket reads Redis made."""

    seconds: float
    seen: list[tuple[str, Seen]]
    executed: RedisCost
    reads: int
    starts: list[float] = field(default_factory=list)  # each turn's request (epoch s)


async def _reads(bench: Bench) -> int:
    stats: dict[str, Any] = await bench.redis.info("stats")
    return int(stats["total_reads_processed"])


@contextlib.asynccontextmanager
async def monitor_lines(client: Redis) -> AsyncIterator[list[bytes]]:
    """The lines MONITOR sends `client` while the block runs, as they come (parse each with
    `parse`); `client` is closed after."""
    lines: list[bytes] = []
    ready = asyncio.Event()

    async def listen() -> None:
        async with client.monitor() as monitor:
            ready.set()
            while True:
                lines.append(await monitor.connection.read_response(disable_decoding=True))

    listener = asyncio.create_task(listen())
    await ready.wait()
    try:
        yield lines
    finally:
        await asyncio.sleep(0.1)  # the last lines reach the listener
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
        await client.aclose()


@contextlib.asynccontextmanager
async def metered(bench: Bench, cluster: Cluster | None = None) -> AsyncIterator[Stretch]:
    """Count every Redis command while the block runs; the `Stretch` it yields is filled
    once the block exits. Only the commands of the run's processes, or `cluster`'s, are
    listed (and their scripts'): the bench's own INFO calls are neither listed nor counted."""
    async with monitor_lines(bench.cluster.redis()) as lines:
        await asyncio.sleep(0.2)  # MONITOR's own OK and set-up settle before the count starts
        ports = _ports_by_process(bench, cluster)
        stretch = Stretch(0.0, [], RedisCost({}, 0.0), 0)
        before, reads = await command_counts(bench.redis), await _reads(bench)
        began = time.monotonic()
        first = len(lines)
        try:
            yield stretch
        finally:
            stretch.seconds = time.monotonic() - began
            after, reads_after = await command_counts(bench.redis), await _reads(bench)
    ports.update(_ports_by_process(bench, cluster))  # connections opened meanwhile
    diff = {k: v - before.get(k, 0) for k, v in after.items() if k not in _OWN}
    stretch.executed = RedisCost({k: v for k, v in diff.items() if v}, stretch.seconds)
    # Two INFO calls of ours in between, each one read.
    stretch.reads = reads_after - reads - 2
    owner = "?"
    for raw in lines[first:]:
        seen = parse(raw if isinstance(raw, bytes) else str(raw).encode())
        if seen is None:
            continue
        if seen.client == "lua":
            who = owner  # a script's commands follow the script's own line
        else:
            owner = ports.get(seen.client.rsplit(":", 1)[-1], "?")
            who = owner
        if who != "?":
            stretch.seen.append((who, seen))


# -- which script, which phase ------------------------------------------------------------


def _script_modules(root: Path) -> list[str]:
    """The modules that may hold a Lua script: every one of shared/ (some build theirs out
    of another's pieces), and those of api/, worker/ and compat/ that name `redis.call`."""
    names = []
    for package in ("shared", "api", "worker", "compat"):
        for path in sorted((root / package).rglob("*.py")):
            if package == "shared" or "redis.call" in path.read_text():
                names.append(".".join(path.relative_to(root).with_suffix("").parts))
    return names


def script_names(root: Path = ROOT) -> dict[str, str]:
    """SHA1 → `module.NAME` of every Lua script a module of Bernard's holds: a module-level
    string with a `redis.call` in it, or such a string in a dict (`NAME[key]`, a key that is
    itself a script named by that script's name)."""
    names: dict[str, str] = {}
    tables: list[tuple[str, dict[Any, Any]]] = []

    def name(text: str, label: str) -> None:
        names.setdefault(hashlib.sha1(text.encode()).hexdigest(), label)

    for module_name in _script_modules(root):
        short = module_name.rsplit(".", 1)[-1]
        for attr, value in vars(importlib.import_module(module_name)).items():
            if isinstance(value, str) and "redis.call" in value:
                name(value, f"{short}.{attr}")
            elif isinstance(value, dict):
                tables.append((f"{short}.{attr}", value))
    for label, table in tables:
        for key, text in table.items():
            if isinstance(text, str) and "redis.call" in text:
                known = isinstance(key, str) and names.get(hashlib.sha1(key.encode()).hexdigest())
                name(text, f"{label}[{known or key}]")
    return names


# Phases in the order of a turn's life; `idle` is what runs whether or not a turn does.
PHASES = (
    "admission",
    "stream slot",
    "conversation",
    "create",
    "enqueue",
    "pickup",
    "arq job",
    "claim",
    "context reads",
    "records",
    "stream",
    "relay",
    "finish",
    "release",
    "background jobs",
    "idle",
    "other",
)

# Scripts by phase (`script_names`' names).
_SCRIPT_PHASES = {
    "admission._ADMIT": "admission",
    "budgets._USAGE": "admission",
    "lifecycle.CREATE": "create",
    "budgets._KEEP_TURN": "create",
    "queue._TAKE": "pickup",
    "queue._TAKE_BACKGROUND": "background jobs",
    "writes._SAVE_TITLE": "background jobs",
    "queue._RELEASE_BACKGROUND": "background jobs",
    "reads._META": "background jobs",
    "lifecycle.CLAIM": "claim",
    "liveness._CLAIMING": "claim",
    "moves._RELEASE": "release",
    "writes._APPEND": "records",
    "writes._AMEND": "records",
    "writes._WINDOW": "records",
    "notes._ALL": "context reads",
    "hub._WAKE": "relay",
    "budgets.ACCOUNT": "records",
    "writes.COUNTED[writes._APPEND]": "records",
    "writes.COUNTED[writes._AMEND]": "records",
    "lifecycle.FINISH": "finish",
    "conversation_state.SCRIPTS[advance]": "finish",
    "queue._ENQUEUE_BACKGROUND": "background jobs",
    "arq._FINISH_JOB": "arq job",
    "liveness.KEEP": "idle",
    "liveness._FORGET_WORKER": "idle",
}


def _phase_of_script(name: str, key: str) -> str:
    if name in _SCRIPT_PHASES:
        return _SCRIPT_PHASES[name]
    if name == "scripts.INDEX":  # the owner's index of conversations, or of turns
        return "conversation" if key.endswith(":conversations") else "create"
    if name.startswith("conversation_state."):
        return "conversation"
    if name == "scripts.TAKE_SLOT":
        return "stream slot"
    return "other"


def phase_of(process: str, seen: Seen, scripts: dict[str, str], queue_name: str) -> tuple[str, str]:
    """The phase of a turn's life a command serves, and its label (its name, or the
    script's); a script's own commands are its script's (the caller's)."""
    name = seen.name
    if name in ("EVALSHA", "EVAL"):
        body = seen.args[1] if len(seen.args) > 1 else b""
        sha = body.decode().lower() if name == "EVALSHA" else hashlib.sha1(body).hexdigest()
        script = scripts.get(sha, f"script {sha[:8]}")
        if script == "scripts.TAKE_SLOT" and ":active" in seen.arg(3):
            return "admission", script
        if script == "queue._ENQUEUE":  # a turn's job (the API's), or a webhook's
            return ("enqueue" if process.startswith("api") else "background jobs"), script
        return _phase_of_script(script, seen.arg(3)), script
    key = seen.arg(1)
    label = name
    wake = keys.wake(queue_name)
    if name in ("MULTI", "EXEC") or key.startswith(("arq:retry:", "arq:in-progress:", "arq:abort")):
        return "arq job", label
    if key.startswith("arq:job:"):
        return ("enqueue" if process.startswith("api") else "arq job"), label
    if key == wake or key.startswith(f"{queue_name}:owner:"):
        return ("enqueue" if process.startswith("api") else "pickup"), label
    if key == queue_name:
        if name == "ZADD" and process.startswith("api"):
            return "enqueue", label
        if name == "ZRANGEBYSCORE":
            return "pickup", label
        if name == "ZCARD":
            return "idle", label  # arq's health check
        return "arq job", label
    if name == "BLPOP":
        return "pickup", label
    if key == f"{queue_name}:health-check":
        return "idle", label  # arq's
    if key.startswith(keys.hub_wake("")):
        return "relay", label  # a new reader wakes its hub lane
    if key.startswith(("arq:", keys.WORKERS)) or name in (
        "INFO",
        "PING",
        "CLIENT",
        "SUBSCRIBE",
        "SSUBSCRIBE",
    ):
        return "idle", label
    if name == "XREAD":
        return "relay", label
    if key == keys.RUNNING_TURNS:
        if name == "ZADD":
            return "claim", label
        if name == "ZREM":
            return "release", label
        return "idle", label  # the reapers
    if ":worker:" in key:
        return ("claim" if name in ("SADD", "EXPIRE") else "idle"), label
    if key == keys.METRICS or key.endswith((":active", ":kept")):
        return "release", label
    if key.endswith(":streams"):
        return "stream slot", label
    if key.endswith(":background"):  # the owner's and the queue's background slots
        return "background jobs", label
    if key.endswith(":turns") and key.startswith(f"{keys.PREFIX}:user:"):
        return "create", label
    if key.endswith(":conversations"):
        return "conversation", label
    if key.endswith((":notes", ":summary")):
        return "context reads", label
    if key.endswith((":conversation", ":messages", ":calls", ":proposals")):
        # A turn's own reads and writes are scripts: a worker's plain ones are its
        # background jobs' (a title's, a summary's).
        return ("admission" if process.startswith("api") else "background jobs"), label
    if key.endswith(":events"):
        return ("stream" if process.startswith("worker") else "relay"), label
    if key.endswith((":turn", ":attached", ":cancel")):
        return ("relay" if process.startswith("api") else "finish"), label
    if key.startswith((keys.TOOLS, keys.DEPLOYMENT, keys.MCP_SERVERS, keys.CANCELS)):
        return "idle", label
    return "other", label


# -- the counts -----------------------------------------------------------------------------


@dataclass
class Counts:
    """One stretch's commands, by (phase, label): sent, and executed (a script's with it)."""

    sent: Counter[tuple[str, str]] = field(default_factory=Counter)
    executed: Counter[tuple[str, str]] = field(default_factory=Counter)
    by_process: Counter[str] = field(default_factory=Counter)

    @classmethod
    def of(cls, stretch: Stretch, scripts: dict[str, str], queue_name: str) -> Counts:
        counts = cls()
        current = ("other", "?")
        for process, seen in stretch.seen:
            if seen.client == "lua":
                counts.executed[current] += 1
                continue
            current = phase_of(process, seen, scripts, queue_name)
            counts.sent[current] += 1
            counts.executed[current] += 1
            counts.by_process[process.rstrip("0123456789")] += 1
        return counts

    def sent_in(self, phase: str) -> int:
        return sum(n for (p, _), n in self.sent.items() if p == phase)

    def executed_in(self, phase: str) -> int:
        return sum(n for (p, _), n in self.executed.items() if p == phase)


@dataclass
class KindResult:
    """One kind of turn: its stretch, the idle stretch after it, and how many turns."""

    kind: str
    turns: int
    busy: Stretch
    idle: Stretch
    counts: Counts
    idle_counts: Counts
    problems: list[str]
    queue_name: str

    def per_turn(self, busy: float, idle: float) -> float:
        """A busy stretch's figure per turn, the idle stretch's (scaled to the same
        length) taken out."""
        scale = self.busy.seconds / self.idle.seconds if self.idle.seconds else 1.0
        return (busy - idle * scale) / self.turns

    @property
    def sent(self) -> float:
        return self.per_turn(sum(self.counts.sent.values()), sum(self.idle_counts.sent.values()))

    @property
    def executed(self) -> float:
        return self.per_turn(self.busy.executed.total, self.idle.executed.total)

    @property
    def reads(self) -> float:
        return self.per_turn(self.busy.reads, self.idle.reads)


def _directive(kind: str) -> Directive:
    """A turn of `kind` answering at once: one token, the calculator first for a tool turn."""
    return Directive(
        tag=new_tag("tc"), mode="clock", tokens=1, tool="calculator" if kind == "tool" else ""
    )


async def _turn(bench: Bench, cluster: Cluster, kind: str) -> str | None:
    """Run one turn of `kind` through `cluster`'s API to its end; what is wrong with it."""
    directive = _directive(kind)
    turn: Turn = await start_turn(cluster.apis[0].endpoint, directive, "pipeline")
    await turn.call.finished
    problem = check_turn(turn)
    assert bench.cluster.upstream is not None
    calls = (
        await request(bench.cluster.upstream.endpoint, "GET", f"/bench/calls?tag={directive.tag}")
    ).json()
    assert isinstance(calls, dict)
    if problem is None and calls["tool_results"] != (kind == "tool"):
        problem = "the tool ran" if calls["tool_results"] else "the tool never ran"
    return problem


async def measure_kind(
    bench: Bench, cluster: Cluster, kind: str, turns: int, scripts: dict[str, str]
) -> KindResult:
    """`turns` sequential turns of `kind` through `cluster` under MONITOR, then an idle
    stretch as long; `cluster`'s commands counted."""
    for _ in range(3):  # warm: connections, lazy imports, the scripts loaded
        await _turn(bench, cluster, kind)
    await asyncio.sleep(1.0 + GAP_S[kind])
    problems: list[str] = []
    async with metered(bench, cluster) as busy:
        for _ in range(turns):
            busy.starts.append(time.time())
            problem = await _turn(bench, cluster, kind)
            if problem is not None:
                problems.append(problem)
            await asyncio.sleep(GAP_S[kind])
    async with metered(bench, cluster) as idle:
        await asyncio.sleep(busy.seconds)
    queue_name = cluster.queue_name
    return KindResult(
        kind,
        turns,
        busy,
        idle,
        Counts.of(busy, scripts, queue_name),
        Counts.of(idle, scripts, queue_name),
        problems,
        queue_name,
    )


def _listing(result: KindResult, scripts: dict[str, str]) -> str:
    """Every command of the stretch's last turn, from its request to the end of the
    stretch, in order: ms after the request, process, phase, command."""
    start = result.busy.starts[-1]
    rows = []
    current = ("other", "?")
    for process, seen in result.busy.seen:
        if seen.at < start:
            continue
        if seen.client != "lua":
            current = phase_of(process, seen, scripts, result.queue_name)
            where = f"{process} | {current[0]}"
        else:
            where = f"{process} (script) | {current[0]}"
        text = " ".join(_printable(arg)[:40] for arg in seen.args[:6])
        rows.append(
            f"| {(seen.at - start) * 1000:.1f} | {where} | `{text[:110].replace('|', '/')}` |"
        )
    return "\n".join(
        [
            f"<details><summary>Every command of the last {KINDS[result.kind]} of the stretch "
            "(MONITOR), from its request until the next would have started</summary>",
            "",
            "| ms after the request | process | phase | command |",
            "|---|---|---|---|",
            *rows,
            "",
            "</details>",
        ]
    )


def _printable(arg: bytes) -> str:
    return "".join(c if c.isprintable() else "?" for c in arg.decode(errors="replace"))


def _f(value: float) -> str:
    return f"{value:.1f}"


async def _titled(bench: Bench) -> Cluster:
    """An API and a worker with conversation titles on, on the run's Redis and upstream and
    a queue of their own: each chat completion starts a conversation, and its first answer
    asks for its title (worker/titles.py)."""
    return await bench.cluster.beside({"BERNARD_CONVERSATION_TITLES": "true"}, "titled", counter=80)


async def turn_commands(bench: Bench) -> Section:
    """Redis commands per chat turn and one-tool turn, at the server, idle taken out."""
    turns = 20 if bench.sizes.name == "full" else 5
    scripts = script_names()
    results = {
        kind: await measure_kind(bench, bench.cluster, kind, turns, scripts) for kind in JUDGED
    }
    titled = await _titled(bench)
    try:
        results["titled"] = await measure_kind(bench, titled, "titled", turns, scripts)
    finally:
        titled.stop_own()
    section = Section(
        "turn-commands",
        "Redis commands per turn",
        intro=f"""
{turns} sequential turns of each kind through 1 API + 1 worker on the run's own Redis, each
answering at once (one token; a one-tool turn first calls the calculator), the system left
idle {GAP_S["chat"]:g} s after each; then an idle stretch as long, whose commands are taken
out of the turns' (and shown apart below). The run's processes have conversation titles off
(`BENCH_ENV`); the titled chat turns go through an API and a worker of their own with them
on (`./run`'s default), each turn starting a conversation whose first answer queues its
title job, {GAP_S["titled"]:g} s apart, and only that pair's commands counted. **Sent**: the
commands the API and the worker sent, as MONITOR saw them, a script's own commands left out
(EVALSHA or EVAL is one, a pipeline of five commands five, MULTI and EXEC one each).
**Executed**: what Redis ran (`INFO commandstats`: a script's commands too). **Socket
reads**: the reads Redis made of its clients (`INFO stats` `total_reads_processed`): a
pipeline is one, so about the round trips. Phases are bench/turn_commands.py `phase_of`'s,
by command, key and script; a script's commands go with it.
""",
    )
    summary = Table(
        [
            "turn",
            "turns",
            "sent per turn",
            "of which API",
            "of which worker",
            "executed per turn",
            "executed (MONITOR)",
            "socket reads per turn",
        ],
        title="Per turn, idle taken out",
    )
    for kind, result in results.items():
        by_process = {
            who: result.per_turn(n, result.idle_counts.by_process[who] * 1.0)
            for who, n in result.counts.by_process.items()
        }
        summary.add(
            KINDS[kind],
            result.turns,
            f"**{_f(result.sent)}**",
            _f(by_process.get("api", 0.0)),
            _f(by_process.get("worker", 0.0)),
            f"**{_f(result.executed)}**",
            _f(
                result.per_turn(
                    sum(result.counts.executed.values()), sum(result.idle_counts.executed.values())
                )
            ),
            _f(result.reads),
        )
    section.tables.append(summary)

    phases = Table(
        ["phase", *(f"{kind}: sent" for kind in KINDS), *(f"{kind}: executed" for kind in KINDS)],
        title="Per turn, by phase (MONITOR; idle taken out)",
    )
    for phase in PHASES:
        cells = []
        for attr in ("sent_in", "executed_in"):
            for result in results.values():
                busy = getattr(result.counts, attr)(phase)
                idle = getattr(result.idle_counts, attr)(phase)
                cells.append(_f(result.per_turn(busy, idle)))
        if any(cell not in ("0.0", "-0.0") for cell in cells):
            phases.add(phase, *cells)
    section.tables.append(phases)

    detail = Table(
        [
            "phase",
            "command or script",
            *(f"{kind}: sent" for kind in KINDS),
            *(f"{kind}: executed" for kind in KINDS),
        ],
        title="Per turn, by phase and command (MONITOR; idle taken out)",
    )
    labels = sorted(
        {
            label
            for result in results.values()
            for label in (*result.counts.sent, *result.idle_counts.sent)
        },
        key=lambda pl: (PHASES.index(pl[0]), pl[1]),
    )
    for label in labels:
        cells = []
        for attr in ("sent", "executed"):
            for result in results.values():
                busy = getattr(result.counts, attr)[label]
                idle = getattr(result.idle_counts, attr)[label]
                cells.append(_f(result.per_turn(busy, idle)))
        if any(cell not in ("0.0", "-0.0") for cell in cells):
            detail.add(label[0], f"`{label[1]}`", *cells)
    section.tables.append(detail)

    idle_table = Table(
        [
            "phase",
            "command or script",
            *(f"after {kind}: sent/s" for kind in KINDS),
            *(f"after {kind}: executed/s" for kind in KINDS),
        ],
        title="Idle, 1 API + 1 worker: per second (the stretches after each kind's)",
    )
    idle_labels = sorted(
        {label for result in results.values() for label in result.idle_counts.sent},
        key=lambda pl: (PHASES.index(pl[0]), pl[1]),
    )
    for label in idle_labels:
        cells = [
            f"{getattr(result.idle_counts, attr)[label] / result.idle.seconds:.1f}"
            for attr in ("sent", "executed")
            for result in results.values()
        ]
        idle_table.add(label[0], f"`{label[1]}`", *cells)
    idle_table.add(
        "**total**",
        "",
        *(f"**{sum(r.idle_counts.sent.values()) / r.idle.seconds:.1f}**" for r in results.values()),
        *(f"**{r.idle.executed.total / r.idle.seconds:.1f}**" for r in results.values()),
    )
    section.tables.append(idle_table)

    by_command = Table(
        ["command", *(f"{kind}: executed per turn" for kind in KINDS)],
        title="Executed per turn, by command (`INFO commandstats`; idle taken out)",
    )
    names = sorted(
        {
            n
            for r in results.values()
            for n in (*r.busy.executed.commands, *r.idle.executed.commands)
        }
    )
    rows = []
    for name in names:
        values = [
            r.per_turn(r.busy.executed.commands.get(name, 0), r.idle.executed.commands.get(name, 0))
            for r in results.values()
        ]
        rows.append((name, values))
    for name, values in sorted(rows, key=lambda row: -max(row[1])):
        if any(abs(v) >= 0.05 for v in values):
            by_command.add(name, *(_f(v) for v in values))
    section.tables.append(by_command)

    for result in results.values():
        section.notes.append(_listing(result, scripts))
        judged = result.kind in JUDGED
        section.verdicts.append(
            Verdict(
                f"≤ {TARGET_SENT} commands sent per {KINDS[result.kind]}"
                + ("" if judged else " (titles on: shown, not judged)"),
                f"{result.sent:.1f} (executed {result.executed:.1f})",
                result.sent <= TARGET_SENT if judged else None,
            )
        )
        if result.problems:
            bench.failures.append(
                f"turn-commands: {len(result.problems)} {result.kind} turns wrong"
            )
            section.notes.append(
                f"{KINDS[result.kind]}: turns not as expected: " + "; ".join(result.problems[:5])
            )
    return section
