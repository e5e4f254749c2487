"""The web playground in a real headless Chromium, against the real stack.

Debian's `chromium` (/usr/bin/chromium; `.ci/run` installs it) driven by Playwright's
async API in the test's own event loop, so a test can hold the scripted upstream or a
tool mid-turn and look at the page meanwhile. Each test has its own user (an API key of
its own), so the conversations a page lists are the test's. Every page fails its test on
a console error or an uncaught exception.

`BERNARD_PLAYGROUND_SCREENSHOTS=docs/screenshots` also saves the screenshots the README
shows (they are not written otherwise, so a test run leaves the work tree alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import tomllib
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, tool
from playwright.async_api import Browser, Page, Request, async_playwright, expect
from rich.console import Console

from api.routes.playground import CSP, ROOT
from launcher.cli import print_banner
from shared.notes import NoteStore
from shared.settings import Settings
from tests.conftest import Stack, make_settings, run_stack
from tests.upstream import Reply, ScriptedUpstream
from worker.tools import get_reporter

CHROMIUM = "/usr/bin/chromium"
HAVE_CHROMIUM = Path(CHROMIUM).exists()
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
KEY = "key-page"
SHOTS = os.environ.get("BERNARD_PLAYGROUND_SCREENSHOTS")
if SHOTS:
    Path(SHOTS).mkdir(parents=True, exist_ok=True)
ANSWER = (
    "Otters **hold hands** while they sleep, so they do not drift apart.\n\n"
    "- sea otters\n- river otters\n\nThat is all."
)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if not HAVE_CHROMIUM:
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} is missing: apt-get install chromium")
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        yield launched
        await launched.close()


def user_keys() -> str:
    """`BERNARD_API_KEYS` with one user no other test has."""
    return f"{KEY}:page-{uuid.uuid4().hex[:8]}"


@dataclass
class Playground:
    """One page of the playground and what went wrong in it."""

    page: Page
    stack: Stack
    errors: list[str] = field(default_factory=list)

    @property
    def answer(self):  # the last answer bubble
        return self.page.locator(".bubble.assistant").last

    async def send(self, text: str) -> None:
        await self.page.fill("#input", text)
        await self.page.press("#input", "Enter")

    async def idle(self) -> None:
        """Wait until no turn is live (the Send button is back)."""
        await expect(self.page.locator("#send")).to_be_visible(timeout=10_000)

    async def shot(self, name: str) -> None:
        if SHOTS:
            await self.page.screenshot(path=str(Path(SHOTS) / f"{name}.png"))


@dataclass
class Pages:
    """Opens pages of the playground; each is closed before its stack stops (a page's
    streams cut by a server going away are console errors of their own)."""

    browser: Browser
    opened: list[Playground] = field(default_factory=list)

    async def open(
        self, stack: Stack, *, key: str | None = KEY, conversation: str = "", script: str = ""
    ) -> Playground:
        """A fresh page of the stack's playground, with `key` already stored, on
        `conversation` if one is named (the URL's fragment); `script` runs before the
        page's own, in it and in every reload of it."""
        context = await self.browser.new_context(viewport={"width": 1000, "height": 640})
        if key is not None:
            await context.add_init_script(f"localStorage.setItem('bernard.apiKey', {key!r})")
        if script:
            await context.add_init_script(script)
        page = await context.new_page()
        playground = Playground(page, stack)
        page.on(
            "console",
            lambda m: playground.errors.append(m.text) if m.type == "error" else None,
        )
        page.on("pageerror", lambda exc: playground.errors.append(str(exc)))
        self.opened.append(playground)
        if key is None:
            await page.goto(stack.base_url + "/")
            return playground
        # Started: its own event stream (timers) is open.
        async with page.expect_response(lambda r: r.url.endswith("/v1/events")):
            await page.goto(stack.base_url + "/" + (f"#{conversation}" if conversation else ""))
        return playground

    async def close(self) -> None:
        for playground in self.opened:
            await playground.page.context.close()


@pytest.fixture
async def pages(browser: Browser) -> AsyncIterator[Pages]:
    """Pages of the playground; the test fails on any console error or uncaught exception
    in them."""
    opened = Pages(browser)
    yield opened
    await opened.close()
    assert [p.errors for p in opened.opened] == [[] for _ in opened.opened], "console errors"


@pytest.fixture
async def stack(upstream: ScriptedUpstream) -> AsyncIterator[Stack]:
    async with run_stack(make_settings(upstream, api_keys=user_keys())) as running:
        yield running


@contextlib.asynccontextmanager
async def stack_with_tools(
    upstream: ScriptedUpstream, pages: Pages, tools: Sequence[BaseTool]
) -> AsyncIterator[Stack]:
    """A stack whose worker has only `tools`; its pages close before it stops."""
    async with run_stack(make_settings(upstream, api_keys=user_keys()), tools=tools) as stack:
        try:
            yield stack
        finally:
            await pages.close()


# -- served -------------------------------------------------------------------------------


async def test_the_page_is_served_at_the_root_and_at_playground_outside_the_api_schema(
    stack: Stack,
) -> None:
    for path in ("/", "/playground"):
        page = await stack.client.get(path)
        assert page.status_code == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        assert page.headers["content-security-policy"] == CSP
        assert 'src="playground/app.js"' in page.text
    script = await stack.client.get("/playground/app.js")
    assert script.headers["content-type"] == "text/javascript; charset=utf-8"
    assert (await stack.client.get("/playground/vendor/purify.min.js")).status_code == 200
    missing = await stack.client.get("/playground/../pyproject.toml")
    assert missing.status_code == 404
    assert (await stack.client.get("/playground/nothing.js")).json()["error"]["code"] == (
        "not_found"
    )
    assert (await stack.client.get("/healthz")).json() == {"status": "ok"}
    async with run_stack(make_settings(api_docs=True), worker=False) as documented:
        paths = (await documented.client.get("/openapi.json")).json()["paths"]
    assert "/v1/conversations" in paths
    assert not [p for p in paths if p == "/" or p.startswith("/playground")]


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"])
async def test_the_api_docs_are_off_unless_a_setting_turns_them_on(stack: Stack, path: str) -> None:
    """/docs and /redoc load scripts from a CDN, on the origin where the playground keeps
    its API key: served only when the operator asks (BERNARD_API_DOCS)."""
    off = await stack.client.get(path)
    assert (off.status_code, off.json()["error"]["code"]) == (404, "not_found")
    async with run_stack(make_settings(api_docs=True), worker=False) as documented:
        on = await documented.client.get(path)
    assert on.status_code == 200


def test_every_playground_file_is_package_data() -> None:
    """A file the patterns miss would be absent from an installed (non-editable) Bernard."""
    pyproject = tomllib.loads((ROOT.parent.parent / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["api"]
    files = [p.relative_to(ROOT.parent).as_posix() for p in ROOT.rglob("*") if p.is_file()]
    assert "playground/index.html" in files
    for name in files:
        depth = len(PurePosixPath(name).parts)
        assert any(
            PurePosixPath(name).match(p) and len(PurePosixPath(p).parts) == depth for p in patterns
        ), name


def test_the_vendored_libraries_keep_their_licences() -> None:
    vendor = ROOT / "vendor"
    for script, licence in (
        ("marked.umd.js", "marked.LICENSE"),
        ("purify.min.js", "purify.LICENSE"),
    ):
        assert (vendor / script).stat().st_size > 10_000
        assert (vendor / licence).read_text().strip()
        assert script in (vendor / "README.md").read_text()


# -- streaming ------------------------------------------------------------------------------


async def test_tokens_appear_while_the_upstream_is_still_sending(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    gate = upstream.script(Reply.text(ANSWER, block_after=4))
    playground = await pages.open(stack)
    await playground.send("Tell me about otters")
    await gate.wait_blocked()
    await expect(playground.answer).to_have_text("Otters hold hands while")
    assert gate.blocked and not upstream.exchanges[-1].ended, "the upstream is still sending"
    await playground.shot("streaming")
    gate.release()
    await expect(playground.answer.locator("strong")).to_have_text("hold hands")
    await expect(playground.answer.locator("li")).to_have_text(["sea otters", "river otters"])
    await playground.idle()
    # The conversation is listed under its first message.
    await expect(playground.page.locator("#conversations .open")).to_have_text(
        ["Tell me about otters"]
    )


async def test_reloading_mid_answer_reattaches_and_ends_with_the_uninterrupted_text(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    upstream.script(Reply.text(ANSWER))
    playground = await pages.open(stack)
    page = playground.page
    await playground.send("otters, once")
    await playground.idle()
    uninterrupted = await playground.answer.inner_text()
    assert "That is all." in uninterrupted

    await page.click("#new-conversation")
    gate = upstream.script(Reply.text(ANSWER, block_after=6))
    await playground.send("otters, with a reload")
    await gate.wait_blocked()
    await expect(playground.answer).to_contain_text("Otters hold hands while they")
    saved = json.loads(await page.evaluate("sessionStorage.getItem('bernard.live')"))
    assert saved["turnId"] and saved["lastEventId"]

    reattached: list[Request] = []
    page.on("request", lambda r: reattached.append(r) if "/events" in r.url else None)
    await page.reload()
    # Drawn again from what the page kept, while the upstream still holds the rest.
    await expect(playground.answer).to_contain_text("Otters hold hands while they")
    assert not upstream.exchanges[-1].ended
    gate.release()
    await expect(playground.answer).to_contain_text("That is all.")
    await playground.idle()
    assert await playground.answer.inner_text() == uninterrupted
    turn_streams = [r for r in reattached if f"/v1/turns/{saved['turnId']}/events" in r.url]
    assert turn_streams, "the page reattached to the running turn"
    assert turn_streams[0].headers.get("last-event-id"), "from where it was"
    assert await page.evaluate("sessionStorage.getItem('bernard.live')") is None


# Counts the page's writes of its live turn, and the frames in which its callbacks ran.
COUNT_SAVES_AND_FRAMES = """
window.liveSaves = 0;
window.liveFrames = new Set();
const setItem = Storage.prototype.setItem;
Storage.prototype.setItem = function (key, value) {
  if (key === "bernard.live") window.liveSaves++;
  return setItem.call(this, key, value);
};
const frame = window.requestAnimationFrame.bind(window);
window.requestAnimationFrame = (callback) =>
  frame((time) => { window.liveFrames.add(time); callback(time); });
"""
# The frame that would save the live turn never comes (as in a tab the browser stopped
# drawing): drawing goes on.
NO_FRAME_SAVES = """
const frame = window.requestAnimationFrame.bind(window);
window.requestAnimationFrame = (callback) =>
  callback.name === "saveQueuedLive" ? 0 : frame(callback);
"""


async def test_a_long_answer_is_saved_for_a_reload_at_most_once_a_frame(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    """Each save writes the whole turn so far: one per event would grow as the square of
    the answer's length."""
    words = " ".join(f"word{n}" for n in range(300))
    upstream.script(Reply.text(words))
    playground = await pages.open(stack, script=COUNT_SAVES_AND_FRAMES)
    await playground.send("talk a while")
    await expect(playground.answer).to_contain_text("word299")
    await playground.idle()
    saves, frames = await playground.page.evaluate("[window.liveSaves, window.liveFrames.size]")
    # Besides the frames' saves: the turn's start, and its id once the API answers.
    assert saves <= frames + 2, (saves, frames)


async def saved_live(page: Page) -> dict[str, Any]:
    return json.loads(await page.evaluate("sessionStorage.getItem('bernard.live')"))


async def unsaved_mid_answer(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> tuple[Playground, Reply]:
    """A page whose frames never save, showing an answer the upstream holds (its gate)."""
    gate = upstream.script(Reply.text(ANSWER, block_after=6))
    playground = await pages.open(stack, script=NO_FRAME_SAVES)
    await playground.send("otters")
    await gate.wait_blocked()
    await expect(playground.answer).to_contain_text("Otters hold hands while they")
    saved = await saved_live(playground.page)
    assert saved["turnId"] and saved["lastEventId"] is None, "no frame saved the events"
    return playground, gate


async def test_a_reload_first_saves_what_the_next_frame_would_have(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    playground, gate = await unsaved_mid_answer(stack, upstream, pages)
    page = playground.page
    saved = await saved_live(page)
    reattached: list[Request] = []
    page.on("request", lambda r: reattached.append(r) if "/events" in r.url else None)
    await page.reload()
    await expect(playground.answer).to_contain_text("Otters hold hands while they")
    gate.release()
    await expect(playground.answer).to_contain_text("That is all.")
    await playground.idle()
    turn_streams = [r for r in reattached if f"/v1/turns/{saved['turnId']}/events" in r.url]
    assert turn_streams and turn_streams[0].headers.get("last-event-id"), "saved as it left"
    assert (await playground.answer.inner_text()).count("Otters") == 1


async def test_hiding_the_page_saves_what_the_next_frame_would_have(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    """A tab in the background gets no frames, and may be discarded there."""
    playground, gate = await unsaved_mid_answer(stack, upstream, pages)
    await playground.page.evaluate(
        """() => {
          Object.defineProperty(document, "visibilityState", { value: "hidden" });
          Object.defineProperty(document, "hidden", { value: true });
          document.dispatchEvent(new Event("visibilitychange"));
        }"""
    )
    saved = await saved_live(playground.page)
    assert saved["lastEventId"]
    answered = [segment["text"] for segment in saved["segments"] if segment["kind"] == "text"]
    assert answered and answered[0].startswith("Otters **hold hands** while they")
    gate.release()
    await playground.idle()


async def test_a_conversation_opened_while_a_turn_started_elsewhere_runs_follows_it_to_its_end(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    created = await stack.client.post(
        "/v1/conversations", json={"metadata": {"title": "from the CLI"}}, headers=headers
    )
    conversation = created.json()["id"]
    gate = upstream.script(Reply.text(ANSWER, block_after=4))

    async def elsewhere() -> list[str]:
        """A streaming turn another client started, read to its end."""
        async with stack.client.stream(
            "POST",
            f"/v1/conversations/{conversation}/messages",
            json={"content": "Tell me about otters"},
            headers={**headers, "Accept": "text/event-stream"},
        ) as response:
            assert response.status_code == 200
            return [line async for line in response.aiter_lines() if line.startswith("event:")]

    other_client = asyncio.create_task(elsewhere())
    await gate.wait_blocked()
    shown = (await stack.client.get(f"/v1/conversations/{conversation}", headers=headers)).json()
    assert shown["status"] == "running" and shown["turn_id"]

    playground = await pages.open(stack, conversation=conversation)
    page = playground.page
    await expect(page.locator(".bubble.user")).to_have_text(["Tell me about otters"])
    await expect(playground.answer).to_have_text("Otters hold hands while")
    await expect(page.locator("#cancel")).to_be_visible()  # the page holds it as its live turn
    assert not upstream.exchanges[-1].ended, "the upstream still holds the rest"
    gate.release()
    await expect(playground.answer.locator("strong")).to_have_text("hold hands")
    await expect(playground.answer.locator("li")).to_have_text(["sea otters", "river otters"])
    await expect(playground.answer).to_contain_text("That is all.")
    await playground.idle()
    await expect(page.locator(".bubble")).to_have_count(2)
    assert "event: done" in await other_client
    assert await page.evaluate("sessionStorage.getItem('bernard.live')") is None


async def test_model_output_is_markdown_and_never_runs_as_html_or_script(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    upstream.script(
        Reply.text(
            [
                "Look ",
                '<img src=x onerror="window.__pwned=1">',
                " and <script>window.__pwned=2</script>",
                ' <b onmouseover="window.__pwned=3">bold</b>',
                " [here](javascript:window.__pwned=4)",
                "\n\n![cat](javascript:window.__pwned=5) done.",
            ]
        )
    )
    playground = await pages.open(stack)
    await playground.send("be naughty")
    await expect(playground.answer).to_contain_text("done.")
    await playground.idle()
    answer = playground.answer
    # Markup in the answer is shown as the text it is.
    await expect(answer).to_contain_text('<img src=x onerror="window.__pwned=1">')
    await expect(answer).to_contain_text("<script>window.__pwned=2</script>")
    assert await answer.locator("img, script, b, [onerror], [onmouseover]").count() == 0
    # Links Markdown makes keep their text and lose a script URL.
    links = answer.locator("a")
    await expect(links).to_have_text(["here", "cat"])
    for link in await links.all():
        assert await link.get_attribute("href") is None
        await link.click()
    await answer.hover()
    await asyncio.sleep(0.2)
    assert await playground.page.evaluate("window.__pwned") is None


# -- tools -----------------------------------------------------------------------------------


async def test_a_tool_card_shows_its_progress_before_its_result(
    upstream: ScriptedUpstream, pages: Pages
) -> None:
    release = asyncio.Event()

    @tool
    async def survey(topic: str, config: RunnableConfig) -> str:
        """Survey a topic, slowly."""
        reporter = get_reporter(config)
        reporter.step(f"Surveying {topic}")
        reporter.progress(1, 3, "1 of 3 sources read")
        await release.wait()
        return f"{topic}: done"

    upstream.script_router(Reply.tool_calls([("survey", {"topic": "otters"})]))
    upstream.script(Reply.text("Otters are fine."))
    async with stack_with_tools(upstream, pages, [survey]) as stack:
        playground = await pages.open(stack)
        await playground.send("survey otters")
        card = playground.page.locator(".card.tool")
        await expect(card.locator(".tool-name")).to_have_text("survey")
        await expect(card.locator(".args")).to_contain_text('"topic": "otters"')
        await expect(card.locator(".steps li")).to_have_text(
            ["Surveying otters", "1 of 3 sources read"]
        )
        value = await card.locator("progress").evaluate("bar => bar.value")
        assert abs(value - 1 / 3) < 1e-6
        assert await card.locator(".result").count() == 0, "no result while the tool waits"
        await playground.shot("tool-progress")
        release.set()
        await expect(card.locator(".result pre")).to_have_text("otters: done")
        await expect(card.locator(".state")).to_have_text("done")
        await expect(card.locator("progress")).to_have_count(0)
        await expect(playground.answer).to_have_text("Otters are fine.")
        await playground.idle()


async def test_a_failed_tool_is_red_and_a_long_result_is_collapsed(
    upstream: ScriptedUpstream, pages: Pages
) -> None:
    @tool
    async def fetch_report() -> str:
        """A long report."""
        return "line of the report\n" * 40

    @tool
    async def broken() -> str:
        """Always fails."""
        raise ValueError("the widget is on fire")

    upstream.script_router(Reply.tool_calls([("fetch_report", {}), ("broken", {})]))
    upstream.script(Reply.text("One worked."))
    async with stack_with_tools(upstream, pages, [fetch_report, broken]) as stack:
        playground = await pages.open(stack)
        await playground.send("both")
        await expect(playground.answer).to_have_text("One worked.")
        report = playground.page.locator(".card.tool", has_text="fetch_report")
        failed = playground.page.locator(".card.tool", has_text="broken")
        await expect(report.locator("details.result")).not_to_have_attribute("open", "")
        await expect(report.locator("details.result summary")).to_contain_text("characters")
        await expect(failed).to_have_class("card tool error")
        await expect(failed.locator(".result pre")).to_contain_text("the widget is on fire")
        color = await failed.locator(".result pre").evaluate("e => getComputedStyle(e).color")
        assert color == "rgb(192, 38, 45)"
        await playground.idle()


async def test_approving_a_confirmation_with_edited_arguments_runs_the_tool(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    upstream.script_router(Reply.tool_calls([("save_note", {"text": "the door code is 1234"})]))
    playground = await pages.open(stack)
    page = playground.page
    await playground.send("remember the door code")
    confirm = page.locator(".card.confirm")
    await expect(confirm.locator(".summary")).to_have_text("Remember “the door code is 1234”")
    await playground.idle()
    await playground.shot("confirmation")
    notes = NoteStore(stack.redis, stack.settings.api_key_users()[KEY], retention_s=60)
    assert await notes.all() == [], "nothing ran before the decision"

    await confirm.locator("textarea").fill('{"text": "the door code is 4321"}')
    upstream.script(Reply.text("Saved it."))
    await confirm.get_by_role("button", name="Approve").click()
    await expect(confirm.locator(".state")).to_have_text("approved")
    card = page.locator(".card.tool", has_text="save_note")
    await expect(card.locator(".result pre")).to_have_text("Saved: the door code is 4321")
    await expect(playground.answer).to_have_text("Saved it.")
    await playground.idle()
    assert [note.text for note in await notes.all()] == ["the door code is 4321"]


async def test_a_confirmation_waiting_when_the_page_opens_can_be_rejected(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    upstream.script_router(Reply.tool_calls([("save_note", {"text": "a secret"})]))
    playground = await pages.open(stack)
    await playground.send("remember a secret")
    await expect(playground.page.locator(".card.confirm")).to_be_visible()
    await playground.idle()
    await playground.page.reload()  # the card comes back from the conversation's state
    confirm = playground.page.locator(".card.confirm")
    await expect(confirm.locator(".summary")).to_have_text("Remember “a secret”")
    upstream.script(Reply.text("I will not."))
    await confirm.get_by_role("button", name="Reject").click()
    await expect(playground.answer).to_have_text("I will not.")
    await expect(confirm.locator(".state")).to_have_text("rejected")
    notes = NoteStore(stack.redis, stack.settings.api_key_users()[KEY], retention_s=60)
    assert await notes.all() == []


# -- controls --------------------------------------------------------------------------------


async def test_cancel_stops_the_running_turn(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    upstream.script(Reply.slow(0.02))
    playground = await pages.open(stack)
    await playground.send("talk forever")
    await expect(playground.answer).to_contain_text("tick tick")
    await playground.page.click("#cancel")
    await expect(playground.page.locator(".status-line")).to_have_text("Cancelled.")
    await expect(playground.page.locator(".error-line").last).to_contain_text("turn_cancelled")
    await playground.idle()


async def test_the_trace_toggle_shows_prompts_latency_and_usage(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    upstream.script(Reply.text("Traced.", usage=(12, 3)))
    playground = await pages.open(stack)
    page = playground.page
    await page.check("#trace")
    await playground.send("trace me")
    await expect(playground.answer).to_have_text("Traced.")
    await playground.idle()
    traces = page.locator(".trace")
    await expect(traces.filter(has_text="prompt → router model router-model")).to_have_count(1)
    await expect(traces.filter(has_text="prompt → response model response-model")).to_have_count(1)
    answer_call = traces.filter(has_text=re.compile(r"^response model response-model: \d+ ms"))
    await expect(answer_call).to_contain_text("ms · 12 in, 3 out")
    await expect(traces.filter(has_text="turn: 12 prompt + 3 completion")).to_be_visible()
    prompt = traces.filter(has_text="prompt → response model").locator("details")
    await prompt.locator("summary").click()
    await expect(prompt.locator("pre")).to_contain_text("trace me")
    await playground.shot("trace")
    await page.uncheck("#trace")
    await expect(traces.first).to_be_hidden()


async def test_a_timer_rings_on_the_page(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    upstream.script_router(Reply.tool_calls([("set_timer", {"duration": "1s", "label": "tea"})]))
    upstream.script(Reply.text("Timer set."))
    playground = await pages.open(stack)
    await playground.send("tea timer, one second")
    await expect(playground.answer).to_have_text("Timer set.")
    notice = playground.page.locator(".notice.timer")
    await expect(notice).to_contain_text("Timer “tea” is done.", timeout=10_000)
    # The timer's message lands in its conversation, which the page shows again.
    await expect(playground.answer).to_have_text("⏰ Your timer “tea” is done.")


async def test_conversations_are_listed_opened_and_deleted(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    upstream.script(Reply.text("About otters."))
    upstream.script(Reply.text("About owls."))
    playground = await pages.open(stack)
    page = playground.page
    await playground.send("otters")
    await expect(playground.answer).to_have_text("About otters.")
    await playground.idle()
    await page.click("#new-conversation")
    await expect(page.locator(".bubble")).to_have_count(0)
    await playground.send("owls")
    await expect(playground.answer).to_have_text("About owls.")
    await playground.idle()
    items = page.locator("#conversations .open")
    await expect(items).to_have_text(["owls", "otters"])

    await items.filter(has_text="otters").click()
    await expect(page.locator(".bubble")).to_have_text(["otters", "About otters."])
    otters = page.url.split("#", 1)[1]
    await page.reload()  # the open conversation is in the URL
    await expect(page.locator(".bubble")).to_have_text(["otters", "About otters."])
    await playground.shot("conversations")

    delete = page.locator("#conversations li", has_text="otters").locator(".delete")
    await delete.click()
    await expect(delete).to_have_text("Delete?")
    await delete.click()
    await expect(items).to_have_text(["owls"])
    await expect(page.locator(".bubble")).to_have_count(0)
    gone = await stack.client.get(
        f"/v1/conversations/{otters}", headers={"Authorization": f"Bearer {KEY}"}
    )
    assert gone.status_code == 404


async def test_a_server_with_keys_asks_for_one_and_keeps_it(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    await stack.client.post(
        "/v1/conversations", json={"metadata": {"title": "kept"}}, headers=headers
    )
    playground = await pages.open(stack, key=None)
    page = playground.page
    box = page.locator("#keybox")
    await expect(box).to_be_visible()
    await expect(page.locator("#key-message")).to_contain_text("missing bearer token")
    await playground.shot("api-key")
    await page.fill("#key-input", "wrong")
    await page.click("#keybox button[type=submit]")
    await expect(page.locator("#key-message")).to_contain_text("invalid API key")
    await page.fill("#key-input", KEY)
    await page.click("#keybox button[type=submit]")
    await expect(box).to_be_hidden()
    await expect(page.locator("#conversations .open")).to_have_text(["kept"])
    await page.reload()
    await expect(page.locator("#conversations .open")).to_have_text(["kept"])
    await expect(box).to_be_hidden()
    # A 401 is the browser's own "Failed to load resource" console error: expected here.
    playground.errors[:] = [e for e in playground.errors if "401" not in e]


def test_the_launcher_prints_the_playground_url() -> None:
    out = io.StringIO()
    settings = Settings(_env_file=None, openai_base_url=None, openai_api_key=None)
    print_banner(Console(file=out, width=200), "http://127.0.0.1:8000", settings)
    lines = [line for line in out.getvalue().splitlines() if "playground" in line]
    assert lines == ["Open the playground in a browser: http://127.0.0.1:8000/"]
