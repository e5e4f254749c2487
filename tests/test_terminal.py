"""The `bernard` command in a real terminal (tmux: tests/support/terminal.py), against the real
stack.

What a test reads is the screen as a person sees it once tmux has applied every redraw:
the answer streamed as Markdown, a tool's panel with its live progress, the question before
a tool that changes things, its arguments edited in `$EDITOR`, a resume after the API
process died mid-answer with every token shown once, Ctrl-C, the line's editing keys,
multi-line input and paste, history across sessions, `turns list|tail` and `doctor`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import httpx
import pytest
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool

from launcher.redis_server import free_port
from shared.notes import NoteStore
from shared.settings import Settings
from shared.titles import TITLE_PROMPT
from tests.fakes.searxng import FakeSearxng
from tests.support.processes import BIN, ProcessGroup, settings_env, wait_for
from tests.support.stack import Stack, make_config, make_settings, run_stack
from tests.support.terminal import Terminal, has_tmux
from tests.support.upstream import Body, Reply, ScriptedUpstream
from tests.support.users import ALICE, BOB, keys_for_two
from worker.tools import default_tools
from worker.tools.progress import get_reporter

pytestmark = pytest.mark.skipif(not has_tmux(), reason="needs tmux (.ci/run installs it)")

CHAT = "/v1/chat/completions"
NOTE = ("save_note", {"text": "the door code is 1234"})
PROMPT = "you>"


def bernard(*args: str) -> list[str]:
    return [str(BIN / "bernard"), *args]


def cli_env(settings: Settings, base_url: str, key: str, home: Path) -> dict[str, str]:
    """What the command sees: the deployment's settings, the API's URL and the key, and a
    data directory of the test's own (`home`/data: the chat's history goes there)."""
    env = settings_env(settings)
    env.update(BERNARD_URL=base_url, BERNARD_API_KEY=key, LANG="C.UTF-8", LC_ALL="C.UTF-8")
    env["XDG_DATA_HOME"] = str(home / "data")
    for name in ("TMUX", "EDITOR", "VISUAL"):
        env.pop(name, None)
    return env


@contextlib.asynccontextmanager
async def terminal(tmp_path: Path, width: int = 160, height: int = 48) -> AsyncIterator[Terminal]:
    term = Terminal(tmp_path, width=width, height=height)
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
    settings = make_settings(upstream, api_keys=keys_for_two())
    async with (
        run_stack(settings, tools=[*default_tools(), survey]) as stack,
        terminal(tmp_path) as term,
    ):
        await term.start(
            bernard("chat", "-c", "river"), cli_env(settings, stack.base_url, "key-alice", tmp_path)
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
    settings = make_settings(upstream, api_keys=keys_for_two())
    async with run_stack(settings) as stack, terminal(tmp_path) as term:
        await term.start(bernard("chat"), cli_env(settings, stack.base_url, "key-alice", tmp_path))
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
    assert "save_note · approved" in done
    assert done.count('{"text": "the door code is 1234"}') == 1, "the arguments drawn once"
    assert "Saved it." in done
    assert saved == ["the door code is 1234"]
    assert code == 0


async def test_two_calls_of_one_step_are_drawn_once_each_and_each_question_says_which(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    settings = make_settings(upstream, api_keys=keys_for_two())
    gate_code = ("save_note", {"text": "the gate code is 9"})
    async with run_stack(settings) as stack, terminal(tmp_path) as term:
        await term.start(bernard("chat"), cli_env(settings, stack.base_url, "key-alice", tmp_path))
        await term.wait_for(PROMPT)
        upstream.script_router(Reply.tool_calls([NOTE, gate_code]))
        await term.type("remember both codes")
        await term.wait_for("Approve?")
        await term.type("y")
        await term.wait_for(lambda screen: screen.count("Approve?") == 2)
        upstream.script(Reply.text("Saved both."))
        await term.type("y")
        done = await term.wait_for(lambda screen: screen.count(PROMPT) == 2)
        saved = await notes_of(stack)

    assert done.count("waits for your decision") == 2, "one card per call, never again"
    assert re.findall(r"About: (.*)\n", done) == [
        "Remember “the door code is 1234”",
        "Remember “the gate code is 9”",
    ]
    assert done.count("save_note · approved") == 2
    assert "Saved both." in done
    assert sorted(saved) == ["the door code is 1234", "the gate code is 9"]


# An $EDITOR that writes broken JSON the first time it runs and fixes it the second, keeping
# a copy of what it was given each time.
EDITOR_SCRIPT = """#!/bin/sh
n=$(ls "$0".seen.* 2>/dev/null | wc -l)
cp "$1" "$0.seen.$n"
if [ "$n" = 0 ]; then
  printf '{"text": "the door code is 4321",' > "$1"
