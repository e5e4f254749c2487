"""First token against the length of a conversation's history.

A conversation's turns read only the latest rows and build a prompt within the context
budget (worker/harness/memory.py), so a turn of a months-long conversation should start as
fast as one whose history just fills the prompt. This measurement stores conversations of a
few, a few hundred and thousands of exchanges directly in Redis (through the record keeper,
as the worker stores them), then times turns continuing each, interleaved.
"""

from __future__ import annotations

import time

from api.auth import LOCAL_USER
from bench.client import chat_body, connect, request_bytes
from bench.report import SUMMARY_HEADERS, Section, Table, Verdict, summary_cells
from bench.runner import CHAT, Bench, Turn, check_all, echo_directives, new_tag, wait_idle
from bench.stats import Summary
from shared.records.keeper import RecordKeeper

# The bound this measurement holds a long history's turns to, against a new conversation's.
FLAT_MEDIAN_MS = 5.0
_FILLER = (
    "and then we talked about the lights in the kitchen, the weather for the weekend, "
    "a timer for the pasta and what to buy on the way home"
)
_CHUNK = 500  # rows per append while building a history


async def _stored_conversation(bench: Bench, exchanges: int) -> str:
    keeper = RecordKeeper(bench.redis, LOCAL_USER, retention_s=3600)
    conversation_id = await keeper.create_conversation(new_tag("hist"))
    rows = []
    for k in range(exchanges):
        rows.append({"role": "user", "content": f"Question {k}: {_FILLER}?"})
        rows.append({"role": "assistant", "content": f"Answer {k}: yes, {_FILLER}."})
    for start in range(0, len(rows), _CHUNK):
        await keeper.append_messages(conversation_id, rows[start : start + _CHUNK])
    return conversation_id


async def _turn(bench: Bench, conversation_id: str, tokens: int) -> Turn:
    (directive,) = echo_directives("hist", 1, tokens)
    call = await connect(bench.api)
    body = chat_body(directive.message(), conversation_id=conversation_id)
    call.send(request_bytes(bench.api, "POST", CHAT, body))
    await call.finished
    return Turn(directive, call, "pipeline")


async def history_length(bench: Bench) -> Section:
    sizes = bench.sizes
    lengths = sizes.history_lengths
    shortest, full, longest = sorted(lengths)
    section = Section(
        "history",
        "9. First token and the length of the history",
        intro=f"""
Conversations of {" and ".join(f"{n:,}" for n in lengths)} exchanges (a user message and an
answer of about 30 words each), stored in Redis through the record keeper. Then
{sizes.history_turns} turns continue each of them, one at a time, the conversations taken in
turn (so the machine's slow moments fall on all of them alike); each answer is
{sizes.history_tokens} tokens. The worker reads the latest rows of a conversation
(`BERNARD_MAX_MESSAGES`), fits a prompt into `BERNARD_CONTEXT_MAX_TOKENS` and leaves
the older messages to a summary job off the turn's path. A conversation of a few hundred
exchanges already fills both, so beyond it a turn reads and sends the same amount whatever
the history's length. Target: the longest history's median first token within
{FLAT_MEDIAN_MS:g} ms of one that just fills the prompt ({full:,} exchanges); the shortest
row shows what a full prompt costs against an almost empty one.
""",
    )
    conversations = {n: await _stored_conversation(bench, n) for n in lengths}
    task = bench.ui.task("history: turns", len(lengths) * sizes.history_turns)
    turns: dict[int, list[Turn]] = {n: [] for n in lengths}
    started = time.monotonic()
    for _ in range(sizes.history_turns):
        for n in lengths:
            turns[n].append(await _turn(bench, conversations[n], sizes.history_tokens))
            bench.ui.advance(task)
    bench.ui.done(task)
    await wait_idle(bench)
    table = Table(["stored exchanges", *SUMMARY_HEADERS, "exact"], title="First token, ms")
    medians = {}
    for n in lengths:
        summary = Summary.of(t.first_token_ms for t in turns[n])
        medians[n] = summary.median
        exact, _ = check_all(turns[n])
        table.add(f"{n:,}", *summary_cells(summary), f"{exact}/{len(turns[n])}")
        if exact != len(turns[n]):
            bench.failures.append(f"history: turns of a {n}-exchange conversation not exact")
    section.tables.append(table)
    section.notes.append(
        f"{sum(len(t) for t in turns.values())} turns in {time.monotonic() - started:.1f} s. "
        f"A full prompt against an almost empty one ({full:,} against {shortest:,} "
        f"exchanges): {medians[full] - medians[shortest]:+.2f} ms at the median."
    )
    added = medians[longest] - medians[full]
    section.verdicts.append(
        Verdict(
            f"{longest:,} stored exchanges add < {FLAT_MEDIAN_MS:g} ms to the median first "
            f"token of {full:,} (a full prompt)",
            f"{added:+.2f} ms",
            abs(added) < FLAT_MEDIAN_MS,
        )
    )
    return section
