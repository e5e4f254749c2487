"""Conversation titles: made in the background after the first exchange by the router model
(worker/titles.py), budgeted like summaries, stored with the conversation's incarnation,
shown by the API and the CLI, and editable by the user (`PATCH`), whose title is never
replaced. Through the real API and worker against the scripted upstream answering the
title call, and the demo model's own title."""

from __future__ import annotations

import asyncio
import io
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from rich.console import Console

from cli.conversations import conversations_table
from shared import keys
from shared.queue import BackgroundKind, background_job_id
from shared.settings import Settings
from shared.titles import TITLE_PROMPT, clean_title, title_problem
from tests.support.processes import wait_for
from tests.support.stack import Stack, make_settings, run_stack
from tests.support.upstream import Body, Reply, ScriptedUpstream

OWNER_KEY = "key-t"
HEADERS = {"Authorization": f"Bearer {OWNER_KEY}"}


def is_title_call(body: Body) -> bool:
    messages = body["messages"]
    return bool(messages) and messages[0]["content"] == TITLE_PROMPT


def titling(title: str | Reply, seen: list[Body] | None = None) -> Any:
    """A responder answering the title call with `title`, everything else with a greeting."""

    def respond(body: Body) -> Reply:
        if is_title_call(body):
            if seen is not None:
                seen.append(body)
            return title if isinstance(title, Reply) else Reply.text(title)
        return Reply.text("Otters hold hands while they sleep.")

    return respond


def settings_for(upstream: ScriptedUpstream | None, **overrides: Any) -> tuple[Settings, str]:
    owner = f"titles-{uuid.uuid4().hex[:8]}"
    settings = make_settings(
        upstream, api_keys=f"{OWNER_KEY}:{owner}", conversation_titles=True, **overrides
    )
    return settings, owner


@pytest.fixture
async def stack(upstream: ScriptedUpstream) -> AsyncIterator[Stack]:
    """A stack that names conversations, its one user's key in HEADERS (tests/conftest.py's
    `stack` with conversation titles on)."""
    settings, _ = settings_for(upstream)
    async with run_stack(settings) as stack:
        yield stack


async def exchange(stack: Stack, conversation_id: str, content: str) -> None:
    """Create the conversation (if need be) and post one message to it; the turn completes."""
    await stack.client.post("/v1/conversations", json={"id": conversation_id}, headers=HEADERS)
    answer = await stack.client.post(
        f"/v1/conversations/{conversation_id}/messages", json={"content": content}, headers=HEADERS
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "completed"


async def title_of(stack: Stack, conversation_id: str) -> str | None:
    response = await stack.client.get(f"/v1/conversations/{conversation_id}", headers=HEADERS)
    assert response.status_code == 200, response.text
    title = response.json()["title"]
    return str(title) if title is not None else None


async def titled(stack: Stack, conversation_id: str) -> str:
    """The conversation's title, once it has one (the job runs in the background)."""

    async def found() -> str | None:
        return await title_of(stack, conversation_id)

    await wait_for(found, 10)
    return str(await title_of(stack, conversation_id))


# -- what a title may be ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "title"),
    [
        ("Otters sleeping habits", "Otters sleeping habits"),
        ('"Otters sleeping habits."', "Otters sleeping habits"),
        ("Title: Otters at night", "Otters at night"),
        ("**Otters at night**\n\nThis conversation is about otters.", "Otters at night"),
        ("# Kitchen lights", "Kitchen lights"),
        ("« Minuteur des pâtes »", "Minuteur des pâtes"),
        (
            "one two three four five six seven eight nine ten",
            "one two three four five six seven eight",
        ),
        ("tab\tand\x1b[31mescape", "tab and [31mescape"),
        ("x" * 100, "x" * 79 + "…"),
        ("", None),
        ("  \n\n ", None),
        ('"..."', None),
    ],
)
def test_a_models_answer_is_tidied_into_a_title(answer: str, title: str | None) -> None:
    assert clean_title(answer) == title


@pytest.mark.parametrize(
    ("title", "problem"),
    [
        ("Kitchen timers", None),
        ("x" * 80, None),
        ("Café ☕ in Zürich", None),
        ("", "a title may not be empty"),
        ("   ", "a title may not be empty"),
        ("x" * 81, "a title may hold at most 80 characters"),
        ("two\nlines", "a title may not hold control characters (newlines, tabs, escapes)"),
        ("bell\x07", "a title may not hold control characters (newlines, tabs, escapes)"),
        ("\u202ereversed", "a title may not hold control characters (newlines, tabs, escapes)"),
    ],
)
def test_what_a_user_may_name_a_conversation(title: str, problem: str | None) -> None:
    assert title_problem(title) == problem


# -- through the pipeline ---------------------------------------------------------------------


