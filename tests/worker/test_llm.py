"""Building the worker's models from the settings."""

from __future__ import annotations

import logging

import pytest

from tests.conftest import make_settings
from tests.upstream import ScriptedUpstream
from worker.llm import LLM_CONNECTIONS, build_llms


def test_a_concurrency_above_the_llm_connection_pool_is_warned_about(
    upstream: ScriptedUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="bernard.worker"):
        build_llms(make_settings(upstream, worker_concurrency=LLM_CONNECTIONS))
        assert not caplog.records
        build_llms(make_settings(upstream, worker_concurrency=LLM_CONNECTIONS + 1))
    assert [r.getMessage() for r in caplog.records] == [
        f"BERNARD_WORKER_CONCURRENCY={LLM_CONNECTIONS + 1} is above the {LLM_CONNECTIONS} "
        "upstream connections the LLM client pools: turns beyond that many wait, silently, "
        "for a connection"
    ]
