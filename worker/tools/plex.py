"""The Plex tools: find something in the library, see what is on deck, new or playing, and
play, pause, resume or stop it on a player in the house once the user has confirmed it.

They speak to the Plex Media Server at `BERNARD_PLEX_URL` (its address with the port, as
`http://192.168.1.10:32400`) with `BERNARD_PLEX_TOKEN` (an `X-Plex-Token`) through plexapi,
the Python client the Plex community keeps (https://github.com/pushingkarmaorg/python-plexapi):

- `plex_search(query, kind?)`: Plex's hub search (`GET /hubs/search`), movies, shows,
  episodes and music, each with the id `plex_play` takes;
- `plex_browse(shelf)`: what is on deck (`GET /library/onDeck`) or recently added
  (`GET /library/recentlyAdded`);
- `plex_now_playing()`: what plays now and where (`GET /status/sessions`), and the players
  Plex can reach (`GET /clients`);
- `plex_play(item_id, client)` and `plex_control(action, client)`: remote control, proxied
  through the server to the player named (`/player/playback/playMedia`, `pause`, `play`,
  `stop` with `X-Plex-Target-Client-Identifier`). They change what the house is doing, so
  they wait for the user's confirmation (worker/tools/confirmation.py); before the user is
  asked, their `confirmation_check` finds the item and the player (an unknown player is
  refused with the names of those Plex reaches) and what plays there, so the summary names
  exactly what will happen ("Play movie “The Matrix” (1999) on Living Room TV").

plexapi is synchronous, on `requests`: each tool call runs in the blocking tools' threads
with a session that keeps to the Plex server, bounds each body and the whole call, and sends
nothing once the call is given up on (worker/tools/blocking.py). Every failure is a message
the model reads (`_failure`): a server that does not answer, a refused token, an unknown
item or player.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from xml.etree.ElementTree import ParseError

import requests
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, ToolException, tool
from plexapi.client import PlexClient
from plexapi.exceptions import BadRequest, NotFound, Unauthorized
from plexapi.server import PlexServer

from worker.tools.blocking import (
    Cancelled,
    DeadlineExceeded,
    GuardedSession,
    OffOrigin,
    TooLarge,
    plain_origin,
    run_blocking,
)
from worker.tools.http import MAX_BODY_BYTES, trim
from worker.tools.plex_settings import PlexSettings
from worker.tools.progress import get_reporter
from worker.tools.runtime import get_runtime
from worker.tools.texts import folded_text

__all__ = [
    "MAX_ITEMS",
    "check_control",
    "check_play",
    "plex_browse",
    "plex_control",
    "plex_now_playing",
    "plex_play",
    "plex_search",
    "plex_tools",
]

T = TypeVar("T")
_SERVICE = "Plex"
MAX_ITEMS = 15
_MAX_QUERY_CHARS = 200
MAX_CLIENT_CHARS = 100
TITLE_CHARS = 80
MediaKind = Literal["any", "movie", "show", "episode", "music"]
Shelf = Literal["on_deck", "recently_added"]
Action = Literal["pause", "resume", "stop"]
# The hubs of Plex's search each kind reads.
_HUBS: dict[str, tuple[str, ...]] = {
    "movie": ("movie",),
    "show": ("show",),
    "episode": ("episode",),
    "music": ("artist", "album", "track"),
}
_PLAYABLE = frozenset({"movie", "show", "season", "episode", "artist", "album", "track"})
_SHELVES: dict[str, tuple[str, str]] = {
    "on_deck": ("/library/onDeck", "on deck"),
    "recently_added": ("/library/recentlyAdded", "recently added"),
}
# An action, the command plexapi sends for it, the state it needs, and how it reads.
_ACTIONS: dict[str, tuple[str, str | None, str, str]] = {
    "pause": ("pause", "playing", "Pause", "Paused"),
    "resume": ("play", "paused", "Resume", "Resumed"),
    "stop": ("stop", None, "Stop", "Stopped"),
}


# -- reading ---------------------------------------------------------------------------------


@tool
async def plex_search(query: str, config: RunnableConfig, kind: MediaKind = "any") -> str:
    """Search the Plex library for movies, shows, episodes and music by title.

    `kind` keeps one kind ("movie", "show", "episode" or "music"). Each result has the id
    plex_play takes.
    """
    reporter = get_reporter(config)
    with reporter.reporting_errors():
        wanted = folded_text(query, "the search", _MAX_QUERY_CHARS)
        reporter.step(f"Searching Plex for “{trim(wanted, 80)}”")

        def search(server: PlexServer) -> list[PlexItem]:
            found = [_item(i) for i in server.search(wanted, limit=MAX_ITEMS)]
            hubs = _HUBS.get(kind)
            return [i for i in found if hubs is None or i.type in hubs]

        found = await _run(config, search)
    reporter.complete(f"Found {len(found)} item{'' if len(found) == 1 else 's'}")
    what = f"{kind}s" if kind in ("movie", "show", "episode") else kind
    if not found:
        scope = "" if kind == "any" else f" ({what})"
        return f"Plex has nothing matching “{trim(wanted, 80)}”{scope}."
    lines = [f"Plex results for “{trim(wanted, 80)}”: {min(len(found), MAX_ITEMS)}"]
    lines += [f"- {_describe(i)}, id {i.key}" for i in found[:MAX_ITEMS]]
    return "\n".join(lines)


@tool
async def plex_browse(shelf: Shelf, config: RunnableConfig) -> str:
    """What Plex has on deck (the next episode or the movie to finish) or recently added,
    with the ids plex_play takes."""
    reporter = get_reporter(config)
    with reporter.reporting_errors():
        path, named = _SHELVES[shelf]
        reporter.step(f"Asking Plex what is {named}")
        found = await _run(
            config,
            lambda server: [_item(i) for i in server.fetchItems(path, maxresults=MAX_ITEMS)],
        )
    reporter.complete(f"Found {len(found)} item{'' if len(found) == 1 else 's'}")
    if not found:
        return f"Nothing is {named} in Plex."
    lines = [f"{named.capitalize()} in Plex: {len(found)}"]
    for item in found[:MAX_ITEMS]:
        watched = _progress(item.offset_ms, item.duration_ms)
        lines.append(
            f"- {_describe(item)}{f', {watched} watched' if watched else ''}, id {item.key}"
        )
    return "\n".join(lines)


@tool
async def plex_now_playing(config: RunnableConfig) -> str:
    """What is playing on Plex now and on which player, and the players Plex can control."""
    reporter = get_reporter(config)
    with reporter.reporting_errors():
        reporter.step("Asking Plex what is playing")

        def look(server: PlexServer) -> tuple[list[Playing], list[str]]:
            playing = [_playing(s) for s in server.sessions()]
            return playing, [str(c.title or "?") for c in _clients(server)]

        sessions, clients = await _run(config, look)
    reporter.complete(f"{len(sessions)} playing")
    lines = [f"Playing now on Plex: {len(sessions)}" if sessions else "Nothing is playing on Plex."]
    for playing in sessions[:MAX_ITEMS]:
        watched = _progress(playing.item.offset_ms, playing.item.duration_ms)
        who = f", for {', '.join(playing.users)}" if playing.users else ""
        lines.append(
            f"- {trim(playing.player, 60)}: {_describe(playing.item)}, {playing.state}"
            f"{f', {watched}' if watched else ''}{who}"
        )
    names = sorted(trim(c, 60) for c in clients)
    lines.append(f"Players Plex can control: {', '.join(names)}" if names else _NO_PLAYERS)
    return "\n".join(lines)


# -- remote control --------------------------------------------------------------------------


async def _will(
    config: RunnableConfig, verb: str, target: Callable[[PlexServer], tuple[PlexClient, Any]]
) -> str:
    """A remote-control call's `confirmation_check`: `verb` the item its `target` finds on
    the player it finds ("Pause movie “The Matrix” (1999) on Living Room TV"), or why it
    cannot."""

    def find(server: PlexServer) -> str:
        player, item = target(server)
        return f"{verb} {_describe(_item(item))} on {player.title}"

    return await _run(config, find)


async def check_play(args: dict[str, Any], config: RunnableConfig) -> str:
    """`plex_play`'s `confirmation_check`: what will play where, or why it cannot."""
    item_id, client = _item_id(str(args.get("item_id", ""))), _client(str(args.get("client", "")))
    return await _will(config, "Play", lambda server: _play_target(server, item_id, client))