async def test_the_first_exchange_names_the_conversation_once_off_the_turns_path(
    upstream: ScriptedUpstream, stack: Stack
) -> None:
    seen: list[Body] = []
    upstream.responder = titling("Otters asleep", seen)
    await exchange(stack, "otters", "Do otters really hold hands while they sleep?")
    assert await titled(stack, "otters") == "Otters asleep"
    listed = (await stack.client.get("/v1/conversations", headers=HEADERS)).json()["data"]
    # A second exchange asks nothing more.
    await exchange(stack, "otters", "And sea lions?")
    await asyncio.sleep(0.5)

    assert [c["title"] for c in listed if c["id"] == "otters"] == ["Otters asleep"]
    assert len(seen) == 1
    call = seen[0]
    assert call["model"] == "router-model"
    assert call["messages"][1]["content"] == (
        "user: Do otters really hold hands while they sleep?\n"
        "assistant: Otters hold hands while they sleep."
    )


async def test_a_conversation_a_chat_completion_started_is_named_too(
    upstream: ScriptedUpstream, stack: Stack
) -> None:
    seen: list[Body] = []
    upstream.responder = titling("Otters asleep", seen)
    history = [
        {"role": "user", "content": "Do otters sleep?"},
        {"role": "assistant", "content": "They do, holding hands."},
        {"role": "user", "content": "Where?"},
    ]
    answer = await stack.client.post(
        "/v1/chat/completions",
        json={"model": "bernard-v1", "messages": history},
        headers=HEADERS,
    )
    conversation_id = answer.headers["x-bernard-conversation-id"]
    title = await titled(stack, conversation_id)

    assert title == "Otters asleep"
    # Named after the history's first exchange, which the client sent whole.
    assert seen[0]["messages"][1]["content"] == (
        "user: Do otters sleep?\nassistant: They do, holding hands."
    )


async def test_a_first_turn_that_waits_for_a_decision_is_named_once_its_answer_is_in(
    upstream: ScriptedUpstream, stack: Stack
) -> None:
    seen: list[Body] = []
    upstream.responder = titling("Door code", seen)
    await stack.client.post("/v1/conversations", json={"id": "door"}, headers=HEADERS)
    upstream.script_router(Reply.tool_calls([("save_note", {"text": "the code is 1234"})]))
    paused = await stack.client.post(
        "/v1/conversations/door/messages",
        json={"content": "remember the door code is 1234"},
        headers=HEADERS,
    )
    await asyncio.sleep(0.5)
    untitled = await title_of(stack, "door")
    confirmation = paused.json()["pending_confirmation"]["confirmation_id"]
    resumed = await stack.client.post(
        "/v1/conversations/door/resume",
        json={"confirmation_id": confirmation, "decision": "approve"},
        headers=HEADERS,
    )
    title = await titled(stack, "door")

    assert paused.json()["status"] == "awaiting_confirmation"
    assert untitled is None, "no answer yet: nothing to name it after"
    assert resumed.json()["status"] == "completed"
    assert title == "Door code"
    assert seen[0]["messages"][1]["content"] == (
        "user: remember the door code is 1234\nassistant: Otters hold hands while they sleep."
    )


async def test_a_title_is_its_owners_background_job_and_waits_for_none_over_budget(
    upstream: ScriptedUpstream,
) -> None:
    settings, owner = settings_for(upstream, max_background_jobs_per_user=2)
    seen: list[Body] = []
    upstream.responder = titling("Otters asleep", seen)
    async with run_stack(settings) as stack:
        # The owner's two background slots are taken (two summaries, say).
        taken = {f"summary:{owner}/busy-{n}": time.time() + 3600 for n in range(2)}
        await stack.redis.zadd(keys.background_jobs(owner), taken)
        await exchange(stack, "over", "Do otters sleep?")
        await asyncio.sleep(0.5)
        assert await title_of(stack, "over") is None
        assert seen == []
        # With a slot free, the next conversation's first exchange is named; the job
        # holds a slot of the owner's while it runs, under its id.
        await stack.redis.zrem(keys.background_jobs(owner), f"summary:{owner}/busy-0")
        held = Reply.text("Sea lions", block_after=0)
        upstream.responder = titling(held, seen)
        await exchange(stack, "within", "And sea lions?")
        await held.wait_blocked()
        slots = {m.decode() for m in await stack.redis.zrange(keys.background_jobs(owner), 0, -1)}
        held.release()
        assert await titled(stack, "within") == "Sea lions"

    assert background_job_id(BackgroundKind.TITLE, owner, "within") in slots
    assert background_job_id(BackgroundKind.TITLE, owner, "within") == f"title:{owner}/within"


