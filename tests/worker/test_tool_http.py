"""`request_json`: every way a service can answer becomes JSON or a message the model reads."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from langchain_core.tools import ToolException

from tests.conftest import make_settings
from worker.tools.http import MAX_BODY_BYTES, ServiceError, request_json, trim
from worker.tools.runtime import ToolRuntime, http_client, runtime_config


def config_answering(response: httpx.Response | Exception) -> Any:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(response, Exception):
            raise response
        return response

    settings = make_settings()
    client = http_client(settings, httpx.MockTransport(handler))
    runtime = ToolRuntime(owner="t", redis=None, settings=settings, http=client)  # type: ignore[arg-type]
    return runtime_config(runtime, {})


async def call(response: httpx.Response | Exception, **options: Any) -> Any:
    return await request_json(
        config_answering(response), "GET", "http://svc/x", service="The service", **options
    )


@pytest.mark.parametrize(
    ("response", "options", "message"),
    [
        (httpx.Response(500), {}, "The service failed (HTTP 500)"),
        (
            httpx.Response(400, json={"reason": "bad latitude"}),
            {"reason_of": lambda body: body["reason"]},
            "The service failed (HTTP 400): bad latitude",
        ),
        (
            httpx.Response(401),
            {"refused": "; check the token"},
            "refused the request (HTTP 401); check the token",
        ),
        (httpx.Response(404), {}, "failed (HTTP 404)"),
        (httpx.Response(200, content=b"{not json"), {}, "not valid JSON"),
        (httpx.Response(200, content=b"x" * (MAX_BODY_BYTES + 1)), {}, "more than"),
        (httpx.ReadTimeout("slow"), {}, "did not answer within 10s"),
        (httpx.ConnectError("refused"), {}, "could not reach The service: refused"),
    ],
)
async def test_failures_are_messages_for_the_model(
    response: httpx.Response | Exception, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ToolException, match=message.replace("(", r"\(").replace(")", r"\)")):
        await call(response, **options)


@pytest.mark.parametrize(
    ("response", "options", "status", "reason"),
    [
        (httpx.Response(500, text="oops"), {}, 500, ""),
        (
            httpx.Response(400, json={"reason": "bad latitude"}),
            {"reason_of": lambda body: body["reason"]},
            400,
            "bad latitude",
        ),
        (httpx.Response(400, json={}), {"reason_of": lambda body: body.get("reason")}, 400, ""),
        (httpx.Response(403), {"refused": "; check the token"}, 403, ""),
    ],
)
async def test_an_error_reply_carries_its_status_and_the_services_reason(
    response: httpx.Response, options: dict[str, Any], status: int, reason: str
) -> None:
    """For a tool to tell one failure from another without reading the model's message."""
    with pytest.raises(ServiceError) as raised:
        await call(response, **options)
    assert (raised.value.status, raised.value.reason) == (status, reason)


async def test_json_comes_back_and_a_404_can_mean_nothing() -> None:
    assert await call(httpx.Response(200, json={"a": [1]})) == {"a": [1]}
    assert await call(httpx.Response(404), missing_ok=True) is None


@pytest.mark.parametrize(
    ("text", "limit", "trimmed"),
    [
        ("short", 10, "short"),
        ("a  b\n c", 10, "a b c"),
        ("one two three four", 10, "one two…"),
        ("one, two three", 6, "one…"),
    ],
)
def test_trim_cuts_at_a_word(text: str, limit: int, trimmed: str) -> None:
    assert trim(text, limit) == trimmed