@tool
async def plex_play(item_id: str, client: str, config: RunnableConfig) -> str:
    """Play a Plex item (its id from plex_search, plex_browse or plex_now_playing) on a
    player in the house, named as plex_now_playing lists it ("Living Room TV"). The user
    confirms before it plays."""
    reporter = get_reporter(config)
    with reporter.reporting_errors():
        key, named = _item_id(item_id), _client(client)
        reporter.step(f"Finding item {key} and “{trim(named, 60)}” in Plex")

        def play(server: PlexServer) -> tuple[str, str]:
            player, item = _play_target(server, key, named)
            reporter.step(f"Reaching {player.title} through Plex")
            player.proxyThroughServer(True, server)
            player.playMedia(item)
            return _describe(_item(item)), str(player.title)

        what, where = await _run(config, play)
    reporter.complete(f"Playing on {where}")
    return f"Playing {what} on {where}."


async def check_control(args: dict[str, Any], config: RunnableConfig) -> str:
    """`plex_control`'s `confirmation_check`: what will pause, resume or stop, or why not."""
    action = str(args.get("action", ""))
    named = _client(str(args.get("client", "")))
    _, _, verb, _ = _ACTIONS[action]
    return await _will(config, verb, lambda server: _control_target(server, action, named))


@tool
async def plex_control(action: Action, client: str, config: RunnableConfig) -> str:
    """Pause, resume or stop what plays on a Plex player in the house, named as
    plex_now_playing lists it. The user confirms first."""
    reporter = get_reporter(config)
    with reporter.reporting_errors():
        named = _client(client)
        command, _, _, done = _ACTIONS[action]
        reporter.step(f"Finding “{trim(named, 60)}” in Plex")

        def control(server: PlexServer) -> tuple[str, str]:
            player, session = _control_target(server, action, named)
            reporter.step(f"Reaching {player.title} through Plex")
            player.proxyThroughServer(True, server)
            played = _item(session)
            getattr(player, command)(mtype="music" if played.type == "track" else "video")
            return _describe(played), str(player.title)

        what, where = await _run(config, control)
    reporter.complete(f"{done} on {where}")
    return f"{done} {what} on {where}."


