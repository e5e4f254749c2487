"""Node clients on Bernard's Responses API (POST /v1/responses) over real HTTP, unmodified:
the `openai` SDK for Node's responses.create streaming, and responses.retrieve resuming a
dropped stream mid-answer and a finished response after every sequence number, exactly; the
AI SDK's default OpenAI provider, createOpenAI({baseURL})(model), streaming text with
streamText.

As tests/test_node_clients.py: scripts in tests/js/ run by tests/support/node_scripts.py, their JSON
lines compared literally; skipped naming `bash tests/js/setup` where the clients are not
installed, failed under CI.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.node_scripts import node, require_node_clients, started
from tests.support.stack import Stack
from tests.support.upstream import Reply, ScriptedUpstream, last_user_text

USAGE_5_3 = {
    "input_tokens": 5,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 3,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 8,
}


@pytest.fixture(autouse=True)
def node_clients() -> None:
    require_node_clients()


def event(seq: int, kind: str, phase: str = "first", **fields: Any) -> dict[str, Any]:
    """One line openai_responses.mjs reports for a streamed event."""
    return {"event": "sse", "phase": phase, "type": kind, "sequence_number": seq, **fields}


async def test_openai_node_responses_create_streams_the_text(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    # The upstream holds after its first token: the script has printed it by then.
    reply = upstream.script(
        Reply.text(["Hello", " from", " Responses"], usage=(5, 3), block_after=1)
    )
    async with started("openai_responses.mjs", stack, "--prompt", "Say hello") as script:
        created = await script.line()
        rid = created.get("response_id", "")
        assert rid.startswith("resp_"), created
        head = [created] + [await script.line() for _ in range(4)]
        assert head == [
            event(0, "response.created", response_id=rid, status="in_progress"),
            event(1, "response.in_progress", response_id=rid, status="in_progress"),
            event(2, "response.output_item.added"),
            event(3, "response.content_part.added"),
            event(4, "response.output_text.delta", delta="Hello"),
        ]
        reply.release()
        run = await script.finish()
    assert run.code == 0, run
    events = run.of("sse")
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert "".join(e["delta"] for e in deltas) == "Hello from Responses"
    assert [e["type"] for e in events[4 + len(deltas) :]] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[-1]["status"] == "completed" and events[-1]["response_id"] == rid
    assert run.final == {
        "event": "final",
        "response_id": rid,
        "status": "completed",
        "text": "Hello from Responses",
        "output_text": "Hello from Responses",
        "usage": USAGE_5_3,
    }
    assert last_user_text(upstream.requests[-1]) == "Say hello"


async def test_openai_node_responses_retrieve_resumes_a_dropped_stream_exactly(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    # The stream drops at the first delta (sequence number 4) while the upstream holds the
    # rest: the script resumes with retrieve(id, {stream: true, starting_after: 4}) mid-answer.
    tokens = [" w0", " w1", " w2", " w3", " w4"]
    reply = upstream.script(Reply.text(tokens, usage=(5, 5), block_after=1))
    args = ("--background", "--drop-after", "4", "--prompt", "Count words")
    async with started("openai_responses.mjs", stack, *args) as script:
        created = await script.line()
        rid = created.get("response_id", "")
        assert rid.startswith("resp_"), created
        head = [created] + [await script.line() for _ in range(5)]
        assert head == [
            event(0, "response.created", response_id=rid, status="queued"),
            event(1, "response.in_progress", response_id=rid, status="in_progress"),
            event(2, "response.output_item.added"),
            event(3, "response.content_part.added"),
            event(4, "response.output_text.delta", delta=" w0"),
            {"event": "dropped", "after": 4, "response_id": rid},
        ]
        assert reply.blocked  # the answer is still being written as the client resumes
        reply.release()
        run = await script.finish()
    assert run.code == 0, run
    resumed = [e for e in run.of("sse") if e["phase"] == "resumed"]
    # Exactly the events after 4: none repeated, none missing, the numbering dense.
    assert [e["sequence_number"] for e in resumed] == list(range(5, 5 + len(resumed)))
    deltas = [e for e in resumed if e["type"] == "response.output_text.delta"]
    assert "".join(e["delta"] for e in deltas) == " w1 w2 w3 w4"
    assert [e["type"] for e in resumed[len(deltas) :]] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert run.final == {
        "event": "final",
        "response_id": rid,
        "status": "completed",
        "text": " w0 w1 w2 w3 w4",
        "output_text": " w0 w1 w2 w3 w4",
        "usage": {**USAGE_5_3, "output_tokens": 5, "total_tokens": 10},
    }
    assert last_user_text(upstream.requests[-1]) == "Count words"


async def test_ai_sdk_default_provider_streams_text_over_responses(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    reply = upstream.script(
        Reply.text(["Hello", " from", " Responses"], usage=(5, 3), block_after=1)
    )
    args = ("--api", "responses", "--prompt", "Say hello")
    async with started("ai_sdk_stream.mjs", stack, *args) as script:
        assert await script.line() == {"event": "delta", "text": "Hello"}
        reply.release()
        run = await script.finish()
    assert run.code == 0, run
    assert run.text == "Hello from Responses"
    final = run.final
    # createOpenAI({baseURL})(model) spoke the Responses API: the id is a response's.
    assert final.pop("response_id").startswith("resp_")
    assert final == {
        "event": "final",
        "text": "Hello from Responses",
        "finish_reason": "stop",
        "raw_finish_reason": None,
        "usage": {"input_tokens": 5, "output_tokens": 3, "total_tokens": 8},
    }
    assert last_user_text(upstream.requests[-1]) == "Say hello"


async def test_ai_sdk_takes_bernards_tool_events_and_streams_the_answer_after_them(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    # The mcp_call item, its argument and completion events and the progress events,
    # which are Bernard's own: none is an error part, and the answer streams after them.
    upstream.script_router(Reply.tool_calls([("calculator", {"expression": "6 * 7"})]))
    upstream.script(Reply.text(["It", " is", " 42."], usage=(5, 3)))
    run = await node("ai_sdk_stream.mjs", stack, "--api", "responses", "--prompt", "6*7?")
    assert run.code == 0, run
    assert run.of("error") == []
    assert run.text == "It is 42."
    assert run.final["response_id"].startswith("resp_")
    assert run.final["finish_reason"] == "stop"


@pytest.mark.parametrize("tool", [False, True], ids=["text", "bernards tool then text"])
async def test_openai_node_responses_retrieve_is_exact_after_every_sequence_number(
    stack: Stack, upstream: ScriptedUpstream, tool: bool
) -> None:
    if tool:  # an mcp_call item and its events, progress included, before the answer
        upstream.script_router(Reply.tool_calls([("calculator", {"expression": "6 * 7"})]))
    upstream.script(Reply.text([f"t{i} " for i in range(6)], usage=(5, 6)))
    run = await node("openai_responses_every.mjs", stack, "--prompt", "Count")
    assert run.code == 0, run
    (done,) = run.of("done")
    assert done["status"] == "completed" and done["text"] == "t0 t1 t2 t3 t4 t5 "
    (replay,) = run.of("replay")
    whole = replay["events"]
    assert [e["sequence_number"] for e in whole] == list(range(len(whole)))
    first = "response.mcp_call.in_progress" if tool else "response.content_part.added"
    assert [e["type"] for e in whole[:4]] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        first,
    ]
    assert ("response.mcp_call.progress" in [e["type"] for e in whole]) is tool
    assert whole[-1]["type"] == "response.completed"
    assert whole[-1]["response"]["id"] == done["response_id"]
    text = "".join(e["delta"] for e in whole if e["type"] == "response.output_text.delta")
    assert text == "t0 t1 t2 t3 t4 t5 "
    resumes = run.of("resume")
    assert [r["after"] for r in resumes] == list(range(len(whole)))
    for resume in resumes:
        n = resume["after"]
        assert resume["events"] == whole[n + 1 :], f"resumed after {n}"
