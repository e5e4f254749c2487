"""The web playground in a real headless Chromium, against the real stack.

Debian's `chromium` (/usr/bin/chromium; `.ci/run` installs it) driven by Playwright's
async API in the test's own event loop, so a test can hold the scripted upstream or a
tool mid-turn and look at the page meanwhile. Each test has its own user (an API key of
its own), so the conversations a page lists are the test's. Every page fails its test on
a console error or an uncaught exception.

Every browser test runs at a desktop's width (1280 px) and a phone's (390 px): on the
phone the conversations are a drawer the page's menu button opens.

`BERNARD_PLAYGROUND_SCREENSHOTS=docs/screenshots` also saves the screenshots docs/clients.md
shows, at both widths (they are not written otherwise, so a test run leaves the work tree
alone).
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
from playwright.async_api import (
    Browser,
    FloatRect,
    Locator,
    Page,
    Request,
    Route,
    ViewportSize,
    async_playwright,
    expect,
)
from rich.console import Console

from api.routes.playground import CSP, ROOT
from launcher.cli import print_banner
from shared.notes import NoteStore
from shared.settings import Settings
from tests.fakes.home_assistant import FakeHomeAssistant
from tests.support.stack import Stack, make_config, make_settings, run_stack
from tests.support.upstream import Reply, ScriptedUpstream
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
# An expectation waits until it holds, 5 s by default: a turn's answer took longer with the
# suite on three workers of a loaded two-core machine. Waiting longer costs only a failing
# test's time.
expect.set_options(timeout=15_000)


@dataclass(frozen=True)
class Viewport:
    name: str
    width: int
    height: int

    @property
    def phone(self) -> bool:
        return self.width < 720  # style.css: the drawer's breakpoint


DESKTOP = Viewport("desktop", 1280, 800)
PHONE = Viewport("phone", 390, 844)
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
    viewport: Viewport
    errors: list[str] = field(default_factory=list)

    @property
    def answer(self) -> Locator:  # the last answer bubble
        return self.page.locator(".bubble.assistant").last

    async def send(self, text: str) -> None:
        await self.page.fill("#input", text)
        await self.page.press("#input", "Enter")

    async def idle(self) -> None:
        """Wait until no turn is live (the Send button is back)."""
        await expect(self.page.locator("#send")).to_be_visible(timeout=10_000)

    async def shot(self, name: str) -> None:
        if SHOTS:
            # As a deployment looks once its worker is up (the status lags its start).
            if await self.page.locator("#keybox").is_hidden():
                footer = self.page.locator("#status")
                alive = re.compile(r"\d+ workers? alive")
                await expect(footer).to_contain_text(alive, timeout=15_000)
            suffix = "-phone" if self.viewport.phone else ""
            await self.page.screenshot(path=str(Path(SHOTS) / f"{name}{suffix}.png"))

    async def conversations(self) -> Locator:
        """The listed conversations' buttons, in reach: on a phone, in the drawer opened."""
        if self.viewport.phone and not await self.page.locator("#sidebar").is_visible():
            await self.page.click("#menu")
            await expect(self.page.locator("#sidebar")).to_be_in_viewport(ratio=1)
        return self.page.locator("#conversations .open")

    async def new_conversation(self) -> None:
        await self.conversations()
        await self.page.click("#new-conversation")


