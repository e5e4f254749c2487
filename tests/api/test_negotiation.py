"""Content negotiation by the `Accept` header's media ranges and weights (api/negotiation.py),
and the conversation routes answering as it decides; the user's language by
`Accept-Language`."""

from __future__ import annotations

import pytest

from api.negotiation import EVENT_STREAM, JSON, language, negotiate
from tests.support.stack import Stack
from tests.support.upstream import Reply, ScriptedUpstream

OFFERED = (JSON, EVENT_STREAM)


@pytest.mark.parametrize(
    ("accept", "chosen"),
    [
        (None, JSON),
        ("", JSON),
        ("   ", JSON),
        ("text/event-stream", EVENT_STREAM),
        ("application/json", JSON),
        ("*/*", JSON),  # both acceptable: the route's first choice
        ("text/*", EVENT_STREAM),
        ("application/*", JSON),
        # q=0 means "not this", whatever the spelling of the zero
        ("text/event-stream;q=0", JSON),
        ("text/event-stream; q=0.000", JSON),
        ("text/event-stream;q=0, */*", JSON),
        ("*/*, text/event-stream;q=0", JSON),
        ("text/*;q=0, */*", JSON),
        # the most specific range sets the weight, wherever it is listed
        ("text/*;q=0, text/event-stream", EVENT_STREAM),
        ("*/*;q=0.1, text/event-stream", EVENT_STREAM),
        ("text/event-stream, */*;q=0.1", EVENT_STREAM),
        ("text/event-stream;q=0.5, application/json;q=0.9", JSON),
        ("application/json;q=0.5, text/event-stream;q=0.9", EVENT_STREAM),
        ("application/json;q=0.5, text/event-stream;q=0.5", JSON),
        ("text/html, application/xhtml+xml, application/xml;q=0.9, */*;q=0.8", JSON),
        # parameters: media-type ones are ignored, so are the extensions after q
        ("text/event-stream; charset=utf-8", EVENT_STREAM),
        ("text/event-stream;charset=utf-8;q=0", JSON),
        ("text/event-stream;q=1;ext=x", EVENT_STREAM),
        ("text/event-stream;q=0;ext=1", JSON),
        # case does not matter, in types or in the parameter's name
        ("TEXT/Event-Stream", EVENT_STREAM),
        ("text/event-stream;Q=0", JSON),
        # what cannot be read is skipped
        ("text/event-stream;q=2", JSON),
        ("text/event-stream;q=-1", JSON),
        ("text/event-stream;q=0.0001", JSON),
        ("text/event-stream;q=abc", JSON),
        ("text/event-stream;q=1e0", JSON),
        ("event-stream", JSON),
        ("*/event-stream", JSON),
        ("text/event-stream-ish", JSON),
        ("xtext/event-stream", JSON),
        (", ,text/event-stream,", EVENT_STREAM),
        # a substring is not a range
        ("application/json, foo=text/event-stream", JSON),
        # nothing offered is acceptable: the first choice rather than a 406
        ("image/png", JSON),
    ],
)
def test_the_preferred_type_is_chosen_by_ranges_and_weights(
    accept: str | None, chosen: str
) -> None:
    assert negotiate(accept, OFFERED) == chosen


def test_the_routes_order_breaks_ties() -> None:
    assert negotiate("*/*", (EVENT_STREAM, JSON)) == EVENT_STREAM


@pytest.mark.parametrize(
    ("accept", "streamed"),
    [
        ("text/event-stream;q=0", False),
        ("application/json, text/event-stream;q=0.5", False),
        ("text/event-stream;q=0.5, application/json;q=0.1", True),
        ("Text/Event-Stream", True),
    ],
)
async def test_a_conversation_message_streams_only_when_accept_prefers_it(
    stack: Stack, upstream: ScriptedUpstream, accept: str, streamed: bool
) -> None:
    created = await stack.client.post("/v1/conversations", json={})
    upstream.script(Reply.text("hello there"))
    answer = await stack.client.post(
        f"/v1/conversations/{created.json()['id']}/messages",
        json={"content": "hi"},
        headers={"Accept": accept},
    )
    assert answer.status_code == 200, answer.text
    media_type = answer.headers["content-type"].split(";")[0]
    assert media_type == (EVENT_STREAM if streamed else JSON)


KNOWN = ("en", "fr", "de")


@pytest.mark.parametrize(
    ("accept_language", "chosen"),
    [
        (None, None),
        ("", None),
        ("fr", "fr"),
        ("fr-CH", "fr"),
        ("FR-ch", "fr"),
        ("fr-CH, fr;q=0.9, en;q=0.8, de;q=0.7, *;q=0.5", "fr"),
        ("de;q=0.5, fr;q=0.9", "fr"),
        ("pl, de;q=0.3", "de"),  # the best one known
        ("pl, *;q=0.5", None),  # a wildcard names none
        ("fr;q=0, en", "en"),  # q=0: not this
        ("fr;q=2, de", "de"),  # a weight that cannot be read drops its range
        ("fr_FR, en;q=0.1", "en"),  # not a language range
        ("en-US,en;q=0.9", "en"),
        ("de, fr", "de"),  # the first among equals
    ],
)
def test_the_language_is_the_best_weighted_known_one(
    accept_language: str | None, chosen: str | None
) -> None:
    assert language(accept_language, KNOWN) == chosen