def plex_tools(settings: PlexSettings) -> list[BaseTool]:
    """The Plex tools: offered when BERNARD_PLEX_URL and BERNARD_PLEX_TOKEN are set."""
    if not (settings.plex_url and settings.plex_token):
        return []
    return [plex_search, plex_browse, plex_now_playing, plex_play, plex_control]


plex_play.metadata = {
    "requires_confirmation": True,
    "confirmation_summary": lambda args: (
        f"Play the Plex item {args.get('item_id')} on {args.get('client')}"
    ),
    "confirmation_check": check_play,
}
plex_control.metadata = {
    "requires_confirmation": True,
    "confirmation_summary": lambda args: (
        f"{str(args.get('action', '')).capitalize()} what plays on {args.get('client')}"
    ),
    "confirmation_check": check_control,
}
# The model reads the error text as the tool's result and can answer without it.
for _tool in (plex_search, plex_browse, plex_now_playing, plex_play, plex_control):
    _tool.handle_tool_error = True


# -- the server, the player, the item --------------------------------------------------------

_NO_PLAYERS = (
    "Plex reaches no player now (a Plex app must be open on the device, with remote control "
    "allowed)"
)


async def _run(config: RunnableConfig, work: Callable[[PlexServer], T]) -> T:
    """`work` against the configured server, in the blocking tools' threads; every failure
    a `ToolException` the model reads."""
    runtime = get_runtime(config)
    plex, settings = runtime.tool_settings.of(PlexSettings), runtime.settings
    if not (plex.plex_url and plex.plex_token):
        raise ToolException(
            "Error: Plex is not configured (BERNARD_PLEX_URL and BERNARD_PLEX_TOKEN)"
        )
    url, token = plex.plex_url.rstrip("/"), plex.plex_token.get_secret_value()
    if not plain_origin(url):
        raise ToolException(
            "Error: BERNARD_PLEX_URL is not a plain http(s) address (scheme, host and port, "
            "no user name)"
        )
    session = GuardedSession(
        url,
        deadline_s=settings.tool_timeout_s,
        request_timeout_s=settings.tool_http_timeout_s,
        max_bytes=MAX_BODY_BYTES,
    )

    def connected(session: GuardedSession) -> T:
        try:
            server = PlexServer(url, token, session=session, timeout=settings.tool_http_timeout_s)
            return work(server)
        except ToolException:
            raise
        except Exception as exc:
            raise _failure(exc, session, url) from exc

    return await run_blocking(connected, session)


