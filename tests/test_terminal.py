"""The `bernard` command in a real terminal (tmux: tests/terminal.py), against the real stack.

What a test reads is the screen as a person sees it once tmux has applied every redraw:
the answer streamed as Markdown, a tool's panel with its live progress, the question before
a tool that changes things, a resume after the API process died mid-answer with every token
shown once, Ctrl-C, `turns list|tail` and `doctor`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import httpx
import pytest
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool

from launcher.redis_server import free_port
from shared.notes import NoteStore
from shared.settings import Settings
from tests.conftest import Stack, make_settings, run_stack
from tests.fakes.searxng import FakeSearxng
from tests.processes import BIN, ProcessGroup, settings_env, wait_for
from tests.terminal import Terminal, has_tmux
from tests.upstream import Reply, ScriptedUpstream
from worker.tools import default_tools
from worker.tools.progress import get_reporter

pytestmark = pytest.mark.skipif(not has_tmux(), reason="needs tmux (.ci/run installs it)")

CHAT = "/v1/chat/completions"
NOTE = ("save_note", {"text": "the door code is 1234"})
PROMPT = "you>"


def two_users() -> str:
    """`BERNARD_API_KEYS` for users no other test has."""
    run = uuid.uuid4().hex[:8]
    return f"key-alice:alice-{run},key-bob:bob-{run}"


def bernard(*args: str) -> list[str]:
    return [str(BIN / "bernard"), *args]


def cli_env(settings: Settings, base_url: str, key: str) -> dict[str, str]:
    """What the command sees: the deployment's settings, the API's URL and the key."""
    env = settings_env(settings)
    env.update(BERNARD_URL=base_url, BERNARD_API_KEY=key, LANG="C.UTF-8", LC_ALL="C.UTF-8")
    env.pop("TMUX", None)
    return env


@contextlib.asynccontextmanager
async def terminal(tmp_path: Path) -> AsyncIterator[Terminal]:
    term = Terminal(tmp_path)
    try:
        yield term
    except BaseException:
        if term.started:
            print(f"--- terminal ---\n{await term.screen()}")
        raise
    finally:
        await term.close()


async def notes_of(stack: Stack, key: str = "key-alice") -> list[str]:
    store = NoteStore(stack.redis, stack.settings.api_key_users()[key], retention_s=60)
    return [note.text for note in await store.all()]


async def turn_status(stack: Stack, turn_id: str, headers: Mapping[str, str]) -> str:
    response = await stack.client.get(f"/v1/turns/{turn_id}", headers=dict(headers))
    return str(response.json()["status"])


async def worker_reported_in(stack: Stack) -> None:
    """Until `/readyz` counts the worker (it reports in at its first lease renewal)."""

    async def ready() -> bool:
        return (await stack.client.get("/readyz")).status_code == 200

    await wait_for(ready, 20)


ALICE = {"Authorization": "Bearer key-alice"}
BOB = {"Authorization": "Bearer key-bob"}


# -- chat ------------------------------------------------------------------------------------------


async def test_chat_draws_a_tools_live_progress_then_its_result_and_the_answer_as_markdown(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    release = asyncio.Event()

    @tool
    async def survey(topic: str, config: RunnableConfig) -> str:
        """Survey a topic, slowly."""
        reporter = get_reporter(config)
        reporter.step(f"Surveying {topic}")
        reporter.progress(1, 3, "1 of 3 burrows")
        await release.wait()
        return f"{topic}: 3 burrows counted"

    upstream.script_router(Reply.tool_calls([("survey", {"topic": "otters"})]))
    upstream.script(Reply.text(["Otters", " are", " **fine**", "."]))
    settings = make_settings(upstream, api_keys=two_users())
    async with (
        run_stack(settings, tools=[*default_tools(), survey]) as stack,
        terminal(tmp_path) as term,
    ):
        await term.start(
            bernard("chat", "-c", "river"), cli_env(settings, stack.base_url, "key-alice")
        )
        await term.wait_for(PROMPT)
        await term.type("How are the otters?")

        running = await term.wait_for("1 of 3 burrows")
        assert "Surveying otters" in running
        assert "━" in running, "a progress bar"
        assert "3 burrows counted" not in running, "the tool is still running"
        release.set()
        done = await term.wait_for(lambda screen: screen.count(PROMPT) == 2)
        await term.press("C-d")
        code = await term.exit_code()

    assert "otters: 3 burrows counted" in done
    assert "Otters are fine." in done, "Markdown, rendered"
    assert "**" not in done
    assert done.index("otters: 3 burrows counted") < done.index("Otters are fine.")
    assert code == 0


async def test_chat_asks_before_a_tool_that_changes_things_and_runs_it_once_approved(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    settings = make_settings(upstream, api_keys=two_users())
    async with run_stack(settings) as stack, terminal(tmp_path) as term:
        await term.start(bernard("chat"), cli_env(settings, stack.base_url, "key-alice"))
        await term.wait_for(PROMPT)
        upstream.script_router(Reply.tool_calls([NOTE]))
        await term.type("remember that the door code is 1234")

        asking = await term.wait_for("Approve?")
        assert "Remember “the door code is 1234”" in asking
        assert await notes_of(stack) == [], "nothing runs before the answer"
        upstream.script(Reply.text("Saved it."))
        await term.type("y")
        done = await term.wait_for(lambda screen: screen.count(PROMPT) == 2)
        saved = await notes_of(stack)
        await term.press("C-d")
        code = await term.exit_code()

    assert "Saved: the door code is 1234" in done, "the tool's result"
    assert "Saved it." in done
    assert saved == ["the door code is 1234"]
    assert code == 0


async def test_chat_runs_edited_arguments_and_asks_again_when_they_are_not_json(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    settings = make_settings(upstream, api_keys=two_users())
    async with run_stack(settings) as stack, terminal(tmp_path) as term:
        await term.start(bernard("chat"), cli_env(settings, stack.base_url, "key-alice"))
        await term.wait_for(PROMPT)
        upstream.script_router(Reply.tool_calls([NOTE]))
        await term.type("remember that the door code is 1234")
        await term.wait_for("Approve?")
        await term.type("e")
        await term.wait_for("New arguments")
        await term.type("{not json")
        await term.wait_for("not JSON")
        await term.type("e")
        await term.wait_for(lambda screen: screen.count("New arguments") == 2)
        upstream.script(Reply.text("Saved the new one."))
        await term.type('{"text": "the door code is 4321"}')
        await term.wait_for("Saved the new one.")
        saved = await notes_of(stack)

    assert saved == ["the door code is 4321"]


async def test_chat_in_a_conversation_that_waits_asks_at_once_and_a_no_runs_nothing(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    settings = make_settings(upstream, api_keys=two_users())
    async with run_stack(settings) as stack, terminal(tmp_path) as term:
        await stack.client.post("/v1/conversations", json={"id": "hall"}, headers=ALICE)
        upstream.script_router(Reply.tool_calls([NOTE]))
        paused = await stack.client.post(
            "/v1/conversations/hall/messages",
            json={"content": "remember the door code"},
            headers=ALICE,
        )
        assert paused.json()["status"] == "awaiting_confirmation"
        await term.start(
            bernard("chat", "-c", "hall"), cli_env(settings, stack.base_url, "key-alice")
        )
        asking = await term.wait_for("Approve?")
        upstream.script(Reply.text("Fine, I won't."))
        await term.type("n")
        done = await term.wait_for(PROMPT)
        saved = await notes_of(stack)

    assert "Remember “the door code is 1234”" in asking
    assert "Fine, I won't." in done
    assert "The user declined" in done, "the declined call's result"
    assert saved == []


async def test_chat_resumes_after_the_api_restarts_mid_answer_and_shows_every_token_once(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    tokens = [f"{' ' if n else ''}tok{n}" for n in range(40)]
    settings = make_settings(upstream, api_keys=two_users())
    port = free_port()
    async with ProcessGroup(tmp_path / "logs") as procs, terminal(tmp_path) as term:
        await procs.worker(settings)
        first = await procs.api(settings, name="first-api", port=port)
        gate = upstream.script(Reply.text(tokens, block_after=15))
        await term.start(
            bernard("chat", "-c", "hall"), cli_env(settings, first.base_url or "", "key-alice")
        )
        await term.wait_for(PROMPT)
        await term.type("count for me")
        await gate.wait_blocked(timeout_s=30)
        await term.wait_for("tok14")

        first.kill()
        await term.wait_for("reconnecting")
        gate.release()
        await procs.api(settings, name="second-api", port=port)
        screen = await term.wait_for(lambda s: s.count(PROMPT) == 2, timeout_s=60)

    assert re.findall(r"\btok(\d+)\b", screen) == [str(n) for n in range(40)]


@pytest.mark.parametrize(("answer", "ends"), [("y", "cancelled"), ("n", "completed")])
async def test_ctrl_c_mid_answer_asks_whether_to_cancel_the_turn_then_leaves(
    upstream: ScriptedUpstream, tmp_path: Path, answer: str, ends: str
) -> None:
    settings = make_settings(upstream, api_keys=two_users())
    gate = upstream.script(Reply.text(["slowly", " but", " surely"], block_after=1))
    try:
        async with run_stack(settings) as stack, terminal(tmp_path) as term:
            await term.start(bernard("chat"), cli_env(settings, stack.base_url, "key-alice"))
            await term.wait_for(PROMPT)
            await term.type("take your time")
            await gate.wait_blocked(timeout_s=20)
            await term.wait_for("slowly")
            await term.press("C-c")
            asked = await term.wait_for("Cancel turn")
            match = re.search(r"Cancel turn ([0-9a-f]{32})", asked)
            assert match is not None
            turn_id = match[1]
            await term.type(answer)
            code = await term.exit_code()
            left = await term.screen()
            if answer == "n":
                assert await turn_status(stack, turn_id, ALICE) == "running"
                gate.release()
            for _ in range(100):
                if await turn_status(stack, turn_id, ALICE) == ends:
                    break
                await asyncio.sleep(0.1)
            status = await turn_status(stack, turn_id, ALICE)
    finally:
        gate.release()

    assert code == 0
    assert left.count("slowly") == 1, "what was drawn stays once, not twice"
    assert status == ends
    if answer == "n":
        assert f"bernard turns tail {turn_id}" in left
    else:
        assert f"Turn {turn_id} is cancelled." in left


# -- serve ---------------------------------------------------------------------------------------


async def test_serve_runs_bernard_until_ctrl_c(tmp_path: Path) -> None:
    settings = make_settings(None)
    port = free_port()
    env = cli_env(settings, f"http://127.0.0.1:{port}", "")
    env.update(HOST="127.0.0.1", PORT=str(port))
    async with terminal(tmp_path) as term, httpx.AsyncClient(timeout=5) as client:
        await term.start(bernard("serve"), env, cwd=tmp_path)
        ready = await term.wait_for("Bernard is ready", timeout_s=90)
        answered = await client.get(f"http://127.0.0.1:{port}/healthz")
        await term.press("C-c")
        code = await term.exit_code(timeout_s=60)

    assert f"Bernard is ready at http://127.0.0.1:{port}" in ready
    assert "offline demo model" in ready
    assert answered.status_code == 200
    assert code == 0


# -- turns ----------------------------------------------------------------------------------------


async def test_turns_list_shows_only_the_callers_turns(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    settings = make_settings(upstream, api_keys=two_users())
    async with run_stack(settings) as stack, terminal(tmp_path) as term:
        made = {}
        for who, headers in (("alice", ALICE), ("bob", BOB)):
            response = await stack.client.post(
                CHAT,
                json={
                    "model": "bernard-v1",
                    "messages": [{"role": "user", "content": f"hello from {who}"}],
                },
                headers=headers,
            )
            made[who] = response.headers["x-bernard-turn-id"]
        await term.start(bernard("turns", "list"), cli_env(settings, stack.base_url, "key-alice"))
        code = await term.exit_code()
        screen = await term.screen()

    assert code == 0
    assert made["alice"] in screen
    assert made["bob"] not in screen


async def test_turns_tail_follows_a_running_turn_to_its_end(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    gate = upstream.script(Reply.text(["first", " and", " last"], block_after=1))
    settings = make_settings(upstream, api_keys=two_users())
    try:
        async with run_stack(settings) as stack, terminal(tmp_path) as term:
            started = await stack.client.post(
                CHAT,
                json={
                    "model": "bernard-v1",
                    "background": True,
                    "messages": [{"role": "user", "content": "go"}],
                },
                headers=ALICE,
            )
            turn_id = started.json()["id"]
            await gate.wait_blocked(timeout_s=20)
            await term.start(
                bernard("turns", "tail", turn_id), cli_env(settings, stack.base_url, "key-alice")
            )
            following = await term.wait_for("first")
            assert "[exited" not in following
            gate.release()
            code = await term.exit_code()
            screen = await term.screen()
    finally:
        gate.release()

    assert code == 0
    assert "first and last" in screen


# -- doctor ---------------------------------------------------------------------------------------


async def test_doctor_on_a_healthy_stack_says_ok_for_each_check_and_exits_0(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    async with FakeSearxng() as searxng:
        settings = make_settings(upstream, api_keys=two_users(), searxng_url=searxng.base_url)
        async with run_stack(settings) as stack, terminal(tmp_path) as term:
            await worker_reported_in(stack)
            await term.start(bernard("doctor"), cli_env(settings, stack.base_url, "key-alice"))
            code = await term.exit_code(timeout_s=40)
            screen = await term.screen()

    for name in ("Redis", "Redis version", "Eviction policy", "Workers", "API", "Tools"):
        assert re.search(rf"^ok +{name} ", screen, re.MULTILINE), name
    assert re.search(r"^ok +LLM \(router\) +router-model answered", screen, re.MULTILINE)
    assert re.search(r"^ok +LLM \(response\) +response-model answered", screen, re.MULTILINE)
    assert re.search(rf"^ok +Tool web_search +{searxng.base_url} answers", screen, re.MULTILINE)
    # The tests' Redis keeps nothing on disk: a warning, with its fix; no failure.
    assert re.search(r"^warn +Persistence +AOF off", screen, re.MULTILINE)
    assert "fix: CONFIG SET appendonly yes" in screen
    assert "fail" not in screen
    assert code == 0


async def test_doctor_with_a_dead_redis_fails_with_the_fix_and_exits_1(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    settings = make_settings(upstream, api_keys=two_users())
    dead = f"redis://127.0.0.1:{free_port()}/0"
    async with run_stack(settings) as stack, terminal(tmp_path) as term:
        await term.start(
            bernard("doctor", "--redis-url", dead), cli_env(settings, stack.base_url, "key-alice")
        )
        code = await term.exit_code(timeout_s=40)
        screen = await term.screen()

    assert re.search(rf"^fail +Redis +no Redis answers at {re.escape(dead)}", screen, re.MULTILINE)
    assert "fix: start Redis, or point REDIS_URL (or --redis-url) at the one Bernard uses" in screen
    assert code == 1


def test_the_command_is_installed() -> None:
    assert os.access(BIN / "bernard", os.X_OK), "pip install -e . (./run does) installs it"
