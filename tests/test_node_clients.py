"""Node clients pointed at Bernard's Chat Completions over real HTTP, unmodified: the `openai`
SDK for Node and the AI SDK's OpenAI provider (`ai` + `@ai-sdk/openai`), pinned by
tests/js/package-lock.json.

Each test runs one of tests/js/*.mjs with `node` against the running stack and the scripted
upstream (tests/support/node_scripts.py), and asserts on what the script reports, a JSON object a
line (tests/js/args.mjs). Where the clients are not installed (`bash tests/js/setup`, which
.ci/run runs) these tests skip naming it, and fail under CI.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.node_scripts import node, require_node_clients, started
from tests.support.stack import Stack, make_settings, run_stack
from tests.support.upstream import Reply, ScriptedUpstream, last_user_text

KEY = "key-alice"


@pytest.fixture(autouse=True)
def node_clients() -> None:
    require_node_clients()


@pytest.fixture
async def keyed(upstream: ScriptedUpstream) -> AsyncIterator[Stack]:
    """A stack that wants a key: alice's is KEY."""
    async with run_stack(make_settings(upstream, api_keys=f"{KEY}:alice")) as running:
        yield running


async def test_openai_node_streams_the_scripted_answer(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    # The upstream holds after its first token: the script must have printed it by then, so
    # the answer reached the client as a stream, not in one piece at the end.
    reply = upstream.script(Reply.text(["Bonjour", " à", " tous"], usage=(4, 3), block_after=1))
    async with started("openai_chat.mjs", stack, "--stream", "--prompt", "Greet all") as script:
        assert await script.line() == {"event": "delta", "text": "Bonjour"}
        reply.release()
        run = await script.finish()
    assert run.code == 0, run
    assert run.text == "Bonjour à tous"
    assert run.final == {
        "event": "final",
        "text": "Bonjour à tous",
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
    }
    assert last_user_text(upstream.requests[-1]) == "Greet all"


async def test_openai_node_non_stream_answer(stack: Stack, upstream: ScriptedUpstream) -> None:
    upstream.script(Reply.text("Plain answer.", usage=(3, 2)))
    run = await node("openai_chat.mjs", stack, "--prompt", "Answer plainly")
    assert run.code == 0, run
    final = run.final
    assert final.pop("id").startswith("chatcmpl-")
    assert final == {
        "event": "final",
        "text": "Plain answer.",
        "role": "assistant",
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    assert run.of("delta") == []
    assert last_user_text(upstream.requests[-1]) == "Answer plainly"


async def test_openai_node_raises_typed_errors_from_the_envelope(
    keyed: Stack, upstream: ScriptedUpstream
) -> None:
    wrong_key = await node("openai_chat.mjs", keyed, "--stream", key="key-mallory")
    assert wrong_key.code == 1
    assert wrong_key.lines == [
        {
            "event": "error",
            "class": "AuthenticationError",
            "message": "401 invalid API key",
            "status": 401,
            "code": "invalid_api_key",
            "type": "authentication_error",
        }
    ]
    unknown_model = await node("openai_chat.mjs", keyed, "--model", "gpt-unknown", key=KEY)
    assert unknown_model.code == 1
    assert unknown_model.lines == [
        {
            "event": "error",
            "class": "NotFoundError",
            "message": "404 The model 'gpt-unknown' does not exist; use 'bernard-v1'",
            "status": 404,
            "code": "model_not_found",
            "type": "not_found_error",
            "param": "model",
        }
    ]
    assert upstream.requests == []


async def test_openai_node_raises_on_a_mid_stream_error_frame(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.error(500, "boom"))
    run = await node("openai_chat.mjs", stack, "--stream")
    # The stream had started (200) when the upstream failed: the SDK raises the error frame's
    # envelope as an APIError, with no status.
    assert run.code == 1
    assert run.lines == [
        {
            "event": "error",
            "class": "APIError",
            "message": "the upstream model failed (HTTP 500)",
            "code": "upstream_error",
            "type": "server_error",
        }
    ]


async def test_ai_sdk_chat_provider_streams_text(stack: Stack, upstream: ScriptedUpstream) -> None:
    reply = upstream.script(
        Reply.text(["Stream", "ed by", " the AI SDK"], usage=(6, 4), block_after=1)
    )
    args = ("--api", "chat", "--prompt", "Stream it")
    async with started("ai_sdk_stream.mjs", stack, *args) as script:
        assert await script.line() == {"event": "delta", "text": "Stream"}
        reply.release()
        run = await script.finish()
    assert run.code == 0, run
    assert run.text == "Streamed by the AI SDK"
    final = run.final
    assert final.pop("response_id").startswith("chatcmpl-")
    assert final == {
        "event": "final",
        "text": "Streamed by the AI SDK",
        "finish_reason": "stop",
        "raw_finish_reason": "stop",
        "usage": {"input_tokens": 6, "output_tokens": 4, "total_tokens": 10},
    }
    # createOpenAI(...).chat(model) speaks Chat Completions: the prompt reached the model.
    assert last_user_text(upstream.requests[-1]) == "Stream it"


async def test_ai_sdk_chat_provider_reports_a_failed_stream(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.error(500, "boom"))
    run = await node("ai_sdk_stream.mjs", stack, "--api", "chat")
    # The provider turns an error frame before any text into an APICallError (500 when the
    # envelope names no status) and streamText yields it as an error part.
    assert run.code == 1
    assert run.lines == [
        {
            "event": "error",
            "class": "APICallError",
            "message": "the upstream model failed (HTTP 500)",
            "statusCode": 500,
        }
    ]
