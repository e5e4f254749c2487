"""Bad input at scale: schemathesis fuzzes every operation of the app's own OpenAPI schema.

Valid and invalid requests alike, over real HTTP to the running API and worker: no answer
may be a 5xx, and every 4xx must carry the OpenAI error envelope. Every offending request
is collected and reported, not only the first.

Reproducible: `--hypothesis-seed=N` fixes what is generated (.ci/run passes one), and
`BERNARD_FUZZ_EXAMPLES` sets how many requests each operation gets per mode (default 20;
raise it, with other seeds, for longer hunts).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis import GenerationMode

from tests.support.stack import make_settings, run_stack
from tests.support.upstream import Reply, ScriptedUpstream

EXAMPLES_PER_MODE = int(os.environ.get("BERNARD_FUZZ_EXAMPLES", "20"))
# Streams that stay open by design until the client leaves: a valid request would never
# end. Their bad cursors and missing keys are tested in tests/test_timers.py.
ENDLESS = {("GET", "/v1/events")}


def problem_with(response: Any) -> str | None:
    """What is wrong with an answer: a 5xx, or a 4xx without the OpenAI envelope."""
    status = response.status_code
    where = f"{status} for {response.request.method} {response.request.url}"
    if status >= 500:
        return f"{where}: {response.request.body!r:.300} -> {response.text[:300]}"
    if status >= 400:
        try:
            error = response.json()["error"]
        except (ValueError, KeyError, TypeError):
            return f"{where}: no error envelope: {response.text[:300]}"
        if set(error) != {"message", "type", "param", "code"} or not error.get("message"):
            return f"{where}: malformed envelope: {response.text[:300]}"
    return None


def fuzz(schema_document: dict[str, Any], base_url: str, seed: int | None) -> tuple[int, list[str]]:
    """Run every operation in both generation modes; how many requests were sent, and
    every problem found."""
    schema = schemathesis.openapi.from_dict(schema_document)
    session = requests.Session()
    sent = 0
    problems: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if (operation.method.upper(), operation.path) in ENDLESS:
            continue
        for mode in GenerationMode:

            @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
            @hypothesis.settings(
                max_examples=EXAMPLES_PER_MODE,
                deadline=None,
                database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            def run(case: schemathesis.Case) -> None:
                nonlocal sent
                response = case.call(base_url=base_url, session=session, timeout=30)
                sent += 1
                if (problem := problem_with(response)) is not None:
                    problems.append(problem)

            if seed is not None:
                run = hypothesis.seed(seed)(run)
            try:
                run()
            except hypothesis.errors.Unsatisfiable:
                # An operation without parameters or body has no invalid request to make.
                assert mode is GenerationMode.NEGATIVE, operation.label
    return sent, problems


async def test_fuzzed_requests_never_get_a_5xx_and_every_4xx_uses_the_envelope(
    upstream: ScriptedUpstream, request: pytest.FixtureRequest
) -> None:
    upstream.default = Reply.text("ok")
    seed = request.config.getoption("hypothesis_seed", default=None)
    async with run_stack(make_settings(upstream, keepalive_s=5.0, api_docs=True)) as stack:
        document = (await stack.client.get("/openapi.json")).json()
        operations = sum(len(methods) for methods in document["paths"].values())
        sent, problems = await asyncio.to_thread(
            fuzz, document, stack.base_url, int(seed) if seed is not None else None
        )
    assert problems == []
    assert operations >= 6
    # Parameterless operations stop early (one possible request); the rest run in full.
    assert sent >= 4 * 2 * EXAMPLES_PER_MODE
