"""How the API's routes are wired, checked on the app itself."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from api import metrics
from api.routes import chat, health, models, turns


def _calls(dependant: Dependant) -> Iterator[Any]:
    yield dependant.call
    for sub in dependant.dependencies:
        yield from _calls(sub)


def test_no_endpoint_or_dependency_runs_in_a_worker_thread() -> None:
    # FastAPI runs a plain `def` endpoint or dependency in a thread pool: a thread hop on
    # every request, on the path to the first token.
    routers = [chat.router, health.router, models.router, turns.router, metrics.router]
    routes = [r for router in routers for r in router.routes if isinstance(r, APIRoute)]
    assert len(routes) >= 8
    sync = [
        f"{route.path}: {call.__qualname__}"
        for route in routes
        for call in _calls(route.dependant)
        if call is not None and not inspect.iscoroutinefunction(call)
    ]
    assert sync == []
