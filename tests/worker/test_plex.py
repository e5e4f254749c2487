"""The Plex tools, with plexapi itself talking to a scripted Plex Media Server on loopback
(tests/fakes/plex.py).

Each tool is called as the router runs it (`call`: its outcome and its progress), and through
the whole pipeline (real API and worker, the scripted upstream deciding to call the tool)
in both wire modes: a streamed chat completion with `bernard` tool events, and the
conversations API. The remote-control tools wait for the user's confirmation: the scripted
Plex sees no command before the approval, and none after a rejection.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as redis_asyncio
from langchain_core.tools import BaseTool
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from launcher.redis_server import free_port
from tests.fakes.plex import FakePlex
from tests.fakes.searxng import Seen
from tests.support.serving import serve
from tests.support.sse import collect, named, of
from tests.support.stack import Config, Stack, make_config
from tests.support.upstream import Reply, ScriptedUpstream
from tests.support.users import ALICE
from tests.worker.test_web_tools import call
from worker.harness.tool_call import PlannedCall, arguments_text, execute
from worker.tools import enabled_tools
from worker.tools.catalog import catalog
from worker.tools.plex import (
    plex_browse,
    plex_control,
    plex_now_playing,
    plex_play,
    plex_search,
)
from worker.tools.runtime import ToolRuntime, http_client

TV = "7e1d0c4a-living-room-tv"
SPEAKER = "4b9f2e6d-kitchen-speaker"
MATRIX = """\
Plex results for “matrix”: 2
- movie “The Matrix” (1999), id 101
- movie “The Matrix Reloaded” (2003), id 102"""
ON_DECK = """\
On deck in Plex: 1
- episode “Silence in the Library”, Doctor Who S4E8, 12:30 of 45:00 watched, id 2012"""
RECENT = """\
Recently added in Plex: 3
- album “Discovery” by Daft Punk (2001), id 302
- episode “Blink”, Doctor Who S3E10, id 2011
- movie “The Matrix Reloaded” (2003), id 102"""
NOW_PLAYING = """\
Playing now on Plex: 1
- Living Room TV: movie “The Matrix” (1999), playing, 42:10 of 2:16:18, for alice
Players Plex can control: Kitchen Speaker, Living Room TV"""
NOT_CONFIGURED = "Error: Plex is not configured (BERNARD_PLEX_URL and BERNARD_PLEX_TOKEN)"
BAD_TOKEN = (
    "Error: Plex refused the token (HTTP 401); check BERNARD_PLEX_TOKEN (an X-Plex-Token of "
    "an account with access to this server)"
)
UNKNOWN_PLAYER = (
    "Error: Plex has no player called “Bedroom TV”; the players it reaches now are Kitchen "
    "Speaker, Living Room TV"
)

# Every tool with a call that works against the fake, for the failures they share.
CALLS: list[tuple[BaseTool, dict[str, Any]]] = [
    (plex_search, {"query": "matrix"}),
    (plex_browse, {"shelf": "on_deck"}),
    (plex_now_playing, {}),
    (plex_play, {"item_id": "102", "client": "Living Room TV"}),
    (plex_control, {"action": "pause", "client": "Living Room TV"}),
]


def plex_settings(
    fake: FakePlex | None, upstream: ScriptedUpstream | None = None, **more: Any
) -> Config:
    values = {"plex_url": fake.base_url if fake else None, "plex_token": FakePlex.token, **more}
    return make_config(upstream, **values)


@pytest.fixture
async def plex() -> AsyncIterator[FakePlex]:
    async with FakePlex() as fake:
        yield fake


# -- reading ---------------------------------------------------------------------------------


async def test_a_search_asks_plexs_hub_search_and_lists_the_ids_to_play(
    plex: FakePlex, redis: redis_asyncio.Redis
) -> None:
    outcome, progress = await call(plex_search, {"query": " matrix \n"}, plex_settings(plex), redis)
    assert (outcome.status, outcome.content) == ("success", MATRIX)
    assert progress == [("step", "Searching Plex for “matrix”"), ("complete", "Found 2 items")]
    searched = [r for r in plex.requests if r.path == "/hubs/search"]
    assert searched == [
        Seen(
            "/hubs/search",
            {
                "query": "matrix",
                "includeCollections": "1",
                "includeExternalMedia": "1",
                "limit": "15",
            },
        )
    ]


@pytest.mark.parametrize(
    ("args", "answer"),
    [
        ({"query": "blink", "kind": "episode"}, "- episode “Blink”, Doctor Who S3E10, id 2011"),
        ({"query": "doctor", "kind": "show"}, "- show “Doctor Who” (2005), id 201"),
        (
            {"query": "one more", "kind": "music"},
            "- track “One More Time” by Daft Punk, on Discovery, id 303",
        ),
        ({"query": "daft", "kind": "music"}, "- artist “Daft Punk”, id 301"),
    ],
)
async def test_a_search_keeps_the_kind_asked_for(
    args: dict[str, str], answer: str, plex: FakePlex, redis: redis_asyncio.Redis
) -> None:
    outcome, _ = await call(plex_search, args, plex_settings(plex), redis)
    assert outcome.content.splitlines()[1:] == [answer]


@pytest.mark.parametrize(
    ("args", "answer"),
    [
        ({"query": "xyzzy"}, "Plex has nothing matching “xyzzy”."),
        ({"query": "matrix", "kind": "show"}, "Plex has nothing matching “matrix” (shows)."),
    ],
)
async def test_a_search_with_no_match_says_so(
    args: dict[str, str], answer: str, plex: FakePlex, redis: redis_asyncio.Redis
) -> None:
    outcome, progress = await call(plex_search, args, plex_settings(plex), redis)
    assert (outcome.status, outcome.content) == ("success", answer)
    assert progress[-1] == ("complete", "Found 0 items")


@pytest.mark.parametrize(
    ("shelf", "answer", "path"),
    [("on_deck", ON_DECK, "/library/onDeck"), ("recently_added", RECENT, "/library/recentlyAdded")],
)
async def test_browsing_shows_what_is_on_deck_or_recently_added(
    shelf: str, answer: str, path: str, plex: FakePlex, redis: redis_asyncio.Redis
) -> None:
    outcome, progress = await call(plex_browse, {"shelf": shelf}, plex_settings(plex), redis)
    assert (outcome.status, outcome.content) == ("success", answer)
    assert progress[0] == ("step", f"Asking Plex what is {shelf.replace('_', ' ')}")
    assert [r.path for r in plex.requests] == ["/", path]


async def test_now_playing_says_what_plays_where_and_which_players_plex_reaches(
    plex: FakePlex, redis: redis_asyncio.Redis
) -> None:
    outcome, progress = await call(plex_now_playing, {}, plex_settings(plex), redis)
    assert (outcome.status, outcome.content) == ("success", NOW_PLAYING)
    assert progress == [("step", "Asking Plex what is playing"), ("complete", "1 playing")]
    plex.sessions = []
    quiet, _ = await call(plex_now_playing, {}, plex_settings(plex), redis)
    assert quiet.content.splitlines()[0] == "Nothing is playing on Plex."


# -- remote control, called directly (the pipeline asks the user first: below) -------------


async def test_play_finds_the_item_and_the_player_and_plays_through_the_server(
    plex: FakePlex, redis: redis_asyncio.Redis
) -> None:
    args = {"item_id": " 102 ", "client": "living room tv"}
    outcome, progress = await call(plex_play, args, plex_settings(plex), redis)
    assert (outcome.status, outcome.content) == (
        "success",
        "Playing movie “The Matrix Reloaded” (2003) on Living Room TV.",
    )
    assert progress == [
        ("step", "Finding item 102 and “living room tv” in Plex"),
        ("step", "Reaching Living Room TV through Plex"),
        ("complete", "Playing on Living Room TV"),
    ]
    (command,) = plex.commands
    assert (command.command, command.target) == ("playMedia", TV)
    assert command.params["key"] == "/library/metadata/102"
    assert command.params["machineIdentifier"] == plex.library["server"]["machineIdentifier"]
    assert command.params["containerKey"].startswith("/playQueues/55")


@pytest.mark.parametrize(
    ("action", "command", "state", "answer"),
    [
        ("pause", "pause", "paused", "Paused movie “The Matrix” (1999) on Living Room TV."),
        ("stop", "stop", None, "Stopped movie “The Matrix” (1999) on Living Room TV."),
    ],
)
async def test_control_sends_the_command_to_the_named_player(
    action: str,
    command: str,
    state: str | None,
    answer: str,
    plex: FakePlex,
    redis: redis_asyncio.Redis,
) -> None:
    args = {"action": action, "client": "Living Room TV"}
    outcome, progress = await call(plex_control, args, plex_settings(plex), redis)
    assert (outcome.status, outcome.content) == ("success", answer)
    assert progress[1] == ("step", "Reaching Living Room TV through Plex")
    assert [(c.command, c.target, c.params["type"]) for c in plex.commands] == [
        (command, TV, "video")
    ]
    assert [s["state"] for s in plex.sessions] == ([state] if state else [])


async def test_resume_plays_what_was_paused_and_music_is_told_as_music(
    plex: FakePlex, redis: redis_asyncio.Redis
) -> None:
    plex.sessions[0].update(ratingKey=303, client=SPEAKER, state="paused")
    args = {"action": "resume", "client": "Kitchen Speaker"}
    outcome, _ = await call(plex_control, args, plex_settings(plex), redis)
    assert outcome.content == (
        "Resumed track “One More Time” by Daft Punk, on Discovery on Kitchen Speaker."
    )
    assert [(c.command, c.target, c.params["type"]) for c in plex.commands] == [
        ("play", SPEAKER, "music")
    ]


@pytest.mark.parametrize(
    ("tool", "args", "error"),
    [
        (plex_play, {"item_id": "102", "client": "Bedroom TV"}, UNKNOWN_PLAYER),
        (plex_control, {"action": "stop", "client": "Bedroom TV"}, UNKNOWN_PLAYER),
        (
            plex_play,
            {"item_id": "999", "client": "Living Room TV"},
            "Error: Plex has no item with id 999; find the id with plex_search",
        ),
        (
            plex_control,
            {"action": "pause", "client": "Kitchen Speaker"},
            "Error: nothing is playing on Kitchen Speaker",
        ),
        (
            plex_control,
            {"action": "resume", "client": "Living Room TV"},
            "Error: movie “The Matrix” (1999) is already playing on Living Room TV",
        ),
        (
            plex_play,
            {"item_id": "the matrix", "client": "Living Room TV"},
            "Error: the item id 'the matrix' is not one; ids are numbers (digits 0-9), as "
            "plex_search gives them",
        ),
        # Digits to `str.isdigit` but not ASCII: a superscript `int` refuses, and the
        # Arabic-Indic and fullwidth digits of 101, which `int` reads as The Matrix's id.
        (
            plex_play,
            {"item_id": "\u00b2", "client": "Living Room TV"},
            "Error: the item id '\u00b2' is not one; ids are numbers (digits 0-9), as "
            "plex_search gives them",
        ),
        (
            plex_play,
            {"item_id": "\u0661\u0660\u0661", "client": "Living Room TV"},
            "Error: the item id '\u0661\u0660\u0661' is not one; ids are numbers (digits "
            "0-9), as plex_search gives them",
        ),
        (
            plex_play,
            {"item_id": "\uff11\uff10\uff11", "client": "Living Room TV"},
            "Error: the item id '\uff11\uff10\uff11' is not one; ids are numbers (digits "
            "0-9), as plex_search gives them",
        ),
    ],
)
async def test_a_command_that_cannot_run_says_why_and_sends_nothing(
    tool: BaseTool, args: dict[str, str], error: str, plex: FakePlex, redis: redis_asyncio.Redis
) -> None:
    outcome, progress = await call(tool, args, plex_settings(plex), redis)
    assert (outcome.status, outcome.content) == ("error", error)
    assert progress[-1] == ("error", error.removeprefix("Error: "))
    assert plex.commands == []


async def test_with_no_player_reachable_the_error_says_what_a_player_needs(
    plex: FakePlex, redis: redis_asyncio.Redis
) -> None:
    plex.library["clients"] = []
    args = {"item_id": "101", "client": "Living Room TV"}
    outcome, _ = await call(plex_play, args, plex_settings(plex), redis)
    assert outcome.content == (
        "Error: Plex has no player called “Living Room TV”; Plex reaches no player now (a Plex "
        "app must be open on the device, with remote control allowed)"
    )


# -- every tool: the server's failures -------------------------------------------------------


@pytest.mark.parametrize(("tool", "args"), CALLS)
async def test_a_refused_token_is_a_clear_error(
    tool: BaseTool, args: dict[str, Any], plex: FakePlex, redis: redis_asyncio.Redis
) -> None:
    settings = plex_settings(plex, plex_token="not-the-token")
    outcome, progress = await call(tool, args, settings, redis)
    assert (outcome.status, outcome.content) == ("error", BAD_TOKEN)
    assert progress[-1] == ("error", BAD_TOKEN.removeprefix("Error: "))
    assert plex.commands == []


@pytest.mark.parametrize(("tool", "args"), CALLS)
async def test_an_offline_server_is_a_clear_error(
    tool: BaseTool, args: dict[str, Any], redis: redis_asyncio.Redis
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    settings = make_config(plex_url=url, plex_token=FakePlex.token)
    outcome, _ = await call(tool, args, settings, redis)
    assert (outcome.status, outcome.content) == (
        "error",
        f"Error: could not reach Plex at {url}: the server is offline or BERNARD_PLEX_URL is wrong",
    )


@pytest.mark.parametrize(("tool", "args"), CALLS)
async def test_a_server_that_does_not_answer_in_time_is_a_clear_error(
    tool: BaseTool, args: dict[str, Any], redis: redis_asyncio.Redis
) -> None:
    async with FakePlex("slow", delay_s=5) as plex:
        settings = plex_settings(plex, tool_http_timeout_s=0.3)
        outcome, _ = await call(tool, args, settings, redis)
    assert (outcome.status, outcome.content) == ("error", "Error: Plex did not answer within 0.3s")


@pytest.mark.parametrize(("tool", "args"), CALLS)
async def test_a_tool_without_plex_configured_says_so(
    tool: BaseTool, args: dict[str, Any], redis: redis_asyncio.Redis
) -> None:
    outcome, _ = await call(tool, args, make_config(), redis)
    assert (outcome.status, outcome.content) == ("error", NOT_CONFIGURED)


async def test_a_plex_url_with_a_user_name_is_refused_before_anything_is_sent(
    plex: FakePlex, redis: redis_asyncio.Redis
) -> None:
    url = plex.base_url.replace("http://", "http://user:pw@")
    outcome, _ = await call(
        plex_search, {"query": "matrix"}, plex_settings(plex, plex_url=url), redis
    )
    assert (outcome.status, outcome.content) == (
        "error",
        "Error: BERNARD_PLEX_URL is not a plain http(s) address (scheme, host and port, no user "
        "name)",
    )
    assert plex.requests == []


async def test_a_server_error_names_its_status(plex: FakePlex, redis: redis_asyncio.Redis) -> None:
    plex.mode, plex.only = "error", "/hubs"
    outcome, _ = await call(plex_search, {"query": "matrix"}, plex_settings(plex), redis)
    assert (outcome.status, outcome.content) == ("error", "Error: Plex failed (HTTP 500)")


@pytest.fixture
async def elsewhere() -> AsyncIterator[tuple[str, list[tuple[str, str | None]]]]:
    """Another server on loopback: its URL, and the paths and Plex tokens it was sent."""
    seen: list[tuple[str, str | None]] = []

    async def record(request: Request) -> Response:
        seen.append((request.url.path, request.headers.get("x-plex-token")))
        return Response('<MediaContainer size="0"/>', media_type="text/xml")

    app = Starlette(routes=[Route("/{path:path}", record)])
    async with serve(app) as port:
        yield f"http://127.0.0.1:{port}", seen


@pytest.mark.parametrize(
    ("location", "error"),
    [
        # Plex's origin to `urlsplit`, the other server to `requests` (urllib3 ends the
        # authority at the backslash).
        (
            "{other}\\@{plex_authority}/hubs/search",
            "Error: Plex sent Bernard to a URL that is not a plain address (a backslash, a user "
            "name or a fragment); Bernard does not follow it",
        ),
        (
            "http://{plex_authority}@{other_authority}/hubs/search",
            "Error: Plex sent Bernard to a URL that is not a plain address (a backslash, a user "
            "name or a fragment); Bernard does not follow it",
        ),
        (
            "{other}/hubs/search",
            "Error: Plex sent Bernard to {other}, another server than BERNARD_PLEX_URL; Bernard "
            "does not follow it",
        ),
    ],
)
async def test_a_redirect_off_the_plex_server_is_refused_and_the_token_stays_home(
    location: str,
    error: str,
    plex: FakePlex,
    elsewhere: tuple[str, list[tuple[str, str | None]]],
    redis: redis_asyncio.Redis,
) -> None:
    other, seen = elsewhere
    names = {
        "other": other,
        "other_authority": other.removeprefix("http://"),
        "plex_authority": plex.base_url.removeprefix("http://"),
    }
    plex.redirects["/hubs/search"] = location.format(**names)
    outcome, _ = await call(plex_search, {"query": "matrix"}, plex_settings(plex), redis)
    assert (outcome.status, outcome.content) == ("error", error.format(**names))
    assert seen == []
    assert [r.path for r in plex.requests] == ["/", "/hubs/search"]


async def test_a_play_given_up_on_sends_no_command_afterwards(
    plex: FakePlex, redis: redis_asyncio.Redis
) -> None:
    # The play queue is made, then held until the tool's time is up: the thread plexapi runs
    # in gets its answer later, and must not go on to the play command.
    plex.hold("/playQueues")
    settings = plex_settings(plex)
    args = {"item_id": "102", "client": "Living Room TV"}
    planned = PlannedCall(id="c1", name="plex_play", args=args, arguments=arguments_text(args))
    async with http_client(settings.settings) as http:
        runtime = ToolRuntime(
            owner="t",
            redis=redis,
            settings=settings.settings,
            http=http,
            tool_settings=settings.tools,
        )
        running = execute(planned, {"plex_play": plex_play}, timeout_s=0.5, runtime=runtime)
        waiting = asyncio.ensure_future(asyncio.wait_for(plex.wait_held(), 5))
        progress = [p async for p in running]
        await waiting
    assert running.result.content == (
        "Error: the tool 'plex_play' did not finish within 0.5s and was stopped"
    )
    assert progress[-1].message == "Reaching Living Room TV through Plex"
    plex.release()
    seen = len(plex.requests)
    for _ in range(25):  # the held request is answered; the thread must send nothing more
        await asyncio.sleep(0.02)
    assert len(plex.requests) == seen and plex.requests[-1].path == "/playQueues"
    assert plex.commands == []


# -- offered, listed -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "offered"),
    [
        ({}, []),
        ({"plex_url": "http://plex.local:32400"}, []),
        ({"plex_token": "t"}, []),
        (
            {"plex_url": "http://plex.local:32400", "plex_token": "t"},
            ["plex_search", "plex_browse", "plex_now_playing", "plex_play", "plex_control"],
        ),
    ],
)
def test_the_tools_are_offered_only_when_plex_is_configured(
    overrides: dict[str, str], offered: list[str]
) -> None:
    config = make_config(**overrides)
    listed = {t["name"]: t for t in catalog(enabled_tools(config.tools), config.settings)}
    assert [n for n in listed if n.startswith("plex_")] == offered
    waits = {n: listed[n]["requires_confirmation"] for n in offered}
    assert waits == {n: n in ("plex_play", "plex_control") for n in offered}


async def test_get_tools_lists_the_plex_tools_with_their_arguments(plex: FakePlex) -> None:
    async with plex_settings(plex).stack() as stack:
        tools = {t["name"]: t for t in (await stack.client.get("/v1/tools")).json()["data"]}
    assert tools["plex_control"]["parameters"]["properties"]["action"]["enum"] == [
        "pause",
        "resume",
        "stop",
    ]
    assert tools["plex_play"]["parameters"]["required"] == ["item_id", "client"]
    assert tools["plex_play"]["requires_confirmation"] is True
    assert tools["plex_search"]["requires_confirmation"] is False


# -- the scripted Plex itself ----------------------------------------------------------------


async def test_the_fake_answers_json_when_asked_and_401_without_the_token(
    plex: FakePlex,
) -> None:
    async with httpx.AsyncClient(base_url=plex.base_url) as client:
        refused = await client.get("/hubs/search", params={"query": "blink"})
        answered = await client.get(
            "/hubs/search",
            params={"query": "blink", "X-Plex-Token": FakePlex.token},
            headers={"Accept": "application/json"},
        )
        xml = await client.get("/identity", headers={"X-Plex-Token": FakePlex.token})
    assert (refused.status_code, refused.headers["content-type"]) == (
        401,
        "text/html; charset=utf-8",
    )
    (hub,) = answered.json()["MediaContainer"]["Hub"]
    assert (hub["type"], [m["title"] for m in hub["Metadata"]]) == ("episode", ["Blink"])
    assert xml.text.startswith("<?xml") and 'claimed="1"' in xml.text


# -- through the pipeline: both wire modes ----------------------------------------------------

SSE = {"Accept": "text/event-stream"}
CHAT = "/v1/chat/completions"

READS = {
    "search": ("plex_search", {"query": "matrix"}, MATRIX),
    "on_deck": ("plex_browse", {"shelf": "on_deck"}, ON_DECK),
    "recently_added": ("plex_browse", {"shelf": "recently_added"}, RECENT),
    "now_playing": ("plex_now_playing", {}, NOW_PLAYING),
}
WRITES = {
    "play": (
        "plex_play",
        {"item_id": "2011", "client": "Living Room TV"},
        "Play episode “Blink”, Doctor Who S3E10 on Living Room TV",
        "Playing episode “Blink”, Doctor Who S3E10 on Living Room TV.",
        "playMedia",
    ),
    "pause": (
        "plex_control",
        {"action": "pause", "client": "Living Room TV"},
        "Pause movie “The Matrix” (1999) on Living Room TV",
        "Paused movie “The Matrix” (1999) on Living Room TV.",
        "pause",
    ),
    "resume": (
        "plex_control",
        {"action": "resume", "client": "Living Room TV"},
        "Resume movie “The Matrix” (1999) on Living Room TV",
        "Resumed movie “The Matrix” (1999) on Living Room TV.",
        "play",
    ),
    "stop": (
        "plex_control",
        {"action": "stop", "client": "Living Room TV"},
        "Stop movie “The Matrix” (1999) on Living Room TV",
        "Stopped movie “The Matrix” (1999) on Living Room TV.",
        "stop",
    ),
}


def alices(plex: FakePlex, upstream: ScriptedUpstream) -> Config:
    return plex_settings(plex, upstream, api_keys=f"key-alice:alice-{uuid.uuid4().hex[:8]}")


def chat(question: str) -> dict[str, Any]:
    return {
        "model": "bernard-v1",
        "messages": [{"role": "user", "content": question}],
        "stream": True,
        "stream_options": {"tool_events": "bernard"},
    }


async def ask(stack: Stack, wire: str, question: str) -> tuple[list[tuple[str, Any]], str]:
    """One turn in the wire mode asked for: its tool events as (kind, data) pairs, the answer's
    text, in either mode (chat frames' `bernard` events keep their type as the kind)."""
    if wire == "conversation":
        created = await stack.client.post("/v1/conversations", json={"id": "den"}, headers=ALICE)
        assert created.status_code == 201, created.text
        url = "/v1/conversations/den/messages"
        events = await named(stack.client, url, {"content": question}, ALICE)
        said = "".join(d["text"] for d in of(events, "text_delta"))
        return events, said
    frames = await collect(stack.client, "POST", CHAT, json=chat(question), headers=ALICE)
    events = [(f.bernard["type"], f.bernard) for f in frames if f.bernard]
    if frames and not frames[0].done:
        events.append(("turn", {"id": frames[0].json["id"].removeprefix("chatcmpl-")}))
    return events, "".join(f.content for f in frames)


@pytest.mark.parametrize("wire", ["chat", "conversation"])
@pytest.mark.parametrize("action", list(READS))
async def test_a_read_turn_calls_plex_and_streams_progress_and_result(
    action: str, wire: str, plex: FakePlex, upstream: ScriptedUpstream
) -> None:
    name, args, output = READS[action]
    upstream.script_router(Reply.tool_calls([(name, args)]))
    upstream.script(Reply.text("Here it is."))
    async with alices(plex, upstream).stack() as stack:
        events, said = await ask(stack, wire, "plex?")
    (result,) = of(events, "tool_result")
    progress = of(events, "tool_progress")
    assert progress[0]["phase"] == "step" and progress[-1]["phase"] == "complete"
    if wire == "chat":
        (called,) = of(events, "tool_call")
        assert called["name"] == name
        assert (result["content"], result["is_error"]) == (output, False)
    else:
        assert (result["output"], result["is_error"]) == (output, False)
    assert said == "Here it is."
    assert plex.commands == []


async def decide(
    stack: Stack, conversation_id: str, confirmation_id: str, decision: str
) -> list[tuple[str, Any]]:
    body = {"confirmation_id": confirmation_id, "decision": decision}
    return await named(stack.client, f"/v1/conversations/{conversation_id}/resume", body, ALICE)


async def paused(stack: Stack, wire: str, question: str) -> tuple[str, dict[str, Any]]:
    """A turn that stops for the user's decision: its conversation and the proposal."""
    events, _ = await ask(stack, wire, question)
    (proposal,) = of(events, "awaiting_confirmation")
    if wire == "conversation":
        return "den", proposal
    (turn,) = of(events, "turn")
    found = (await stack.client.get(f"/v1/turns/{turn['id']}", headers=ALICE)).json()
    assert found["status"] == "awaiting_confirmation"
    return str(found["conversation_id"]), proposal


@pytest.mark.parametrize("wire", ["chat", "conversation"])
@pytest.mark.parametrize("action", list(WRITES))
async def test_a_remote_control_turn_waits_for_approval_then_reaches_the_player(
    action: str, wire: str, plex: FakePlex, upstream: ScriptedUpstream
) -> None:
    name, args, summary, output, command = WRITES[action]
    if action == "resume":
        plex.sessions[0]["state"] = "paused"
    upstream.script_router(Reply.tool_calls([(name, args)]))
    async with alices(plex, upstream).stack() as stack:
        conversation_id, proposal = await paused(stack, wire, "plex, do it")
        assert proposal["summary"] == summary
        assert plex.commands == [], "nothing reaches a player before the decision"
        upstream.script(Reply.text("Done."))
        decided = await decide(stack, conversation_id, proposal["confirmation_id"], "approve")
    (result,) = of(decided, "tool_result")
    assert (result["output"], result["is_error"]) == (output, False)
    steps = [p["message"] for p in of(decided, "tool_progress")]
    assert "Reaching Living Room TV through Plex" in steps
    assert [(c.command, c.target) for c in plex.commands] == [(command, TV)]
    assert of(decided, "done")[0]["status"] == "completed"


@pytest.mark.parametrize("wire", ["chat", "conversation"])
async def test_a_rejected_play_never_reaches_plexs_players(
    wire: str, plex: FakePlex, upstream: ScriptedUpstream
) -> None:
    name, args, _, _, _ = WRITES["play"]
    upstream.script_router(Reply.tool_calls([(name, args)]))
    async with alices(plex, upstream).stack() as stack:
        conversation_id, proposal = await paused(stack, wire, "play blink")
        upstream.script(Reply.text("Fine."))
        decided = await decide(stack, conversation_id, proposal["confirmation_id"], "reject")
    (result,) = of(decided, "tool_result")
    assert result["output"] == "The user declined: plex_play was not run."
    assert plex.commands == []
    assert not [r for r in plex.requests if r.path.startswith(("/player", "/playQueues"))]


@pytest.mark.parametrize("wire", ["chat", "conversation"])
async def test_a_play_on_an_unknown_player_is_never_proposed_and_the_model_hears_the_players(
    wire: str, plex: FakePlex, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(
        Reply.tool_calls([("plex_play", {"item_id": "101", "client": "Bedroom TV"})])
    )
    upstream.script(Reply.text("Which player?"))
    async with alices(plex, upstream).stack() as stack:
        events, said = await ask(stack, wire, "play the matrix in the bedroom")
    assert not of(events, "awaiting_confirmation")
    (result,) = of(events, "tool_result")
    text = result["content"] if wire == "chat" else result["output"]
    assert (text, result["is_error"]) == (UNKNOWN_PLAYER, True)
    assert said == "Which player?"
    assert plex.commands == []
