"""Memory: a long conversation's prompts stay within the budget, keep the latest messages
whole, carry the running summary and the user's notes; the summary job runs once per
threshold crossing and a failed one changes nothing."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import orjson
import pytest
from langchain_core.utils.function_calling import convert_to_openai_tool

from shared.notes import NoteStore
from shared.records.keeper import RecordKeeper
from tests.support.messages import assistant, user
from tests.support.processes import wait_for
from tests.support.stack import make_settings, run_stack
from tests.support.upstream import Body, Reply, ScriptedUpstream
from worker.harness import memory
from worker.harness.memory import (
    NOTES_HEADING,
    SUMMARY_HEADING,
    render_notes,
    schema_tokens,
    select,
)
from worker.summaries import SUMMARY_PROMPT
from worker.tokens import MESSAGE_OVERHEAD, estimate, message_tokens
from worker.tools import calculator, get_time


def call(call_id: str) -> dict[str, Any]:
    tool_call = {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}
    return {"role": "assistant", "content": None, "tool_calls": [tool_call]}


def result(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "content": "done", "tool_call_id": call_id}


def tokens(messages: list[dict[str, Any]]) -> int:
    return sum(message_tokens(m, estimate) for m in messages)


# -- choosing what fits (pure) -------------------------------------------------------------------

TWELVE = "x" * 24  # 8 tokens by the estimate, 12 with the message overhead


@pytest.mark.parametrize(
    ("rows", "budget", "kept"),
    [
        ([user(TWELVE), assistant(TWELVE), user(TWELVE)], 100, 3),
        ([user(TWELVE), assistant(TWELVE), user(TWELVE)], 24, 2),
        ([user(TWELVE), assistant(TWELVE), user(TWELVE)], 5, 1),  # the question, always
        # A tool call comes with its results, or not at all.
        ([user(TWELVE), call("a"), result("a"), result("a"), user(TWELVE)], 30, 1),
        ([user(TWELVE), call("a"), result("a"), user(TWELVE)], 100, 4),
        # Results whose call is outside the rows are not sent alone.
        ([result("a"), result("a"), assistant(TWELVE), user(TWELVE)], 100, 2),
        ([], 100, 0),
    ],
)
def test_the_latest_whole_messages_that_fit_are_kept(
    rows: list[dict[str, Any]], budget: int, kept: int
) -> None:
    chosen, used, _ = select(rows, budget, estimate)
    assert chosen == rows[len(rows) - kept :]
    assert used >= tokens(chosen)


def test_a_tool_call_is_never_cut_from_its_results() -> None:
    rows = [user(TWELVE), call("a"), result("a"), result("a"), assistant(TWELVE)]
    for budget in range(0, 120):
        chosen, _, _ = select(rows, budget, estimate)
        roles = [m["role"] for m in chosen]
        if "tool" in roles:
            assert chosen[roles.index("tool") - 1].get("tool_calls"), budget


@pytest.mark.parametrize(
    ("notes", "limit", "shown"),
    [
        (["a", "b"], 100, ["a", "b"]),
        (["old " * 20, "new"], 20, ["new"]),  # the newest first when not all fit
        ([], 100, None),
    ],
)
def test_notes_are_rendered_within_their_share(
    notes: list[str], limit: int, shown: list[str] | None
) -> None:
    text = render_notes(notes, limit, estimate)
    if shown is None:
        assert text is None
        return
    assert text == "\n".join([NOTES_HEADING, *(f"- {n}" for n in shown)])
    assert estimate(text) <= limit + len(shown)


def test_the_estimate_errs_high() -> None:
    assert estimate("hello world") >= 2  # two tokens in every OpenAI tokenizer
    assert estimate("é" * 30) == 20  # two bytes each
    assert MESSAGE_OVERHEAD == 4


# -- through the pipeline -------------------------------------------------------------------------

BUDGET = {
    "context_max_tokens": 3000,
    "context_answer_tokens": 300,
    "summary_threshold_messages": 20,
}


def prompt_of(body: Body) -> list[dict[str, Any]]:
    return list(body["messages"])


async def long_conversation(redis: Any, owner: str, exchanges: int) -> str:
    """A conversation of `exchanges` question/answer pairs, every tenth with a tool call."""
    keeper = RecordKeeper(redis, owner)
    conversation_id = await keeper.create_conversation()
    rows: list[dict[str, Any]] = []
    for n in range(exchanges):
        rows.append(user(f"question {n} " + "q" * 40))
        if n % 10 == 9:
            rows += [call(f"c{n}"), result(f"c{n}")]
        rows.append(assistant(f"answer {n} " + "a" * 60))
    for start in range(0, len(rows), 500):
        await keeper.append_messages(conversation_id, rows[start : start + 500])
    return conversation_id


def summary_responder(fail: bool = False, seen: list[Body] | None = None) -> Any:
    def respond(body: Body) -> Reply:
        if body["messages"][0]["content"] == SUMMARY_PROMPT:
            if seen is not None:
                seen.append(body)
            return Reply.error(500, "no summary today") if fail else Reply.text("They talked.")
        return Reply.text("fine")

    return respond


async def test_a_2000_exchange_conversation_fits_its_prompt_with_summary_and_notes(
    upstream: ScriptedUpstream,
) -> None:
    owner = f"memory-{uuid.uuid4().hex[:8]}"
    settings = make_settings(upstream, api_keys=f"key-m:{owner}", **BUDGET)
    upstream.responder = summary_responder()
    async with run_stack(settings) as stack:
        conversation_id = await long_conversation(stack.redis, owner, 2000)
        keeper = RecordKeeper(stack.redis, owner)
        await keeper.save_summary(conversation_id, "The user asked many questions.", 3000)
        await NoteStore(stack.redis, owner, retention_s=60).add("the door code is 1234")
        answer = await stack.client.post(
            f"/v1/conversations/{conversation_id}/messages",
            json={"content": "and now?"},
            headers={"Authorization": "Bearer key-m"},
        )
        assert answer.status_code == 200, answer.text

    sent = prompt_of(upstream.requests[-1])
    budget = BUDGET["context_max_tokens"] - BUDGET["context_answer_tokens"]
    assert tokens(sent) <= budget, "the whole prompt fits, answer's share aside"
    systems = [m["content"] for m in sent if m["role"] == "system"]
    assert any(s.startswith(SUMMARY_HEADING) and "many questions" in s for s in systems)
    assert any(s.startswith(NOTES_HEADING) and "door code is 1234" in s for s in systems)
    history = [m for m in sent if m["role"] != "system"]
    assert history[-1] == user("and now?")
    assert history[-2]["content"].startswith("answer 1999 "), "the latest exchanges, whole"
    for index, message in enumerate(history):
        if message["role"] == "tool":
            assert history[index - 1].get("tool_calls"), "a result never without its call"
    assert 10 < len(history) < 200


async def test_the_summary_job_runs_once_per_threshold_crossing_and_a_failure_keeps_the_old(
    upstream: ScriptedUpstream,
) -> None:
    owner = f"memory-{uuid.uuid4().hex[:8]}"
    settings = make_settings(upstream, api_keys=f"key-m:{owner}", **BUDGET)
    summaries: list[Body] = []
    upstream.responder = summary_responder(seen=summaries)
    headers = {"Authorization": "Bearer key-m"}
    async with run_stack(settings) as stack:
        conversation_id = await long_conversation(stack.redis, owner, 200)
        keeper = RecordKeeper(stack.redis, owner)
        url = f"/v1/conversations/{conversation_id}/messages"
        for n in range(3):  # three turns, one crossing: the job is queued once, runs once
            assert (
                await stack.client.post(url, json={"content": f"more {n}"}, headers=headers)
            ).status_code == 200
        await wait_for(lambda: keeper.summary(conversation_id), timeout_s=10)
        summary = await keeper.summary(conversation_id)
        assert summary is not None
        await asyncio.sleep(0.5)
        assert len(summaries) == 1
        assert summary["text"] == "They talked."
        covered = int(summary["covers_to"])
        assert covered > 0
        # The summary reached what the prompts drop: no crossing now, no new job.
        await stack.client.post(url, json={"content": "again"}, headers=headers)
        await asyncio.sleep(0.5)
        assert len(summaries) == 1

        upstream.responder = summary_responder(fail=True, seen=summaries)
        rows = [user("q " * 40), assistant("a " * 60)] * 60
        await keeper.append_messages(conversation_id, rows)
        await stack.client.post(url, json={"content": "after a lot more"}, headers=headers)
        await wait_for(lambda: len(summaries) >= 2, timeout_s=10)
        await asyncio.sleep(0.3)
        kept = await keeper.summary(conversation_id)
    assert kept is not None and kept["text"] == "They talked." and kept["covers_to"] == covered


def test_a_tools_schema_is_counted_once_per_counter(monkeypatch: pytest.MonkeyPatch) -> None:
    converted: list[str] = []

    def converting(tool: Any) -> dict[str, Any]:
        converted.append(tool.name)
        return convert_to_openai_tool(tool)

    monkeypatch.setattr(memory, "convert_to_openai_tool", converting)
    first = [schema_tokens(tool, estimate) for tool in (calculator, get_time)]
    again = [schema_tokens(tool, estimate) for tool in (calculator, get_time)]
    assert first == again
    assert first[0] == estimate(orjson.dumps(convert_to_openai_tool(calculator)).decode())
    assert converted.count("calculator") <= 1 and converted.count("get_time") <= 1
    other = schema_tokens(calculator, lambda text: 2 * estimate(text))
    assert other == 2 * first[0], "another counter counts again"


def test_selecting_again_with_older_rows_counts_each_row_once() -> None:
    counted: list[str] = []

    def count(text: str) -> int:
        counted.append(text)
        return estimate(text)

    rows = [{"role": "user", "content": f"message {n}"} for n in range(6)]
    sizes: dict[int, int] = {}
    first, _, complete = select(rows[3:], 10_000, count, sizes=sizes)
    assert complete and first == rows[3:]
    again, _, _ = select([*rows[:3], *first], 10_000, count, sizes=sizes)
    assert again == rows
    assert sorted(counted) == sorted(f"message {n}" for n in range(6))
