"""The peer of the bench's CPU-per-turn section (bench/langgraph_app.py): LangGraph's agent,
served in its own uvicorn process on the bench's scripted upstream, streams a paced answer
whole and in order, as bench.runner.check_turn judges every system's streams."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from bench.processes import Cluster
from bench.runner import check_turn, echo_directives, start_turn


@pytest.fixture
async def langgraph(tmp_path: Path) -> AsyncIterator[Cluster]:
    # No Redis is used: the URL only fills the environment the children get.
    cluster = Cluster.create(tmp_path, "redis://127.0.0.1:1/0", {})
    try:
        await cluster.start_upstream()
        await cluster.start_langgraph()
        yield cluster
    finally:
        cluster.stop_all()


async def test_the_langgraph_peer_streams_every_token_of_a_paced_answer(
    langgraph: Cluster,
) -> None:
    assert langgraph.langgraph is not None
    (directive,) = echo_directives("peer", 1, tokens=12, delay_ms=5)
    turn = await start_turn(langgraph.langgraph.endpoint, directive, "langgraph")
    await turn.call.finished
    assert check_turn(turn) is None
    deltas = [orjson.loads(f.data)["choices"][0]["delta"] for f in turn.call.frames[1:-2]]
    assert len([d for d in deltas if d["content"]]) == 12  # one frame a token