@dataclass
class Pages:
    """Opens pages of the playground; each is closed before its stack stops (a page's
    streams cut by a server going away are console errors of their own)."""

    browser: Browser
    viewport: Viewport
    opened: list[Playground] = field(default_factory=list)

    async def open(
        self, stack: Stack, *, key: str | None = KEY, conversation: str = "", script: str = ""
    ) -> Playground:
        """A fresh page of the stack's playground, with `key` already stored, on
        `conversation` if one is named (the URL's fragment); `script` runs before the
        page's own, in it and in every reload of it."""
        size = ViewportSize(width=self.viewport.width, height=self.viewport.height)
        context = await self.browser.new_context(viewport=size, is_mobile=self.viewport.phone)
        if key is not None:
            await context.add_init_script(f"localStorage.setItem('bernard.apiKey', {key!r})")
        if script:
            await context.add_init_script(script)
        page = await context.new_page()
        playground = Playground(page, stack, self.viewport)
        page.on(
            "console",
            lambda m: playground.errors.append(m.text) if m.type == "error" else None,
        )
        page.on("pageerror", lambda exc: playground.errors.append(str(exc)))
        self.opened.append(playground)
        if key is None:
            await page.goto(stack.base_url + "/")
            return playground
        # Started: its own event stream (timers) is open, and the conversation named and its
        # rows read, so what happens to it next is news to the page.
        path = f"/v1/conversations/{conversation}"
        async with (
            page.expect_response(lambda r: r.url.endswith("/v1/events")),
            page.expect_response(lambda r: not conversation or r.url.endswith(path)),
            page.expect_response(lambda r: not conversation or f"{path}/messages?" in r.url),
        ):
            await page.goto(stack.base_url + "/" + (f"#{conversation}" if conversation else ""))
        return playground

    async def close(self) -> None:
        for playground in self.opened:
            await playground.page.context.close()


@pytest.fixture(params=[DESKTOP, PHONE], ids=lambda v: f"{v.width}px")
async def pages(browser: Browser, request: pytest.FixtureRequest) -> AsyncIterator[Pages]:
    """Pages of the playground, at a desktop's width and at a phone's; the test fails on any
    console error or uncaught exception in them."""
    opened = Pages(browser, request.param)
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

    await playground.new_conversation()
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