def _failure(exc: Exception, session: GuardedSession, url: str) -> ToolException:
    """What the model reads of a failed call to Plex."""
    if isinstance(exc, Unauthorized):
        return ToolException(
            "Error: Plex refused the token (HTTP 401); check BERNARD_PLEX_TOKEN (an "
            "X-Plex-Token of an account with access to this server)"
        )
    if isinstance(exc, DeadlineExceeded | requests.Timeout):
        limit = exc.limit_s if isinstance(exc, DeadlineExceeded) else session.request_timeout_s
        return ToolException(f"Error: Plex did not answer within {limit:g}s")
    if isinstance(exc, requests.ConnectionError):
        return ToolException(
            f"Error: could not reach Plex at {url}: the server is offline or BERNARD_PLEX_URL "
            "is wrong"
        )
    if isinstance(exc, TooLarge):
        return ToolException(f"Error: Plex sent more than {exc.limit} bytes")
    if isinstance(exc, OffOrigin):
        where = (
            f"{exc.origin}, another server than BERNARD_PLEX_URL"
            if exc.origin
            else "a URL that is not a plain address (a backslash, a user name or a fragment)"
        )
        return ToolException(f"Error: Plex sent Bernard to {where}; Bernard does not follow it")
    if isinstance(exc, Cancelled):
        return ToolException("Error: the call to Plex was given up on")
    if isinstance(exc, NotFound | BadRequest):
        return ToolException(f"Error: Plex failed (HTTP {session.last_status or '?'})")
    if isinstance(exc, ParseError):
        return ToolException("Error: Plex sent a response that is not valid XML")
    return ToolException(f"Error: Plex sent an unexpected response ({type(exc).__name__})")


def _clients(server: PlexServer) -> list[PlexClient]:
    """The players the server reaches. Built from `GET /clients` here rather than by
    `PlexServer.clients()`, which asks plex.tv for the port of a player that advertises
    none: commands go through the server, so the port is never used."""
    found = server.query("/clients")
    elements = list(found) if found is not None else []
    return [PlexClient(server=server, data=e, initpath="/clients", connect=False) for e in elements]


def _player(server: PlexServer, named: str) -> PlexClient:
    clients = _clients(server)
    for client in clients:
        if (client.title or "").casefold() == named.casefold():
            return client
    names = sorted(trim(c.title or "?", 60) for c in clients)
    if not names:
        raise ToolException(f"Error: Plex has no player called “{trim(named, 60)}”; {_NO_PLAYERS}")
    raise ToolException(
        f"Error: Plex has no player called “{trim(named, 60)}”; the players it reaches now are "
        f"{', '.join(names)}"
    )


def _play_target(server: PlexServer, key: int, named: str) -> tuple[PlexClient, Any]:
    """The player and the item to play on it, once the item is something Plex plays."""
    try:
        item = server.fetchItem(key)
    except NotFound:
        raise ToolException(
            f"Error: Plex has no item with id {key}; find the id with plex_search"
        ) from None
    if _item(item).type not in _PLAYABLE:
        raise ToolException(f"Error: {_describe(_item(item))} is not something Plex can play")
    return _player(server, named), item


def _control_target(server: PlexServer, action: str, named: str) -> tuple[PlexClient, Any]:
    """The player and what plays on it, once the action makes sense there."""
    player = _player(server, named)
    playing = [
        s
        for s in server.sessions()
        if any(p.machineIdentifier == player.machineIdentifier for p in s.players)
    ]
    if not playing:
        raise ToolException(f"Error: nothing is playing on {player.title}")
    session = playing[0]
    _, needs, _, _ = _ACTIONS[action]
    state = next(
        (p.state for p in session.players if p.machineIdentifier == player.machineIdentifier),
        None,
    )
    if needs is not None and state != needs:
        already = "paused" if action == "pause" else "playing"
        raise ToolException(
            f"Error: {_describe(_item(session))} is already {already} on {player.title}"
        )
    return player, session