async def test_a_failed_title_call_leaves_the_conversation_untitled_and_the_turn_alone(
    upstream: ScriptedUpstream,
) -> None:
    settings, owner = settings_for(upstream)
    seen: list[Body] = []
    upstream.responder = titling(Reply.error(500, "no titles today"), seen)
    async with run_stack(settings) as stack:
        await exchange(stack, "failed", "Do otters sleep?")
        await wait_for(lambda: seen, 10)

        async def released() -> bool:
            return await stack.background_jobs(owner) == 0

        await wait_for(released, 10)
        shown = await title_of(stack, "failed")
        rows = (await stack.client.get("/v1/conversations/failed/messages", headers=HEADERS)).json()

    assert shown is None
    assert [row["role"] for row in rows["data"]] == ["user", "assistant"]


async def test_a_title_the_user_set_is_never_replaced_by_the_generated_one(
    upstream: ScriptedUpstream, stack: Stack
) -> None:
    held = Reply.text("Generated title", block_after=0)
    upstream.responder = titling(held)
    await exchange(stack, "mine", "Do otters sleep?")
    await held.wait_blocked()  # the job asked the model; the user names it meanwhile
    changed = await stack.client.patch(
        "/v1/conversations/mine", json={"title": "  Otter facts\n"}, headers=HEADERS
    )
    held.release()
    await asyncio.sleep(0.5)
    shown = await title_of(stack, "mine")

    assert changed.status_code == 200, changed.text
    assert changed.json()["title"] == "Otter facts"
    assert changed.json()["id"] == "mine"
    assert shown == "Otter facts"


async def test_a_conversation_deleted_and_created_again_does_not_get_the_old_title(
    upstream: ScriptedUpstream, stack: Stack
) -> None:
    held = Reply.text("Old words", block_after=0)
    upstream.responder = titling(held)
    await exchange(stack, "again", "Do otters sleep?")
    await held.wait_blocked()
    deleted = await stack.client.delete("/v1/conversations/again", headers=HEADERS)
    created = await stack.client.post("/v1/conversations", json={"id": "again"}, headers=HEADERS)
    held.release()
    await asyncio.sleep(0.5)
    shown = await title_of(stack, "again")

    assert deleted.status_code == 200 and created.status_code == 201
    assert shown is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"title": "x" * 81}, "a title may hold at most 80 characters"),
        ({"title": "two\nlines"}, "a title may not hold control characters"),
        ({"title": "\x1b[2Jclear"}, "a title may not hold control characters"),
        ({"title": " "}, "a title may not be empty"),
        ({"title": 5}, None),
        ({}, None),
    ],
)
async def test_a_title_the_api_refuses_is_a_400_in_its_error_envelope(
    upstream: ScriptedUpstream, body: dict[str, Any], message: str | None
) -> None:
    settings, _ = settings_for(upstream)
    async with run_stack(settings, worker=False) as stack:
        await stack.client.post("/v1/conversations", json={"id": "named"}, headers=HEADERS)
        refused = await stack.client.patch("/v1/conversations/named", json=body, headers=HEADERS)
        unchanged = await title_of(stack, "named")

    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["type"] == "invalid_request_error"
    if message is not None:
        assert error["message"].startswith(message)
        assert error["param"] == "title"
    assert unchanged is None


async def test_naming_a_conversation_the_user_does_not_have_is_a_404(
    upstream: ScriptedUpstream,
) -> None:
    settings, _ = settings_for(upstream)
    async with run_stack(settings, worker=False) as stack:
        missing = await stack.client.patch(
            "/v1/conversations/nobody", json={"title": "Hello"}, headers=HEADERS
        )
        bad_id = await stack.client.patch(
            "/v1/conversations/..", json={"title": "Hello"}, headers=HEADERS
        )
        stray = await stack.redis.exists(keys.conversation("nobody", "nobody"))

    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "conversation_not_found"
    assert bad_id.status_code == 404
    assert stray == 0


async def test_the_demo_model_names_a_conversation_after_its_first_question() -> None:
    settings, _ = settings_for(None)
    assert settings.demo_mode
    async with run_stack(settings) as stack:
        await exchange(stack, "demo", "what time is it in Europe/Paris?")
        title = await titled(stack, "demo")

    assert title == "What time is it in Europe/Paris"


# -- the CLI --------------------------------------------------------------------------------------


def test_conversations_list_shows_each_title_and_untitled_ones_as_such() -> None:
    out = io.StringIO()
    console = Console(file=out, width=120, color_system=None)
    rows = [
        {"id": "otters", "title": "Otters [bold]asleep", "status": "idle", "message_count": 2},
        {"id": "conv_1", "title": None, "status": "idle", "message_count": 0},
    ]
    console.print(conversations_table(rows))
    lines = out.getvalue().splitlines()

    assert lines[0].split() == ["conversation", "title", "status", "messages", "last", "used"]
    assert lines[1].split()[:4] == ["otters", "Otters", "[bold]asleep", "idle"]
    assert lines[2].split()[:3] == ["conv_1", "(untitled)", "idle"]
