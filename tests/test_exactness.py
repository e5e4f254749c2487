"""Exactness under load (issue 5, at the test suite's size): 100 concurrent streams of 200
tokens through a real API process, a real worker process and Redis, each checked token by
token against what the upstream sent. The full-size run (1,000 streams) is
`python -m bench --only exactness`.

Real processes, as in production: with the API, the worker, the upstream and 100 clients
all on the test's one event loop, the loop is the bottleneck rather than the pipeline.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import httpx

from api.cursors import parse_cursor
from tests.support.processes import ProcessGroup
from tests.support.sse import Frame, frames
from tests.support.stack import make_settings
from tests.support.upstream import ScriptedUpstream, echo_responder, echo_tokens

STREAMS = 100
TOKENS = 200


def _id_key(frame_id: str) -> tuple[tuple[int, int], int]:
    # As the server reads a frame id back (`done:<k>` names the stream's last entry).
    cursor = parse_cursor(frame_id)
    assert cursor is not None, frame_id
    return cursor.key, cursor.frame if cursor.frame is not None else -1


def _keepalive(frame: Frame) -> bool:
    return (frame.bernard or {}).get("type") == "keepalive"


def check(got: list[Frame], expected: list[str]) -> None:
    """Whole tokens in order, none lost or repeated; one `stop`; `[DONE]` once, last."""
    assert got and got[-1].done, "the stream must end with [DONE]"
    assert sum(frame.done for frame in got) == 1
    # A keepalive frame has no `id:` line, so an SSE parser repeats the last id for it.
    ids = [frame.id for frame in got if frame.id and not _keepalive(frame)]
    for before, after in itertools.pairwise(ids):
        assert _id_key(before) < _id_key(after), f"SSE ids must strictly increase: {ids}"
    assert got[0].json["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    k = 0
    finish = None
    for frame in got[1:-1]:
        body = frame.json
        assert "error" not in body, body
        choices = body.get("choices") or []
        if not choices:
            continue
        if choices[0].get("finish_reason"):
            finish = choices[0]["finish_reason"]
            continue
        text = frame.content
        if not text:
            continue
        assert finish is None, "content after the finish frame"
        # The worker may join deltas that piled up into one entry: a run of whole tokens.
        j, length = k, 0
        while length < len(text) and j < len(expected):
            length += len(expected[j])
            j += 1
        assert text == "".join(expected[k:j]), f"diverges at token {k}: {text[:40]!r}"
        k = j
    assert k == len(expected), f"{k} of {len(expected)} tokens arrived"
    assert finish == "stop"


async def test_100_concurrent_streams_are_exact_token_by_token(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    upstream.responder = echo_responder(TOKENS)
    # One user's hundred streams: an operator serving such a client raises the user limits
    # (and turns the rate off: a hundred turns at once is what it stops).
    settings = make_settings(
        upstream,
        max_active_turns_per_user=STREAMS,
        max_streams_per_user=STREAMS,
        rate_limit_per_minute=0,
    )
    limits = httpx.Limits(max_connections=STREAMS + 10, max_keepalive_connections=0)

    async with ProcessGroup(tmp_path / "logs") as procs:
        await procs.worker(settings)
        api = await procs.api(settings)
        client = httpx.AsyncClient(
            base_url=api.base_url or "", timeout=httpx.Timeout(60.0), limits=limits
        )
        async with client:
            results = await _run(client)

    for i, got in enumerate(results):
        check(got, echo_tokens(f"exactness stream {i} of the suite", TOKENS))


async def _run(client: httpx.AsyncClient) -> list[list[Frame]]:

    async def one(i: int) -> list[Frame]:
        body = {
            "model": "bernard-v1",
            "stream": True,
            "messages": [{"role": "user", "content": f"exactness stream {i} of the suite"}],
        }
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200, await response.aread()
            return [frame async for frame in frames(response)]

    return list(await asyncio.gather(*(one(i) for i in range(STREAMS))))