# -- checking what the model sent, and what it reads -------------------------------------------


def _item_id(item_id: str) -> int:
    key = item_id.strip()
    # ASCII only: `isdigit` also takes "²" (which `int` refuses) and other scripts' digits
    # (which `int` reads as a number the model never saw).
    if not (key.isascii() and key.isdigit()) or len(key) > 12:
        raise ToolException(
            f"Error: the item id {trim(item_id, 40)!r} is not one; ids are numbers (digits "
            "0-9), as plex_search gives them"
        )
    return int(key)


def _client(client: str) -> str:
    named = " ".join(client.split())
    if not named or len(named) > MAX_CLIENT_CHARS:
        raise ToolException(
            "Error: the player's name is empty or too long; plex_now_playing lists the players"
        )
    return named


@dataclass(frozen=True, slots=True)
class PlexItem:
    """What the tools say of a Plex item, read in plexapi's thread."""

    key: int | None
    type: str
    title: str
    year: int | None = None
    show: str | None = None  # an episode's show
    season: int | None = None
    number: int | None = None  # an episode's or a season's index
    parent: str | None = None  # an album's artist, a track's album, a season's show
    artist: str | None = None  # a track's artist
    offset_ms: int | None = None
    duration_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Playing:
    item: PlexItem
    player: str
    state: str
    users: tuple[str, ...]


def _item(obj: Any) -> PlexItem:
    """An item's attributes as plexapi loaded them. Read from the object's own `vars`: an
    attribute a partial object lacks would make plexapi fetch the whole item again."""
    fields = vars(obj)

    def number(name: str) -> int | None:
        value = fields.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def text(name: str) -> str | None:
        value = fields.get(name)
        return str(value) if value not in (None, "") else None

    kind = text("type") or "item"
    return PlexItem(
        key=number("ratingKey"),
        type=kind,
        title=text("title") or "?",
        year=number("year"),
        show=text("grandparentTitle") if kind == "episode" else None,
        season=number("parentIndex"),
        number=number("index"),
        parent=text("parentTitle"),
        artist=text("grandparentTitle") if kind == "track" else None,
        offset_ms=number("viewOffset"),
        duration_ms=number("duration"),
    )


def _playing(session: Any) -> Playing:
    player = session.players[0] if session.players else None
    return Playing(
        item=_item(session),
        player=str(getattr(player, "title", None) or "an unknown player"),
        state=str(getattr(player, "state", None) or "playing"),
        users=tuple(str(u) for u in session.usernames),
    )


def _describe(item: PlexItem) -> str:
    """An item as a person names it: `movie “The Matrix” (1999)`."""
    title = f"“{trim(item.title, TITLE_CHARS)}”"
    when = f" ({item.year})" if item.year is not None else ""
    if item.type == "episode":
        code = f" S{item.season}E{item.number}" if None not in (item.season, item.number) else ""
        return f"episode {title}, {trim(item.show or '?', TITLE_CHARS)}{code}"
    if item.type == "season":
        return f"season {item.number} of {trim(item.parent or '?', TITLE_CHARS)}"
    if item.type == "album":
        return f"album {title} by {trim(item.parent or '?', TITLE_CHARS)}{when}"
    if item.type == "track":
        artist, album = trim(item.artist or "?", TITLE_CHARS), trim(item.parent or "?", TITLE_CHARS)
        return f"track {title} by {artist}, on {album}"
    if item.type == "artist":
        return f"artist {title}"
    return f"{item.type} {title}{when}"


def _progress(offset_ms: int | None, duration_ms: int | None) -> str:
    """ "42:10 of 2:16:18"; "" without an offset."""
    if offset_ms is None or offset_ms <= 0:
        return ""
    if duration_ms is not None and duration_ms > 0:
        return f"{_clock(offset_ms)} of {_clock(duration_ms)}"
    return _clock(offset_ms)


def _clock(ms: int) -> str:
    minutes, seconds = divmod(ms // 1000, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02}:{seconds:02}" if hours else f"{minutes}:{seconds:02}"
