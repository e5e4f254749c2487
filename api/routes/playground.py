"""The web playground: the static page in api/playground/, served at `/` and `/playground`.

Only the files shipped in that folder are served, read once at import, each under
`/playground/<name>`; anything else is the usual 404. Every answer carries a Content
Security Policy that allows scripts, styles, images and connections from this origin only:
model output is sanitized before it reaches the page (api/playground/app.js), and even
markup that got through could run no script nor load anything from elsewhere. The routes
stay out of the OpenAPI schema: they are not part of the API.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Response

from api.errors import not_found

router = APIRouter(include_in_schema=False)

ROOT = Path(__file__).resolve().parent.parent / "playground"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # The page is small and changes with the package: always ask whether it changed.
    "Cache-Control": "no-cache",
}


_MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
    ".svg": "image/svg+xml",
}


def _media_type(path: Path) -> str:
    """By suffix; the rest (licences, notes) is plain text."""
    return _MEDIA_TYPES.get(path.suffix, "text/plain; charset=utf-8")


def _load(root: Path) -> dict[str, tuple[bytes, str]]:
    """Every file under `root` by its path relative to it: (content, media type)."""
    return {
        path.relative_to(root).as_posix(): (path.read_bytes(), _media_type(path))
        for path in sorted(root.rglob("*"))
        if path.is_file() and not path.name.startswith(".")
    }


FILES = _load(ROOT)


def _file(name: str) -> Response:
    found = FILES.get(name)
    if found is None:
        raise not_found(f"no playground file '{name}'")
    content, media_type = found
    return Response(content, media_type=media_type, headers=_HEADERS)


@router.get("/")
async def index() -> Response:
    return _file("index.html")


@router.get("/playground")
async def playground() -> Response:
    return _file("index.html")


@router.get("/playground/{name:path}")
async def asset(name: str) -> Response:
    return _file(name)