async def test_approving_a_confirmation_with_edited_arguments_runs_the_tool_in_its_card(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    """One card from proposal to result: the decision and the arguments that ran are shown
    in it, no second card repeats them."""
    upstream.script_router(Reply.tool_calls([("save_note", {"text": "the door code is 1234"})]))
    playground = await pages.open(stack)
    page = playground.page
    await playground.send("remember the door code")
    confirm = page.locator(".card.confirm")
    await expect(confirm.locator(".summary")).to_have_text("Remember “the door code is 1234”")
    await expect(confirm.locator(".state")).to_have_text("waiting for your decision")
    await playground.idle()
    await playground.shot("confirmation")
    notes = NoteStore(stack.redis, stack.settings.api_key_users()[KEY], retention_s=60)
    assert await notes.all() == [], "nothing ran before the decision"

    await confirm.locator("textarea").fill('{"text": "the door code is 4321"}')
    upstream.script(Reply.text("Saved it."))
    await confirm.get_by_role("button", name="Approve").click()
    await expect(playground.answer).to_have_text("Saved it.")
    await playground.idle()
    await expect(page.locator(".card")).to_have_count(1)
    await expect(confirm.locator(".state")).to_have_text("approved · done")
    await expect(confirm.locator(".decision")).to_have_text("Approved with your edits")
    await expect(confirm.locator(".summary")).to_have_class("summary proposed")
    await expect(confirm.locator(".args")).to_have_text('{\n  "text": "the door code is 4321"\n}')
    await expect(confirm.locator(".result pre")).to_have_text("Saved: the door code is 4321")
    await expect(confirm.locator("textarea, button")).to_have_count(0)
    await playground.shot("confirmation-approved")
    assert [note.text for note in await notes.all()] == ["the door code is 4321"]


async def test_a_confirmation_waiting_when_the_page_opens_can_be_rejected(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    upstream.script_router(Reply.tool_calls([("save_note", {"text": "a secret"})]))
    playground = await pages.open(stack)
    page = playground.page
    await playground.send("remember a secret")
    await expect(page.locator(".card.confirm")).to_be_visible()
    await playground.idle()
    await page.reload()  # the card comes back from the conversation's state, once
    confirm = page.locator(".card.confirm")
    await expect(confirm.locator(".summary")).to_have_text("Remember “a secret”")
    await expect(page.locator(".card")).to_have_count(1)
    await expect(confirm.locator(".state")).to_have_text("waiting for your decision")
    upstream.script(Reply.text("I will not."))
    await confirm.get_by_role("button", name="Reject").click()
    await expect(playground.answer).to_have_text("I will not.")
    await expect(confirm.locator(".state")).to_have_text("rejected")
    await expect(confirm.locator(".decision")).to_have_text("Rejected: it did not run")
    await page.reload()  # and as stored, decided
    await expect(playground.answer).to_have_text("I will not.")
    await expect(page.locator(".card")).to_have_count(1)
    await expect(confirm.locator(".state")).to_have_text("rejected")
    notes = NoteStore(stack.redis, stack.settings.api_key_users()[KEY], retention_s=60)
    assert await notes.all() == []


async def test_each_call_of_a_step_keeps_one_card_through_its_decisions(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    upstream.script_router(
        Reply.tool_calls([("save_note", {"text": "milk"}), ("save_note", {"text": "eggs"})])
    )
    playground = await pages.open(stack)
    page = playground.page
    await playground.send("remember milk and eggs")
    cards = page.locator(".card")
    await expect(cards.locator(".state")).to_have_text(
        ["waiting for your decision", "waiting for your decision"]
    )
    await playground.idle()
    await cards.nth(0).get_by_role("button", name="Approve").click()
    # The answer to the first decision repeats the second proposal: no card of its own.
    await expect(cards.locator(".state")).to_have_text(
        ["approved · runs once every call is decided", "waiting for your decision"]
    )
    await playground.idle()
    upstream.script(Reply.text("Milk only."))
    await cards.nth(1).get_by_role("button", name="Reject").click()
    await expect(playground.answer).to_have_text("Milk only.")
    await expect(cards.locator(".state")).to_have_text(["approved · done", "rejected"])
    await playground.idle()
    await page.reload()
    await expect(playground.answer).to_have_text("Milk only.")
    await expect(cards.locator(".state")).to_have_text(["done", "rejected"])


# -- layout, first screen, titles, footer -----------------------------------------------------


async def box(locator: Locator) -> FloatRect:
    found = await locator.bounding_box()
    assert found is not None
    return found


async def test_on_a_phone_the_conversations_are_a_drawer_and_the_chat_takes_the_width(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    upstream.script(Reply.text("About otters."))
    playground = await pages.open(stack)
    page = playground.page
    await playground.send("otters")
    await expect(playground.answer).to_have_text("About otters.")
    await playground.idle()
    width = playground.viewport.width
    sidebar, menu, main = page.locator("#sidebar"), page.locator("#menu"), page.locator("main")
    overflow = "document.documentElement.scrollWidth - innerWidth"
    assert await page.evaluate(overflow) == 0, "nothing wider than the screen"
    if not playground.viewport.phone:
        await expect(menu).to_be_hidden()
        await expect(sidebar).to_be_visible()
        sidebar_width = (await box(sidebar))["width"]
        assert (await box(main))["width"] == width - sidebar_width
        return
    await expect(sidebar).to_be_hidden()
    assert (await box(main))["width"] == width
    assert (await box(page.locator("#input")))["width"] > width * 0.6
    await menu.click()
    await expect(sidebar).to_be_in_viewport(ratio=1)
    await expect(menu).to_have_attribute("aria-expanded", "true")
    await playground.shot("drawer")
    # A tap beside the drawer closes it; opening a conversation or a new one too.
    await page.mouse.click(width - 10, 400)
    await expect(sidebar).to_be_hidden()
    await (await playground.conversations()).filter(has_text="otters").click()
    await expect(sidebar).to_be_hidden()
    await playground.new_conversation()
    await expect(sidebar).to_be_hidden()
    await expect(page.locator(".bubble")).to_have_count(0)
    await page.set_viewport_size({"width": 360, "height": 740})
    assert await page.evaluate(overflow) == 0, "nothing wider than the smallest phone"


SMALL_PHONE = Viewport("small phone", 375, 667)
# The element a tap at the middle of `selector` lands on is that element (or inside it).
TAPPED = """selector => {
  const target = document.querySelector(selector);
  const r = target.getBoundingClientRect();
  return target.contains(document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2));
}"""
# Everything the element holds is in sight: none of its text is cut or hidden.
WHOLE = """selector => {
  const e = document.querySelector(selector);
  return e.scrollWidth <= e.clientWidth && e.scrollHeight <= e.clientHeight;
}"""


async def test_on_a_small_phone_the_drawer_leaves_the_menu_button_closes_and_the_footer_is_whole(
    browser: Browser, stack: Stack
) -> None:
    pages = Pages(browser, SMALL_PHONE)
    try:
        playground = await pages.open(stack)
        page = playground.page
        sidebar, menu, footer = (
            page.locator("#sidebar"),
            page.locator("#menu"),
            page.locator("#status"),
        )
        await expect(footer).to_contain_text("1 worker alive", timeout=15_000)
        await expect(footer).to_contain_text(re.compile(r"Bernard \d+\.\d+"))
        assert await page.evaluate(WHOLE, "#status"), await footer.inner_text()
        footer_box = await box(footer)
        assert footer_box["x"] + footer_box["width"] <= SMALL_PHONE.width
        assert footer_box["y"] + footer_box["height"] <= SMALL_PHONE.height

        await menu.click()
        await expect(sidebar).to_be_in_viewport(ratio=1)
        # The ☰ button stays in sight over the open drawer, and a tap on it closes it.
        assert await page.evaluate(TAPPED, "#menu"), "the drawer covers the ☰ button"
        assert await page.evaluate(TAPPED, "#status"), "the drawer covers the footer"
        await menu.click()
        await expect(sidebar).to_be_hidden()
        await expect(menu).to_have_attribute("aria-expanded", "false")
        # The drawer's own close control.
        await menu.click()
        close = sidebar.get_by_role("button", name="Close")
        await expect(close).to_be_in_viewport(ratio=1)
        await close.click()
        await expect(sidebar).to_be_hidden()
        await expect(menu).to_have_attribute("aria-expanded", "false")
        await menu.click()
        await page.keyboard.press("Escape")
        await expect(sidebar).to_be_hidden()
    finally:
        await pages.close()
    assert [p.errors for p in pages.opened] == [[]], "console errors"


async def test_the_first_screen_suggests_what_this_servers_tools_can_do(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    """The test stack's tools: calculator, get_time, notes and timers (no Home Assistant)."""
    playground = await pages.open(stack)
    page = playground.page
    suggestions = page.locator(".welcome .suggestion")
    await expect(suggestions).to_have_text(
        [
            "Set a timer for 10 minutes for the pasta",
            "Remember that the spare key is under the blue pot",
            "What is 17.5 % of 2,340?",
            "What time is it in Tokyo?",
        ]
    )
    await playground.shot("first-screen")
    upstream.script_router(Reply.tool_calls([("calculator", {"expression": "2340 * 0.175"})]))
    upstream.script(Reply.text("It is 409.5."))
    await suggestions.filter(has_text="17.5 %").click()
    await expect(page.locator(".bubble.user")).to_have_text(["What is 17.5 % of 2,340?"])
    await expect(playground.answer).to_have_text("It is 409.5.")
    await expect(page.locator(".card.tool .result pre")).to_have_text("409.5")
    await expect(page.locator(".welcome")).to_have_count(0)
    await playground.idle()
    await playground.new_conversation()  # and again for the next one
    await expect(suggestions).to_have_count(4)


async def test_the_lights_are_suggested_where_home_assistant_is(
    upstream: ScriptedUpstream, pages: Pages
) -> None:
    @tool
    async def ha_call_service(domain: str, service: str, entity_id: str) -> str:
        """Call a Home Assistant service."""
        return "done"

    async with stack_with_tools(upstream, pages, [ha_call_service]) as stack:
        playground = await pages.open(stack)
        await expect(playground.page.locator(".welcome .suggestion")).to_have_text(
            ["Turn on the kitchen lights"]
        )


async def test_a_change_to_the_house_says_its_rule_and_its_card_undoes_it(
    upstream: ScriptedUpstream, pages: Pages
) -> None:
    """The household's policy lets the light run at once, the card says by which rule, and
    its Undo button puts the light back as it was (the fake Home Assistant's)."""
    off = {"domain": "light", "service": "turn_off", "entity_id": "light.living_room"}
    async with FakeHomeAssistant() as home:
        config = make_config(
            upstream,
            api_keys=user_keys(),
            ha_url=home.base_url,
            ha_token=FakeHomeAssistant.token,
            policy_file=None,  # the household default
        )
        async with config.stack() as stack:
            try:
                upstream.script_router(Reply.tool_calls([("ha_call_service", off)]))
                upstream.script(Reply.text("The living room is dark."))
                playground = await pages.open(stack)
                page = playground.page
                await playground.send("lights off in the living room")
                card = page.locator(".card.tool")
                await expect(card.locator(".policy")).to_have_text(
                    "Ran at once: rule “lights, switches, fans, players, scenes”"
                )
                await expect(card.locator(".state")).to_have_text("done")
                await playground.idle()
                assert home.states()["light.living_room"]["state"] == "off"
                await playground.shot("undo")

                upstream.script(Reply.text("The lights are back on."))
                await card.get_by_role("button", name="Undo").click()
                await expect(playground.answer).to_have_text("The lights are back on.")
                await playground.idle()
                await expect(page.locator(".bubble.user")).to_have_text(
                    ["lights off in the living room", "Undo that."]
                )
                await expect(page.locator(".card.tool .tool-name")).to_have_text(
                    ["ha_call_service", "undo"]
                )
                await expect(page.get_by_role("button", name="Undo")).to_have_count(0)
                light = home.states()["light.living_room"]
                assert (light["state"], light["attributes"]["brightness"]) == ("on", 180)
                await page.reload()  # as stored: undone, no button
                await expect(page.locator(".card.tool")).to_have_count(2)
                await expect(page.get_by_role("button", name="Undo")).to_have_count(0)
            finally:
                await pages.close()


async def test_conversations_are_listed_by_title_or_first_message_never_by_id(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    """Started elsewhere (curl, the CLI): listed under the server's `title` when it has
    one, else the start of the first message."""
    headers = {"Authorization": f"Bearer {KEY}"}
    ids = []
    for text in ("What is the capital of Peru?", "Tell me about owls " + "and more " * 20):
        upstream.script(Reply.text("Lima."))
        created = await stack.client.post("/v1/conversations", json={}, headers=headers)
        ids.append(created.json()["id"])
        answered = await stack.client.post(
            f"/v1/conversations/{ids[-1]}/messages", json={"content": text}, headers=headers
        )
        assert answered.status_code == 200
    empty = await stack.client.post("/v1/conversations", json={}, headers=headers)
    titled = ids[0]

    playground = await pages.open(stack)
    page = playground.page

    async def with_title(route: Route) -> None:
        """The list as the server gives it once it has made a conversation's title."""
        response = await route.fetch()
        listed = await response.json()
        for conversation in listed["data"]:
            if conversation["id"] == titled:
                conversation["title"] = "Peru's capital"
        await route.fulfill(response=response, json=listed)

    await page.route("**/v1/conversations?limit=100", with_title)
    await page.reload()
    items = await playground.conversations()
    await expect(items).to_have_text(
        [
            "New conversation",
            "Tell me about owls and more and more and more and more and more and more and mo…",
            "Peru's capital",
        ]
    )
    for item in await items.all():
        assert "conv_" not in await item.inner_text()
    assert empty.status_code == 201


async def test_the_footer_says_what_the_server_runs(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    playground = await pages.open(stack)
    footer = playground.page.locator("#status")
    await expect(footer).to_contain_text("router-model (router) · response-model (response)")
    await expect(footer).to_contain_text("1 worker alive", timeout=15_000)
    await expect(footer).to_contain_text(re.compile(r"Bernard \d+\.\d+"))
    await expect(footer.locator(".warn")).to_have_count(0)


async def test_the_footer_says_when_the_model_is_the_offline_demo(pages: Pages) -> None:
    async with run_stack(make_settings(api_keys=user_keys())) as stack:
        try:
            playground = await pages.open(stack)
            footer = playground.page.locator("#status")
            await expect(footer).to_contain_text("offline demo model (router, response)")
        finally:
            await pages.close()


# -- controls --------------------------------------------------------------------------------


async def test_cancel_stops_the_running_turn(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    upstream.script(Reply.slow(0.02))
    playground = await pages.open(stack)
    await playground.send("talk forever")
    await expect(playground.answer).to_contain_text("tick tick")
    await playground.page.click("#cancel")
    await playground.idle()
    # The user's own Cancel is no error: said once, in grey.
    await expect(playground.page.locator(".status-line")).to_have_text(["Stopped."])
    await expect(playground.page.locator(".error-line")).to_have_count(0)
    await expect(playground.answer).to_contain_text("tick tick")


async def test_a_stopped_answer_is_still_there_after_a_reload_and_says_it_stopped(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    upstream.script(Reply.slow(0.02))
    playground = await pages.open(stack)
    page = playground.page
    await playground.send("talk forever")
    await expect(playground.answer).to_contain_text("tick tick")
    await page.click("#cancel")
    await playground.idle()
    shown = await playground.answer.inner_text()
    async with page.expect_response(lambda r: "/messages" in r.url):
        await page.reload()
    await expect(page.locator(".bubble.user")).to_have_text(["talk forever"])
    await expect(playground.answer).to_have_text(shown)
    await expect(page.locator(".status-line")).to_have_text(["Stopped."])
    await expect(page.locator(".error-line")).to_have_count(0)


async def test_an_answer_another_client_interrupts_says_so_and_the_page_follows_the_new_one(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    conversation = (await stack.client.post("/v1/conversations", json={}, headers=headers)).json()
    gate = upstream.script(Reply.text(["Once", " upon", " a", " time"], block_after=2))
    upstream.script(Reply.text("Sunny all day."))
    playground = await pages.open(stack, conversation=conversation["id"])
    page = playground.page
    await playground.send("tell me a story")
    await expect(playground.answer).to_have_text("Once upon")
    await gate.wait_blocked()
    elsewhere = await stack.client.post(
        f"/v1/conversations/{conversation['id']}/messages",
        json={"content": "what about the weather?"},
        headers=headers,
    )
    assert elsewhere.json()["status"] == "completed"
    interrupted = "Interrupted: a newer message in this conversation took its place."
    expected = ["tell me a story", "what about the weather?"]
    await expect(page.locator(".bubble.user")).to_have_text(expected)
    await expect(page.locator(".bubble.assistant")).to_have_text(["Once upon", "Sunny all day."])
    await expect(page.locator(".status-line")).to_have_text([interrupted])
    await playground.idle()
    async with page.expect_response(lambda r: "/messages" in r.url):
        await page.reload()
    await expect(page.locator(".bubble.user")).to_have_text(expected)
    await expect(page.locator(".bubble.assistant")).to_have_text(["Once upon", "Sunny all day."])
    await expect(page.locator(".status-line")).to_have_text([interrupted])
    await expect(page.locator(".error-line")).to_have_count(0)


async def test_a_failed_turn_says_its_error_once(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    """The stream's `error` event and its `done` carry the same error: one red line."""
    upstream.script(Reply.error(500, "boom"))
    playground = await pages.open(stack)
    await playground.send("fail, please")
    await playground.idle()
    await expect(playground.page.locator(".error-line")).to_have_text(
        ["upstream_error: the upstream model failed (HTTP 500)"]
    )


async def test_a_message_typed_while_a_confirmation_waits_stays_in_the_box(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    """It is kept with a hint saying why; "Reject it and send this" sends it as a voice
    user means "no, …": the call declined, then the message."""
    upstream.script_router(Reply.tool_calls([("save_note", {"text": "the code is 1234"})]))
    playground = await pages.open(stack)
    page = playground.page
    await playground.send("remember the code")
    await expect(page.locator(".card.confirm .state")).to_have_text("waiting for your decision")
    await playground.idle()
    posted: list[Request] = []
    page.on("request", lambda r: posted.append(r) if r.method == "POST" else None)
    await playground.send("no, the code is 9999")
    hint = page.locator("#hint")
    await expect(hint).to_be_visible()
    await expect(hint).to_contain_text("A tool call above waits for your decision")
    await expect(page.locator("#input")).to_have_value("no, the code is 9999")
    await playground.shot("message-while-waiting")
    assert posted == [], "nothing sent"
    await expect(page.locator(".notice, .error-line")).to_have_count(0)

    upstream.script(Reply.text("All right, I will not."))
    upstream.script(Reply.text("Noted: 9999."))
    await hint.get_by_role("button", name="Reject it and send this").click()
    await expect(playground.answer).to_have_text("Noted: 9999.")
    await playground.idle()
    await expect(page.locator(".card.confirm .state")).to_have_text("rejected")
    await expect(page.locator(".bubble.user")).to_have_text(
        ["remember the code", "no, the code is 9999"]
    )
    await expect(page.locator("#input")).to_have_value("")
    await expect(hint).to_be_hidden()


async def test_a_message_to_a_conversation_waiting_since_elsewhere_answers_the_call(
    stack: Stack, upstream: ScriptedUpstream, pages: Pages
) -> None:
    """Another client left a tool call waiting since the page opened the conversation: the
    page's message is the answer Bernard reads (here its router declines the call and the
    model answers), not an error."""
    headers = {"Authorization": f"Bearer {KEY}"}
    created = await stack.client.post("/v1/conversations", json={}, headers=headers)
    conversation = created.json()["id"]
    playground = await pages.open(stack, conversation=conversation)
    page = playground.page
    upstream.script_router(Reply.tool_calls([("save_note", {"text": "from the kitchen"})]))
    elsewhere = await stack.client.post(
        f"/v1/conversations/{conversation}/messages",
        json={"content": "remember this, from the kitchen"},
        headers=headers,
    )
    assert elsewhere.json()["status"] == "awaiting_confirmation"

    upstream.script(Reply.text("I did not save it. What else?"))
    await playground.send("and what else?")
    await expect(playground.answer).to_have_text("I did not save it. What else?")
    await playground.idle()
    await expect(page.locator("#hint")).to_be_hidden()
    await expect(page.locator(".notice, .error-line")).to_have_count(0)
    shown = await stack.client.get(f"/v1/conversations/{conversation}", headers=headers)
    assert shown.json()["status"] == "idle"


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
    await playground.new_conversation()
    await expect(page.locator(".bubble")).to_have_count(0)
    await playground.send("owls")
    await expect(playground.answer).to_have_text("About owls.")
    await playground.idle()
    items = await playground.conversations()
    await expect(items).to_have_text(["owls", "otters"])

    await items.filter(has_text="otters").click()
    await expect(page.locator(".bubble")).to_have_text(["otters", "About otters."])
    otters = page.url.split("#", 1)[1]
    await page.reload()  # the open conversation is in the URL
    await expect(page.locator(".bubble")).to_have_text(["otters", "About otters."])
    await playground.conversations()  # on a phone, the drawer open over the chat
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
