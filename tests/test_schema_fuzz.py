"""Bad input at scale: schemathesis fuzzes every operation of the app's own OpenAPI schema.

Valid and invalid requests alike, over real HTTP to the running API and worker: no answer
may be a 5xx, and every 4xx must carry the OpenAI error envelope.
"""

from __future__ import annotations

import asyncio
from typing import Any

import hypothesis
import requests
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis import GenerationMode

from tests.conftest import make_settings, run_stack
from tests.upstream import Reply, ScriptedUpstream

EXAMPLES_PER_MODE = 20


def check_response(response: Any) -> None:
    status = response.status_code
    assert status < 500, f"{status} for {response.request.method} {response.request.url}"
    if status >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, response.text
        assert isinstance(error["message"], str) and error["message"]


def fuzz(schema_document: dict[str, Any], base_url: str) -> int:
    """Run every operation in both generation modes; returns how many requests were sent."""
    schema = schemathesis.openapi.from_dict(schema_document)
    session = requests.Session()
    sent = 0
    for result in schema.get_all_operations():
        operation = result.ok()
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
                check_response(case.call(base_url=base_url, session=session, timeout=30))
                sent += 1

            try:
                run()
            except hypothesis.errors.Unsatisfiable:
                # An operation without parameters or body has no invalid request to make.
                assert mode is GenerationMode.NEGATIVE, operation.label
    return sent


async def test_fuzzed_requests_never_get_a_5xx_and_every_4xx_uses_the_envelope(
    upstream: ScriptedUpstream,
) -> None:
    upstream.default = Reply.text("ok")
    async with run_stack(make_settings(upstream, keepalive_s=5.0)) as stack:
        document = (await stack.client.get("/openapi.json")).json()
        operations = sum(len(methods) for methods in document["paths"].values())
        sent = await asyncio.to_thread(fuzz, document, stack.base_url)
    assert operations >= 6
    # Parameterless operations stop early (one possible request); the rest run in full.
    assert sent >= 4 * 2 * EXAMPLES_PER_MODE