else
  printf '{"text": "the door code is 4321"}' > "$1"
fi
"""


async def test_e_opens_the_arguments_in_the_editor_and_asks_again_when_they_are_not_json(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    editor = tmp_path / "editor"
    editor.write_text(EDITOR_SCRIPT)
    editor.chmod(0o755)
    settings = make_settings(upstream, api_keys=keys_for_two())
    async with run_stack(settings) as stack, terminal(tmp_path) as term:
        env = cli_env(settings, stack.base_url, "key-alice", tmp_path)
        env["EDITOR"] = str(editor)
        await term.start(bernard("chat"), env)
        await term.wait_for(PROMPT)
        upstream.script_router(Reply.tool_calls([NOTE]))
        await term.type("remember that the door code is 1234")
        await term.wait_for("Approve?")
        await term.type("e")
        refused = await term.wait_for("not JSON")
        assert await notes_of(stack) == [], "nothing runs on arguments that are not JSON"
        await term.type("e")
        upstream.script(Reply.text("Saved the new one."))
        await term.wait_for("Saved the new one.")
        saved = await notes_of(stack)

    assert "(e edits them again)" in refused
    first = (tmp_path / "editor.seen.0").read_text()
    second = (tmp_path / "editor.seen.1").read_text()
    assert first == '{\n  "text": "the door code is 1234"\n}\n', "laid out for editing"
    assert second == '{"text": "the door code is 4321",', "the refused edit, to fix"
    assert saved == ["the door code is 4321"]


async def test_chat_in_a_conversation_that_waits_asks_at_once_and_a_no_runs_nothing(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    settings = make_settings(upstream, api_keys=keys_for_two())
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
            bernard("chat", "-c", "hall"), cli_env(settings, stack.base_url, "key-alice", tmp_path)
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
    settings = make_settings(upstream, api_keys=keys_for_two())
    port = free_port()
    async with ProcessGroup(tmp_path / "logs") as procs, terminal(tmp_path) as term:
        await procs.worker(settings)
        first = await procs.api(settings, name="first-api", port=port)
        gate = upstream.script(Reply.text(tokens, block_after=15))
        await term.start(
            bernard("chat", "-c", "hall"),
            cli_env(settings, first.base_url or "", "key-alice", tmp_path),
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


# A paragraph still being written when Ctrl-C comes, longer than the screen is high.
WORDS = [f"{' ' if n else ''}word{n}" for n in range(120)]


async def test_ctrl_c_mid_answer_stops_the_turn_at_once_and_draws_it_to_its_end(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    """No question while the turn runs on: the first Ctrl-C stops it, the drawing goes on to
    its end (every word it said, once), says `stopped` and comes back to the prompt."""
    settings = make_settings(upstream, api_keys=keys_for_two())
    gate = upstream.script(Reply.text(WORDS, block_after=100))
    try:
        async with run_stack(settings) as stack, terminal(tmp_path, width=60, height=12) as term:
            await term.start(
                bernard("chat", "-c", "slow"),
                cli_env(settings, stack.base_url, "key-alice", tmp_path),
            )
            await term.wait_for(PROMPT)
            await term.type("take your time")
            await gate.wait_blocked(timeout_s=20)
            await term.wait_for("word99")
            turn_id = (await stack.client.get("/v1/conversations/slow", headers=ALICE)).json()[
                "turn_id"
            ]
            await term.press("C-c")
            back = await term.wait_for(lambda screen: screen.count(PROMPT) == 2, timeout_s=5)
            status = await turn_status(stack, turn_id, ALICE)
            await term.press("C-d")
            code = await term.exit_code()
    finally:
        gate.release()

    # Every word drawn before Ctrl-C is on screen once, in order: none lost to a redraw
    # that scrolled, none printed twice.
    assert re.findall(r"\bword(\d+)\b", back) == [str(n) for n in range(100)]
    assert status == "cancelled"
    assert code == 0, "Ctrl-C never leaves; Ctrl-D does"
    assert re.search(r"^stopped$", back, re.MULTILINE)
    assert "Stop this turn?" not in back and "turn_cancelled" not in back


async def conversation_contents(stack: Stack, conversation_id: str) -> list[str]:
    """The user messages the API stored in the conversation, oldest first."""
    page = await stack.client.get(f"/v1/conversations/{conversation_id}/messages", headers=ALICE)
    return [row["content"] for row in page.json()["data"] if row["role"] == "user"]


async def test_the_line_edits_like_a_shell_and_sends_several_lines_and_pastes_whole(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    settings = make_settings(upstream, api_keys=keys_for_two())
    async with run_stack(settings) as stack, terminal(tmp_path) as term:
        await term.start(
            bernard("chat", "-c", "keys"), cli_env(settings, stack.base_url, "key-alice", tmp_path)
        )
        await term.wait_for(PROMPT)
        await term.type("hello wrld", enter=False)
        await term.press("Left", "Left", "Left")
        await term.type("o", enter=False)
        await term.press("C-a")
        await term.type("say: ", enter=False)
        await term.press("End")
        await term.type("!")
        await term.wait_for(lambda screen: screen.count(PROMPT) == 2)
        await term.type("line one", enter=False)
        await term.press("M-Enter")
        await term.type("line two")
        await term.wait_for(lambda screen: screen.count(PROMPT) == 3)
        await term.paste("pasted one\npasted two\n")
        pasted = await term.wait_for("pasted two")
        assert pasted.count(PROMPT) == 3, "a paste's newlines do not send it"
        await term.press("BSpace", "Enter")
        await term.wait_for(lambda screen: screen.count(PROMPT) == 4)
        await term.type("/he", enter=False)
        await term.press("Tab")
        await term.wait_for("you> /help")
        await term.press("Enter")
        helped = await term.wait_for("start a new conversation")
        stored = await conversation_contents(stack, "keys")
        await term.press("C-d")
        code = await term.exit_code()

    assert stored == ["say: hello world!", "line one\nline two", "pasted one\npasted two"]
    assert "Alt-Enter" in helped, "/help, completed from /he, lists the keys"
    assert code == 0


async def test_up_recalls_what_was_sent_in_an_earlier_session(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    settings = make_settings(upstream, api_keys=keys_for_two())
    async with run_stack(settings) as stack:
        env = cli_env(settings, stack.base_url, "key-alice", tmp_path)
        async with terminal(tmp_path) as first:
            await first.start(bernard("chat", "-c", "memory"), env)
            await first.wait_for(PROMPT)
            await first.type("what is the capital of Peru?")
            await first.wait_for(lambda screen: screen.count(PROMPT) == 2)
            await first.press("C-d")
            assert await first.exit_code() == 0
        async with terminal(tmp_path) as second:
            await second.start(bernard("chat", "-c", "memory"), env)
            await second.wait_for(PROMPT)
            await second.press("Up")
            recalled = await second.wait_for("you> what is the capital of Peru?")
            await second.press("Enter")
            await second.wait_for(lambda screen: screen.count(PROMPT) == 2)
        bob = cli_env(settings, stack.base_url, "key-bob", tmp_path)
        async with terminal(tmp_path) as other:
            await other.start(bernard("chat"), bob)
            await other.wait_for(PROMPT)
            await other.press("Up")
            await asyncio.sleep(0.5)
            bobs = await other.screen()
        stored = await conversation_contents(stack, "memory")
        files = list((tmp_path / "data" / "bernard" / "history").iterdir())

    assert "capital of Peru" in recalled
    assert stored == ["what is the capital of Peru?", "what is the capital of Peru?"]
    assert "capital of Peru" not in bobs, "another key has a history of its own"
    assert len(files) == 2 and all(f.stat().st_mode & 0o077 == 0 for f in files)


# -- serve ---------------------------------------------------------------------------------------


async def test_serve_runs_bernard_until_ctrl_c(tmp_path: Path) -> None:
    settings = make_settings(None)
    port = free_port()
    env = cli_env(settings, f"http://127.0.0.1:{port}", "", tmp_path)
    env.update(HOST="127.0.0.1", PORT=str(port))
    async with terminal(tmp_path) as term, httpx.AsyncClient(timeout=5) as client:
        await term.start(bernard("serve"), env, cwd=tmp_path)
        ready = await term.wait_for("Ctrl-C stops everything", timeout_s=90)
        answered = await client.get(f"http://127.0.0.1:{port}/healthz")
        await term.press("C-c")
        code = await term.exit_code(timeout_s=60)

    assert f"Bernard is ready at http://127.0.0.1:{port}" in ready
    assert "offline demo model" in ready
    assert re.search(r"^Command line: \S*bernard chat ", ready, re.MULTILINE)
    assert answered.status_code == 200
    assert code == 0


# -- turns ----------------------------------------------------------------------------------------


async def test_turns_list_shows_the_callers_turns_and_what_each_was_about(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    settings = make_settings(upstream, api_keys=keys_for_two())
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
        await term.start(
            bernard("turns", "list"), cli_env(settings, stack.base_url, "key-alice", tmp_path)
        )
        code = await term.exit_code()
        screen = await term.screen()

    assert code == 0
    assert made["alice"] in screen
    assert made["bob"] not in screen
    assert re.search(rf"{made['alice']} +completed +[-0-9: ]+ +hello from alice", screen)


async def test_conversations_list_shows_titles_and_rename_sets_ones_own(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    def respond(body: Body) -> Reply:
        if body["messages"][0]["content"] == TITLE_PROMPT:
            return Reply.text("Otters asleep")
        return Reply.text("They hold hands.")

    upstream.responder = respond
    settings = make_settings(upstream, api_keys=keys_for_two(), conversation_titles=True)
    async with run_stack(settings) as stack:
        for conversation_id in ("otters", "hall"):
            await stack.client.post(
                "/v1/conversations", json={"id": conversation_id}, headers=ALICE
            )
        await stack.client.post(
            "/v1/conversations/otters/messages", json={"content": "Do otters sleep?"}, headers=ALICE
        )

        async def titled() -> bool:
            got = await stack.client.get("/v1/conversations/otters", headers=ALICE)
            return got.json()["title"] is not None

        await wait_for(titled, 10)
        env = cli_env(settings, stack.base_url, "key-alice", tmp_path)
        async with terminal(tmp_path / "rename") as term:
            await term.start(bernard("conversations", "rename", "hall", "Hall lights"), env)
            renamed_code = await term.exit_code()
            renamed = await term.screen()
        async with terminal(tmp_path / "list") as term:
            await term.start(bernard("conversations", "list"), env)
            code = await term.exit_code()
            screen = await term.screen()

    assert renamed_code == 0 and "Renamed hall: Hall lights" in renamed
    assert code == 0
    assert re.search(r"otters +Otters asleep +idle +2 ", screen), screen
    assert re.search(r"hall +Hall lights +idle +0 ", screen), screen


async def test_turns_tail_follows_a_running_turn_to_its_end(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    gate = upstream.script(Reply.text(["first", " and", " last"], block_after=1))
    settings = make_settings(upstream, api_keys=keys_for_two())
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
                bernard("turns", "tail", turn_id),
                cli_env(settings, stack.base_url, "key-alice", tmp_path),
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


async def test_doctor_in_another_terminal_reports_the_server_as_it_is_and_exits_0(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    """Run as a second terminal would: none of the server's settings in the environment,
    and outside the project folder."""
    async with FakeSearxng() as searxng:
        config = make_config(upstream, api_keys=keys_for_two(), searxng_url=searxng.base_url)
        settings = config.settings
        async with config.stack() as stack, terminal(tmp_path) as term:
            await worker_reported_in(stack)
            env = {
                name: value
                for name, value in cli_env(settings, stack.base_url, "key-alice", tmp_path).items()
                if name in ("BERNARD_URL", "BERNARD_API_KEY")
                or not name.startswith(("BERNARD_", "OPENAI_", "REDIS_"))
            }
            await term.start(bernard("doctor"), env, cwd=tmp_path)
            code = await term.exit_code(timeout_s=40)
            screen = await term.screen()

    for name in ("API", "Key", "Version", "Redis", "Redis version", "Eviction policy", "Workers"):
        assert re.search(rf"^ok +{name} ", screen, re.MULTILINE), name
    assert re.search(
        rf"^ok +Redis +{re.escape(settings.redis_url)} answers \(single; data and queue\)",
        screen,
        re.MULTILINE,
    )
    model = rf"at {re.escape(upstream.base_url)} answers"
    assert re.search(rf"^ok +LLM \(router\) +router-model {model}", screen, re.MULTILINE)
    assert re.search(rf"^ok +LLM \(response\) +response-model {model}", screen, re.MULTILINE)
    assert "offline demo model" not in screen
    assert re.search(r"^ok +Tools +calculator, ", screen, re.MULTILINE)
    assert re.search(rf"^ok +Tool web_search +{searxng.base_url} answers", screen, re.MULTILINE)
    # The tests' Redis keeps nothing on disk: a warning, with its fix; no failure.
    assert re.search(r"^warn +Persistence +AOF off", screen, re.MULTILINE)
    assert "fix: CONFIG SET appendonly yes" in screen
    assert "fail" not in screen
    assert code == 0


async def test_doctor_with_a_key_the_server_refuses_fails_saying_so(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    settings = make_settings(upstream, api_keys=keys_for_two())
    async with run_stack(settings) as stack, terminal(tmp_path) as term:
        await term.start(
            bernard("doctor"), cli_env(settings, stack.base_url, "key-mallory", tmp_path)
        )
        code = await term.exit_code(timeout_s=40)
        screen = await term.screen()

    assert re.search(r"^ok +API ", screen, re.MULTILINE)
    assert re.search(r"^fail +Key +the API refuses it: invalid API key", screen, re.MULTILINE)
    assert "fix: pass --key or set BERNARD_API_KEY" in screen
    assert code == 1


async def test_doctor_with_a_dead_redis_fails_with_the_fix_and_exits_1(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    settings = make_settings(upstream, api_keys=keys_for_two())
    dead = f"redis://127.0.0.1:{free_port()}/0"
    async with run_stack(settings) as stack, terminal(tmp_path) as term:
        await term.start(
            bernard("doctor", "--redis-url", dead),
            cli_env(settings, stack.base_url, "key-alice", tmp_path),
        )
        code = await term.exit_code(timeout_s=40)
        screen = await term.screen()

    assert re.search(rf"^fail +Redis +no Redis answers at {re.escape(dead)}", screen, re.MULTILINE)
    assert "fix: start Redis, or point REDIS_URL (or --redis-url) at the one Bernard uses" in screen
    assert code == 1


def test_the_command_is_installed() -> None:
    assert os.access(BIN / "bernard", os.X_OK), "pip install -e . (./run does) installs it"
