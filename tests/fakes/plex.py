"""A fake Plex Media Server, built from Plex's documented API (https://developer.plex.tv/pms/)
so that python-plexapi itself runs against it.

Every request needs the server's token, as the `X-Plex-Token` header or query parameter;
without it (or with another) the answer is Plex's 401 page. Answers are XML by default and
JSON (`{"MediaContainer": {...}}`, items under "Metadata") with `Accept: application/json`;
list endpoints page with `X-Plex-Container-Start` / `X-Plex-Container-Size` (header or query
parameter), `totalSize` saying how many there are. The library is `library.json`:

- `GET /`: the server's root (friendlyName, machineIdentifier, version, ...), which plexapi
  reads to connect; `GET /identity`; `GET /library` (the library's identifier) and
  `GET /library/sections`;
- `GET /hubs/search?query=`: one Hub per kind of item whose title contains the query (a
  case-insensitive match), `GET /library/metadata/<ratingKey>` (404 when there is none),
  `GET /library/onDeck`, `GET /library/recentlyAdded`;
- `GET /status/sessions`: what plays now, each item with its User, Player and Session;
- `GET /clients`: the players the server reaches (`Server` elements);
- `POST /playQueues` (a play queue for an item, as plexapi's playMedia makes one first) and
  `GET /security/token` (the transient token it hands the player);
- remote control, proxied through the server: `GET /player/playback/<command>` with
  `X-Plex-Target-Client-Identifier` naming the player (404 for a player the server does not
  reach). Each is kept in `commands`, and playMedia, pause, play and stop change what
  `/status/sessions` shows.

A path of `redirects` answers 302 to its URL instead (a hostile or a proxied server).

Modes and holding: tests/fakes/searxng.py (a failure mode answers before any of the above).
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import Any
from xml.etree import ElementTree

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from tests.fakes.searxng import FakeService, Seen

TOKEN = "fake-plex-token"
_UNAUTHORIZED = (
    "<html><head><title>Unauthorized</title></head><body><h1>401 Unauthorized</h1></body></html>"
)
_NOT_FOUND = "<html><head><title>Not Found</title></head><body><h1>404 Not Found</h1></body></html>"
_HUB_TITLES = {
    "movie": "Movies",
    "show": "Shows",
    "episode": "Episodes",
    "artist": "Artists",
    "album": "Albums",
    "track": "Tracks",
}
_COMMANDS = ("playMedia", "pause", "play", "stop")


@dataclass(frozen=True)
class PlayerCommand:
    """One remote-control command the server was asked to pass to a player."""

    command: str
    target: str
    params: dict[str, str]


@dataclass
class Node:
    """An element of an answer: its tag, attributes and children."""

    tag: str
    attrs: dict[str, Any]
    children: list[Node]

    def xml(self) -> ElementTree.Element:
        element = ElementTree.Element(self.tag, {k: _text(v) for k, v in self.attrs.items()})
        element.extend(child.xml() for child in self.children)
        return element

    def json(self) -> dict[str, Any]:
        """As Plex's JSON has it: attributes as fields, items under "Metadata", one child of a
        kind as an object (an item's User, Player, Session), several as a list."""
        out: dict[str, Any] = dict(self.attrs)
        for child in self.children:
            key = "Metadata" if child.tag in ("Video", "Track") or _is_item(child) else child.tag
            if key in ("User", "Player", "Session"):
                out[key] = child.json()
            else:
                out.setdefault(key, []).append(child.json())
        return out


def _is_item(node: Node) -> bool:
    return node.tag == "Directory" and node.attrs.get("type") in _HUB_TITLES


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


class FakePlex(FakeService):
    folder = "plex"
    token = TOKEN

    def __init__(self, mode: str = "ok", *, only: str | None = None, delay_s: float = 5.0) -> None:
        super().__init__(mode, only=only, delay_s=delay_s)
        library = self.fixture("library.json")
        self.library: dict[str, Any] = library
        self.sessions: list[dict[str, Any]] = copy.deepcopy(library["sessions"])
        self.commands: list[PlayerCommand] = []
        self.redirects: dict[str, str] = {}
        self._queue_ids = itertools.count(55)

    def fixture(self, name: str) -> Any:
        document = super().fixture(name)
        assert document["source"], f"{name} says where its shape comes from"
        return document["body"]

    def routes(self) -> list[Route]:
        get = self.checked
        return [
            Route("/", get(self._root)),
            Route("/identity", get(self._identity)),
            Route("/library", get(self._library_root)),
            Route("/library/sections", get(self._sections)),
            Route("/hubs/search", get(self._search)),
            Route("/library/metadata/{key}", get(self._metadata)),
            Route("/library/onDeck", get(self._on_deck)),
            Route("/library/recentlyAdded", get(self._recently_added)),
            Route("/status/sessions", get(self._sessions)),
            Route("/clients", get(self._clients)),
            Route("/playQueues", get(self._play_queue), methods=["POST"]),
            Route("/security/token", get(self._transient_token)),
            Route("/player/playback/{command}", get(self._player)),
        ]

    def checked(self, reply: Any) -> Any:
        """The shared handler behind Plex's token check, its answer as XML or JSON."""

        def render(request: Request, mode: str) -> Response:
            answer = reply(request)
            if isinstance(answer, Response):
                return answer
            if "application/json" in request.headers.get("accept", ""):
                return JSONResponse({"MediaContainer": answer.json()})
            body = ElementTree.tostring(answer.xml(), encoding="unicode", xml_declaration=True)
            return Response(body, media_type="text/xml;charset=utf-8")

        handle = self.endpoint(render)

        async def guarded(request: Request) -> Response:
            if request.url.path in self.redirects:
                self.requests.append(Seen(request.url.path, dict(request.query_params)))
                # As written: Starlette's RedirectResponse would quote a backslash.
                return Response(
                    status_code=302, headers={"location": self.redirects[request.url.path]}
                )
            token = request.headers.get("x-plex-token") or request.query_params.get("X-Plex-Token")
            if token != self.token:
                self.requests.append(Seen(request.url.path, dict(request.query_params)))
                return HTMLResponse(_UNAUTHORIZED, status_code=401)
            return await handle(request)

        return guarded

    # -- the library -------------------------------------------------------------------------

    def item(self, key: int) -> dict[str, Any] | None:
        return next((i for i in self.library["items"] if i["ratingKey"] == key), None)

    def _node(self, item: dict[str, Any], **more: Any) -> Node:
        attrs = {k: v for k, v in item.items() if k != "tag"}
        return Node(item["tag"], {**attrs, **more}, [])

    def _container(self, children: list[Node], **attrs: Any) -> Node:
        return Node("MediaContainer", {"size": len(children), **attrs}, children)

    def _paged(self, request: Request, nodes: list[Node], **attrs: Any) -> Node:
        start = int(_paging(request, "X-Plex-Container-Start") or 0)
        size = _paging(request, "X-Plex-Container-Size")
        shown = nodes[start : start + int(size)] if size is not None else nodes[start:]
        return self._container(shown, totalSize=len(nodes), offset=start, **attrs)

    def _root(self, request: Request) -> Node:
        return self._container([], **self.library["server"])

    def _identity(self, request: Request) -> Node:
        server = self.library["server"]
        return Node(
            "MediaContainer",
            {
                "size": 0,
                "claimed": 1,
                "machineIdentifier": server["machineIdentifier"],
                "version": server["version"],
            },
            [],
        )

    def _library_root(self, request: Request) -> Node:
        sections = Node("Directory", {"key": "sections", "title": "Library Sections"}, [])
        return self._container(
            [sections],
            identifier="com.plexapp.plugins.library",
            title1="Plex Library",
            mediaTagPrefix="/system/bundle/media/flags/",
        )

    def _sections(self, request: Request) -> Node:
        return self._container(
            [Node("Directory", dict(s), []) for s in self.library["sections"]],
            title1="Plex Library",
        )

    def _search(self, request: Request) -> Node:
        query = request.query_params.get("query", "").casefold()
        limit = int(request.query_params.get("limit") or 10)
        hubs = []
        for kind, title in _HUB_TITLES.items():
            found = [
                self._node(i)
                for i in self.library["items"]
                if i["type"] == kind and query and query in i["title"].casefold()
            ][:limit]
            if found:
                hub = {"title": title, "type": kind, "hubIdentifier": kind, "size": len(found)}
                hubs.append(Node("Hub", {**hub, "more": 0, "style": "shelf"}, found))
        return self._container(hubs)

    def _metadata(self, request: Request) -> Node | Response:
        key = request.path_params["key"]
        found = self.item(int(key)) if key.isdigit() else None
        if found is None:
            return HTMLResponse(_NOT_FOUND, status_code=404)
        return self._container([self._node(found)], librarySectionID=found["librarySectionID"])

    def _listed(self, request: Request, keys: list[int]) -> Node:
        items = [self.item(k) for k in keys]
        return self._paged(request, [self._node(i) for i in items if i is not None])

    def _on_deck(self, request: Request) -> Node:
        return self._listed(request, self.library["on_deck"])

    def _recently_added(self, request: Request) -> Node:
        return self._listed(request, self.library["recently_added"])

    # -- players -----------------------------------------------------------------------------

    def client(self, identifier: str) -> dict[str, Any] | None:
        return next(
            (c for c in self.library["clients"] if c["machineIdentifier"] == identifier), None
        )

    def _sessions(self, request: Request) -> Node:
        nodes = []
        for session in self.sessions:
            item, client = self.item(session["ratingKey"]), self.client(session["client"])
            if item is None or client is None:
                continue
            player = {
                "title": client["name"],
                "machineIdentifier": client["machineIdentifier"],
                "product": client["product"],
                "platform": "Android",
                "state": session["state"],
                "address": client["address"],
                "local": 1,
            }
            node = self._node(
                item, sessionKey=session["sessionKey"], viewOffset=session["viewOffset"]
            )
            node.children = [
                Node("User", dict(session["user"]), []),
                Node("Player", player, []),
                Node("Session", dict(session["session"]), []),
            ]
            nodes.append(node)
        return self._container(nodes)

    def _clients(self, request: Request) -> Node:
        return self._container([Node("Server", dict(c), []) for c in self.library["clients"]])

    def _play_queue(self, request: Request) -> Node | Response:
        uri = request.query_params.get("uri", "")
        key = uri.rsplit("/library/metadata/", 1)[-1]
        found = self.item(int(key)) if key.isdigit() else None
        if found is None:
            return HTMLResponse(_NOT_FOUND, status_code=404)
        queue_id = next(self._queue_ids)
        return self._container(
            [self._node(found, playQueueItemID=queue_id * 10)],
            playQueueID=queue_id,
            playQueueSelectedItemID=queue_id * 10,
            playQueueSelectedItemOffset=0,
            playQueueSelectedMetadataItemID=found["ratingKey"],
            playQueueShuffled=0,
            playQueueSourceURI=uri,
            playQueueTotalCount=1,
            playQueueVersion=1,
        )

    def _transient_token(self, request: Request) -> Node:
        return Node("MediaContainer", {"size": 0, "token": "transient-0a1b2c3d"}, [])

    def _player(self, request: Request) -> Node | Response:
        command = request.path_params["command"]
        target = request.headers.get("x-plex-target-client-identifier", "")
        if command not in _COMMANDS or self.client(target) is None:
            return HTMLResponse(_NOT_FOUND, status_code=404)
        params = dict(request.query_params)
        params.pop("X-Plex-Token", None)
        self.commands.append(PlayerCommand(command, target, params))
        playing = [s for s in self.sessions if s["client"] == target]
        if command == "playMedia":
            key = params.get("key", "").rsplit("/", 1)[-1]
            self.sessions = [s for s in self.sessions if s["client"] != target]
            self.sessions.append(
                {
                    "ratingKey": int(key),
                    "sessionKey": 8,
                    "viewOffset": int(params.get("offset") or 0),
                    "user": {"id": 1, "title": "alice"},
                    "client": target,
                    "state": "playing",
                    "session": {
                        "id": "p0q9r8s7t6u5v4w3x2y1z0ab",
                        "bandwidth": 12000,
                        "location": "lan",
                    },
                }
            )
        elif command == "stop":
            self.sessions = [s for s in self.sessions if s["client"] != target]
        else:
            for session in playing:
                session["state"] = "paused" if command == "pause" else "playing"
        return Node("Response", {"code": 200, "status": "OK"}, [])


def _paging(request: Request, name: str) -> str | None:
    return request.headers.get(name) or request.query_params.get(name)
