"""Operators' view: JSON log lines and OpenTelemetry traces, through real turns.

The API and the worker run in the test's process (tests/support/stack.py `run_stack`), so one
handler on the `bernard` logger sees both sides' lines, and one in-memory span exporter sees
both sides' spans: the worker's must land under the API request's trace, carried on the
turn record.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langchain_core.tools import tool
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import Field, SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from shared import traces
from shared.logs import (
    REDACTED,
    JsonFormatter,
    TextFormatter,
    escape_controls,
    hide_in_logs,
    log_format,
    log_handler,
    secrets_of,
)
from shared.requests import AgentRequest, TurnRequest
from shared.settings import Settings, get_settings
from shared.turn_record import TurnRecord
from shared.turns import TurnStore
from tests.support.serving import serve
from tests.support.stack import Stack, make_settings, run_stack, run_worker
from tests.support.upstream import Reply, ScriptedUpstream
from worker.tools.home_assistant import HomeAssistantSettings
from worker.tools.settings import SourceSettings, ToolSettings

PROMPT = "my grandmother's secret recipe is purple-walrus-7"
ANSWER = "Here is the answer you wanted, friend."
EXPRESSION = "1234*5678"
USER_KEY = "sk-bernard-user-key-0451"
UPSTREAM_KEY = "sk-upstream-secret-9917"
HA_TOKEN = "ha-long-lived-token-4242"
ALICE = {"Authorization": f"Bearer {USER_KEY}"}


class Lines:
    """The JSON lines the `bernard` loggers wrote while it was attached."""

    def __init__(self, stream: io.StringIO) -> None:
        self.stream = stream

    @property
    def text(self) -> str:
        return self.stream.getvalue()

    def all(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.text.splitlines() if line]

    def named(self, message: str, **fields: Any) -> list[dict[str, Any]]:
        return [
            line
            for line in self.all()
            if line["message"] == message and all(line.get(k) == v for k, v in fields.items())
        ]

    async def wait_for(self, message: str, **fields: Any) -> dict[str, Any]:
        """The first such line, once written (a worker logs a turn's end after its client
        may already have the answer)."""
        for _ in range(1000):
            if found := self.named(message, **fields):
                return found[0]
            await asyncio.sleep(0.01)
        raise AssertionError(f"no {message!r} line with {fields}")


@contextlib.contextmanager
def captured(settings: Settings) -> Iterator[Lines]:
    """Attach the handler `./run` would use in JSON mode to the `bernard` logger."""
    stream = io.StringIO()
    json_settings = settings.model_copy(update={"log_format": "json"})
    handler = log_handler(json_settings, stream)
    logger = logging.getLogger("bernard")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield Lines(stream)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on for the test, into memory (both processes' spans: they share this one)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    traces.install(provider)
    try:
        yield exporter
    finally:
        traces.install(None)
        provider.shutdown()


def secret_settings(upstream: ScriptedUpstream, **overrides: Any) -> Settings:
    return make_settings(
        upstream,
        # A user of this test's own, so the conversations it finds are its own.
        api_keys=f"{USER_KEY}:alice-{uuid.uuid4().hex[:8]}",
        openai_api_key=UPSTREAM_KEY,
        **overrides,
    )


async def chat(stack: Stack, content: str) -> httpx.Response:
    """Alice's non-stream chat completion."""
    return await stack.client.post(
        "/v1/chat/completions",
        json={"model": "bernard-v1", "messages": [{"role": "user", "content": content}]},
        headers=ALICE,
    )


async def tool_turn(stack: Stack, upstream: ScriptedUpstream) -> dict[str, Any]:
    """A non-stream chat turn of alice's: the router runs the calculator, then the answer."""
    upstream.script_router(Reply.tool_calls([("calculator", {"expression": EXPRESSION})]))
    upstream.script(Reply.text(ANSWER, usage=(21, 8)))
    response = await chat(stack, PROMPT)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == ANSWER
    return {
        "turn_id": response.headers["x-bernard-turn-id"],
        "conversation_id": response.headers["x-bernard-conversation-id"],
    }


# -- log lines through a real turn -----------------------------------------------------------


async def test_a_turn_logs_one_json_line_per_request_and_per_turn_event(
    upstream: ScriptedUpstream,
) -> None:
    settings = secret_settings(upstream)
    async with run_stack(settings) as stack:
        with captured(settings) as lines:
            turn = await tool_turn(stack, upstream)
            turn_id = turn["turn_id"]
            ended = await lines.wait_for("turn ended", turn_id=turn_id)
            request = await lines.wait_for("request", path="/v1/chat/completions")

    alice = settings.api_key_users()[USER_KEY]
    mine = {"turn_id": turn_id, "user": alice, "conversation_id": turn["conversation_id"]}
    assert request["method"] == "POST" and request["status"] == 200
    assert request["route"] == "/v1/chat/completions"
    assert request["user"] == alice and request["turn_id"] == turn_id
    assert request["conversation_id"] == turn["conversation_id"]
    assert request["duration_ms"] > 0 and request["logger"] == "bernard.api"

    created = lines.named("turn created", turn_id=turn_id)
    assert len(created) == 1
    assert created[0]["user"] == alice and created[0]["mode"] == "wait"

    started = lines.named("turn started", turn_id=turn_id)
    assert len(started) == 1 and started[0]["queue_ms"] >= 0
    assert started[0]["logger"] == "bernard.worker"

    calls = lines.named("model call", turn_id=turn_id)
    assert [(c["stage"], c["model"], c["status"]) for c in calls] == [
        ("router", "router-model", "ok"),
        ("router", "router-model", "ok"),
        ("response", "response-model", "ok"),
    ]
    assert all(c["latency_ms"] > 0 for c in calls)
    assert (calls[-1]["prompt_tokens"], calls[-1]["completion_tokens"]) == (21, 8)
    assert calls[-1]["finish_reason"] == "stop"

    (tool,) = lines.named("tool call", turn_id=turn_id)
    assert (tool["tool"], tool["status"], tool["error"]) == ("calculator", "success", None)
    assert tool["duration_ms"] >= 0 and tool["tool_call_id"]

    assert ended["status"] == "completed" and ended["error"] is None
    prompt_tokens = sum(c["prompt_tokens"] for c in calls)
    completion_tokens = sum(c["completion_tokens"] for c in calls)
    assert (ended["prompt_tokens"], ended["completion_tokens"], ended["total_tokens"]) == (
        prompt_tokens,
        completion_tokens,
        prompt_tokens + completion_tokens,
    )
    assert ended["duration_ms"] > 0 and ended["queue_ms"] == started[0]["queue_ms"]
    for line in [*created, *started, *calls, tool, ended]:
        assert {k: line[k] for k in mine} == mine, line
        assert line["level"] in ("info", "warning") and line["ts"].endswith("+00:00")


async def test_no_prompt_argument_answer_or_key_is_logged_by_default(
    upstream: ScriptedUpstream,
) -> None:
    settings = secret_settings(upstream)
    async with run_stack(settings) as stack:
        with captured(settings) as lines:
            turn_id = (await tool_turn(stack, upstream))["turn_id"]
            await lines.wait_for("turn ended", turn_id=turn_id)
            await lines.wait_for("request", path="/v1/chat/completions")
    assert len(lines.all()) >= 7
    for leak in (PROMPT, "purple-walrus", EXPRESSION, "7006652", ANSWER, USER_KEY, UPSTREAM_KEY):
        assert leak not in lines.text, leak


async def test_log_prompts_adds_prompts_and_arguments_but_never_keys(
    upstream: ScriptedUpstream,
) -> None:
    settings = secret_settings(upstream, log_prompts=True)
    async with run_stack(settings) as stack:
        with captured(settings) as lines:
            turn_id = (await tool_turn(stack, upstream))["turn_id"]
            await lines.wait_for("turn ended", turn_id=turn_id)
    router = lines.named("model call", turn_id=turn_id, stage="router")[0]
    assert PROMPT in json.dumps(router["prompt"])
    (tool,) = lines.named("tool call", turn_id=turn_id)
    assert EXPRESSION in tool["arguments"] and tool["output"] == "7006652"
    response = lines.named("model call", turn_id=turn_id, stage="response")[0]
    assert response["output"]["content"] == ANSWER
    for key in (USER_KEY, UPSTREAM_KEY):
        assert key not in lines.text


async def test_a_failed_model_call_and_its_turn_log_the_error_code_not_the_message(
    upstream: ScriptedUpstream,
) -> None:
    settings = secret_settings(upstream)
    async with run_stack(settings) as stack:
        with captured(settings) as lines:
            upstream.script(Reply.error(500, f"the model choked on {PROMPT}"))
            response = await chat(stack, PROMPT)
            turn_id = response.headers["x-bernard-turn-id"]
            ended = await lines.wait_for("turn ended", turn_id=turn_id)
    assert response.status_code == 502
    (call,) = lines.named("model call", turn_id=turn_id, stage="response")
    assert (call["status"], call["error"], call["upstream_status"]) == (
        "error",
        "upstream_error",
        500,
    )
    assert call["level"] == "warning"
    assert (ended["status"], ended["error"], ended["level"]) == (
        "failed",
        "upstream_error",
        "warning",
    )
    assert "choked" not in lines.text and PROMPT not in lines.text


async def test_with_log_prompts_a_failed_model_call_logs_the_upstreams_words(
    upstream: ScriptedUpstream,
) -> None:
    """The only place they go: the client reads the code and generic words."""
    settings = secret_settings(upstream, log_prompts=True)
    async with run_stack(settings) as stack:
        with captured(settings) as lines:
            upstream.script(Reply.error(500, "the model choked on the walrus"))
            response = await chat(stack, PROMPT)
            turn_id = response.headers["x-bernard-turn-id"]
            await lines.wait_for("turn ended", turn_id=turn_id)
    (call,) = lines.named("model call", turn_id=turn_id, stage="response")
    assert "the model choked on the walrus" in call["error_message"]
    assert response.json()["error"]["message"] == "the upstream model failed (HTTP 500)"


async def test_a_turn_that_waits_for_confirmation_logs_its_pause(
    upstream: ScriptedUpstream,
) -> None:
    settings = secret_settings(upstream)
    async with run_stack(settings) as stack:
        created = await stack.client.post("/v1/conversations", json={"id": "pantry"}, headers=ALICE)
        assert created.status_code == 201, created.text
        with captured(settings) as lines:
            upstream.script_router(Reply.tool_calls([("save_note", {"text": "the code is 9"})]))
            response = await stack.client.post(
                "/v1/conversations/pantry/messages",
                json={"content": PROMPT},
                headers=ALICE,
            )
            assert response.status_code == 200, response.text
            body = response.json()
            ended = await lines.wait_for("turn ended", turn_id=body["turn_id"])
            request = await lines.wait_for("request", path="/v1/conversations/pantry/messages")
    (paused,) = lines.named("turn paused", turn_id=body["turn_id"])
    assert paused["tool"] == "save_note" and paused["conversation_id"] == "pantry"
    assert paused["confirmation_id"] == body["pending_confirmation"]["confirmation_id"]
    assert ended["status"] == "awaiting_confirmation" and ended["conversation_id"] == "pantry"
    assert request["conversation_id"] == "pantry" and request["turn_id"] == body["turn_id"]
    assert request["route"] == "/v1/conversations/{conversation_id}/messages"
    assert "the code is 9" not in lines.text


async def test_a_line_any_module_logs_during_a_turn_carries_that_turn(
    upstream: ScriptedUpstream,
) -> None:
    @tool
    def explode(reason: str) -> str:
        """Always fails."""
        raise RuntimeError(f"kaput because {reason}")

    settings = secret_settings(upstream)
    async with run_stack(settings, tools=[explode]) as stack:
        with captured(settings) as lines:
            upstream.script_router(Reply.tool_calls([("explode", {"reason": "walrus-reason"})]))
            upstream.script(Reply.text("It broke."))
            response = await chat(stack, PROMPT)
            turn_id = response.headers["x-bernard-turn-id"]
            await lines.wait_for("turn ended", turn_id=turn_id)
    (failed,) = lines.named("tool explode failed: RuntimeError")
    assert failed["logger"] == "bernard.worker.tools" and failed["level"] == "warning"
    assert failed["turn_id"] == turn_id
    assert failed["user"] == settings.api_key_users()[USER_KEY]
    (call,) = lines.named("tool call", turn_id=turn_id)
    assert (call["tool"], call["status"], call["error"]) == ("explode", "error", "tool_error")
    assert "kaput" not in lines.text and "walrus-reason" not in lines.text


async def test_a_route_with_a_turn_in_its_path_logs_that_turn(upstream: ScriptedUpstream) -> None:
    settings = secret_settings(upstream)
    async with run_stack(settings, worker=False) as stack:
        with captured(settings) as lines:
            await stack.client.get("/v1/turns/abc123", headers=ALICE)
            await stack.client.get("/v1/models")
            line = await lines.wait_for("request", path="/v1/turns/abc123")
            models = await lines.wait_for("request", path="/v1/models")
    assert (line["status"], line["turn_id"], line["route"]) == (
        404,
        "abc123",
        "/v1/turns/{turn_id}",
    )
    assert "user" not in models  # no route there asks who the caller is


# -- formatting --------------------------------------------------------------------------------


def record(message: str = "turn ended", **extra: Any) -> logging.LogRecord:
    made = logging.LogRecord("bernard.worker", logging.INFO, __file__, 1, message, (), None)
    made.__dict__.update(extra)
    return made


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({}, {}),
        ({"turn_id": "t1", "status": "completed"}, {"turn_id": "t1", "status": "completed"}),
        ({"duration_ms": 12.5, "error": None}, {"duration_ms": 12.5, "error": None}),
        ({"prompt": [{"role": "user"}]}, {"prompt": [{"role": "user"}]}),
    ],
)
def test_a_json_line_holds_the_records_fields(
    extra: dict[str, Any], expected: dict[str, Any]
) -> None:
    line = json.loads(JsonFormatter().format(record(**extra)))
    assert line.pop("ts").endswith("+00:00")
    assert line == {
        "level": "info",
        "logger": "bernard.worker",
        "message": "turn ended",
        **expected,
    }


@pytest.mark.parametrize(
    ("message", "secrets", "expected"),
    [
        ("key sk-abcdef1 used", ("sk-abcdef1",), "key [redacted] used"),
        ("two sk-abcdef1 sk-abcdef1", ("sk-abcdef1",), "two [redacted] [redacted]"),
        ("longest first: sk-abcdef1xyz", ("sk-abcdef1xyz", "sk-abcdef1"), "[redacted]"),
        ("nothing here", ("sk-abcdef1",), "nothing here"),
    ],
)
def test_every_known_secret_is_replaced_in_both_formats(
    message: str, secrets: tuple[str, ...], expected: str
) -> None:
    as_json = json.loads(JsonFormatter(secrets).format(record(message)))
    assert expected in as_json["message"]
    assert expected in TextFormatter(secrets).format(record(message))


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("plain text", "plain text"),
        ("\x1b[31mred\x1b[0m", "\\u001b[31mred\\u001b[0m"),
        ("one\ntwo\rthree\tfour", "one\\ntwo\\rthree\\tfour"),
        ("back\x08 feed\x0c", "back\\b feed\\f"),
        ("nul\x00 bell\x07 del\x7f", "nul\\u0000 bell\\u0007 del\\u007f"),
        ("c1 csi\x9b2J nel\x85", "c1 csi\\u009b2J nel\\u0085"),
        ("küche ٣ ✓ \xa0", "küche ٣ ✓ \xa0"),  # printable, whatever the script
        ("a\\u001b", "a\\u001b"),  # a backslash as such is left as it is
    ],
)
def test_control_characters_are_escaped_as_json_spells_them(text: str, escaped: str) -> None:
    assert escape_controls(text) == escaped


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_control_characters_from_a_request_path_never_reach_a_log_line_raw(
    upstream: ScriptedUpstream, log_format: str
) -> None:
    """A path is the client's: ESC would drive the operator's terminal (here: clear it),
    and a newline would forge a line of its own."""
    settings = make_settings(upstream, log_format=log_format)
    stream = io.StringIO()
    handler = log_handler(settings, stream)
    logger = logging.getLogger("bernard")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        async with run_stack(settings, worker=False) as stack:
            path = "/v1/x%1B%5B2J%C2%9B%0D%0A2026-01-01 INFO forged"
            assert (await stack.client.get(path)).status_code == 404
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    (line,) = [line for line in stream.getvalue().splitlines() if "forged" in line]
    assert not any(c in line for c in "\x1b\x9b\r")
    if log_format == "json":
        assert "\\u001b[2J\\u009b\\r\\n2026" in line
        assert json.loads(line)["path"] == "/v1/x\x1b[2J\x9b\r\n2026-01-01 INFO forged"
    else:
        assert 'path="/v1/x\\u001b[2J\\u009b\\r\\n2026-01-01 INFO forged"' in line


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("GET https://u:pa55@h/x failed", "GET https://u:***@h/x failed"),
        ("POST http://h/v1?api_key=k3y&m=1 took 3 ms", "POST http://h/v1?api_key=***&m=1 took"),
        ("at redis://:hunter2@10.0.0.5:6379/0", "at redis://:***@10.0.0.5:6379/0"),
    ],
)
def test_the_credentials_of_any_url_in_a_line_are_hidden_in_both_formats(
    message: str, expected: str
) -> None:
    """Whoever logs a URL (httpx, a library, an exception's message): the formatter hides
    what is in its userinfo and its credential parameters."""
    as_json = json.loads(JsonFormatter().format(record(message)))
    assert expected in as_json["message"]
    assert expected in TextFormatter().format(record(message))


async def test_a_workers_start_line_names_its_upstream_without_the_credentials_in_its_url(
    upstream: ScriptedUpstream,
) -> None:
    base = upstream.base_url.replace("://", "://bernard:url-pa55w0rd@", 1)
    settings = make_settings(upstream, openai_base_url=f"{base}?api_key=url-qu3ry-key")
    with captured(settings) as lines:
        async with run_worker(settings):
            pass
    (ready,) = [line for line in lines.all() if "ready: router" in line["message"]]
    assert "://bernard:***@127.0.0.1" in ready["message"]
    assert "?api_key=***" in ready["message"]
    assert "url-pa55w0rd" not in lines.text and "url-qu3ry-key" not in lines.text


def test_secrets_are_every_key_token_and_password_the_settings_hold() -> None:
    settings = Settings(
        redis_url="redis://:hunter2-redis@127.0.0.1:6379/0",
        openai_base_url="https://proxy-user:proxy-pa55@llm.lan/v1",
        openai_api_key="sk-openai-123",
        anthropic_api_key="sk-ant-456",
        api_keys="bernard-key-1:alice,bernard-key-2:bob,abc:carol",
    )
    environ = {"OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=otlp-secret-1,short=ab"}
    assert set(secrets_of(settings, environ)) == {
        "hunter2-redis",
        "proxy-pa55",
        "sk-openai-123",
        "sk-ant-456",
        "bernard-key-1",
        "bernard-key-2",
        "otlp-secret-1",
    }  # "abc" and "ab" are too short to look for


class LockerSettings(SourceSettings):
    """A tool source as a new one declares its settings, in its own module: nothing in
    shared/ names it, and its secret is marked only by its type."""

    locker_url: str | None = Field(None, alias="BERNARD_TEST_LOCKER_URL")
    locker_key: SecretStr | None = Field(None, alias="BERNARD_TEST_LOCKER_KEY")
    locker_shelf: str = Field("hall-cupboard-7", alias="BERNARD_TEST_LOCKER_SHELF")


async def test_the_secrets_tool_sources_declare_are_hidden_once_the_worker_starts(
    upstream: ScriptedUpstream,
) -> None:
    """The worker hands the logs what each source's settings declare secret (a `SecretStr`
    field, the credentials inside a URL field); shared/logs.py lists none of them."""
    settings = make_settings(upstream)
    tool_settings = ToolSettings(
        [
            HomeAssistantSettings(_env_file=None, ha_url="http://ha.lan:8123", ha_token=HA_TOKEN),
            LockerSettings(
                _env_file=None,
                locker_url="https://keeper:locker-url-pass@locker.lan/?token=locker-query-tok",
                locker_key="locker-key-3141",
            ),
        ]
    )
    with captured(settings) as lines:
        async with run_worker(settings, tool_settings=tool_settings):
            logging.getLogger("bernard.test").info(
                "reached %s with %s, then %s and %s and %s on %s",
                "the locker",
                "locker-key-3141",
                HA_TOKEN,
                "locker-url-pass",
                "locker-query-tok",
                "hall-cupboard-7",
            )
    (line,) = [line for line in lines.all() if line["logger"] == "bernard.test"]
    assert line["message"] == (
        f"reached the locker with {REDACTED}, then {REDACTED} and {REDACTED} and {REDACTED} "
        "on hall-cupboard-7"
    )


def test_a_secret_handed_over_later_is_hidden_by_a_formatter_made_before() -> None:
    """Merged with the formatter's own, longest first: the longer secret that holds one of
    the formatter's is hidden whole, not left with its tail showing."""
    formatter = JsonFormatter(["own-secret-1"])
    hide_in_logs(["own-secret-1-and-more", "tiny"])
    line = json.loads(formatter.format(record("own-secret-1-and-more, own-secret-1, tiny")))
    assert line["message"] == f"{REDACTED}, {REDACTED}, tiny"  # "tiny" is too short to hide


def test_a_text_line_appends_the_fields_as_key_value() -> None:
    line = TextFormatter().format(
        record("model call", turn_id="t1", latency_ms=12.345, error=None, note="two words")
    )
    assert line.endswith(
        'bernard.worker: model call turn_id=t1 latency_ms=12.3 error=null note="two words"'
    )


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize(
    ("configured", "tty", "expected"),
    [
        (None, True, "text"),
        (None, False, "json"),
        ("json", True, "json"),
        ("text", False, "text"),
    ],
)
def test_the_format_is_text_on_a_terminal_and_json_elsewhere_unless_set(
    configured: str | None, tty: bool, expected: str
) -> None:
    settings = Settings(log_format=configured)  # type: ignore[arg-type]
    assert log_format(settings, _Stream(tty)) == expected


def test_the_format_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BERNARD_LOG_FORMAT", "json")
    monkeypatch.setenv("BERNARD_LOG_PROMPTS", "1")
    settings = Settings()
    assert (settings.log_format, settings.log_prompts) == ("json", True)


@contextlib.contextmanager
def unconfigured_logging() -> Iterator[None]:
    """Bernard's logger as a fresh process has it (no handler, propagating); it and the
    loggers `configure_logging` takes over (arq's, uvicorn's) are restored afterwards."""
    saved = {
        name: (logger.handlers[:], logger.level, logger.propagate)
        for name in ("bernard", "arq", "uvicorn", "uvicorn.access")
        for logger in [logging.getLogger(name)]
    }
    bernard = logging.getLogger("bernard")
    bernard.handlers.clear()
    bernard.propagate = True
    try:
        yield
    finally:
        for name, (handlers, level, propagate) in saved.items():
            logger = logging.getLogger(name)
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate = propagate


async def test_a_worker_built_with_its_own_settings_logs_in_their_format_not_the_environments(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BERNARD_LOG_FORMAT", "text")
    get_settings.cache_clear()  # the environment's settings now say text
    try:
        with unconfigured_logging():
            async with run_worker(make_settings(log_format="json")):
                pass
    finally:
        get_settings.cache_clear()  # read again, from the environment as the test leaves it
    lines = [line for line in capsys.readouterr().err.splitlines() if "Bernard worker" in line]
    assert lines, "the worker logged no ready line"
    assert lines[0].startswith("{"), lines[0]
    ready = json.loads(lines[0])
    assert ready["logger"] == "bernard.worker"
    assert ready["message"].startswith("Bernard worker")


# -- traces ------------------------------------------------------------------------------------


def by_name(finished: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in finished if span.name == name]


async def wait_for_span(exporter: InMemorySpanExporter, name: str, count: int = 1) -> None:
    for _ in range(1000):
        if len(by_name(exporter.get_finished_spans(), name)) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"fewer than {count} {name!r} spans")


async def test_a_turns_spans_join_the_api_requests_trace(
    upstream: ScriptedUpstream, spans: InMemorySpanExporter
) -> None:
    settings = secret_settings(upstream)
    async with run_stack(settings) as stack:
        turn_id = (await tool_turn(stack, upstream))["turn_id"]
        await wait_for_span(spans, "invoke_agent bernard")
        await wait_for_span(spans, "POST /v1/chat/completions")
    finished = spans.get_finished_spans()

    (request,) = by_name(finished, "POST /v1/chat/completions")
    assert request.kind is SpanKind.SERVER and request.parent is None
    assert request.attributes is not None
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["bernard.turn_id"] == turn_id
    assert request.attributes["enduser.id"] == settings.api_key_users()[USER_KEY]
    trace_id = request.context.trace_id

    (wait,) = by_name(finished, "bernard.queue_wait")
    (turn,) = by_name(finished, "invoke_agent bernard")
    for span in (wait, turn):
        assert span.context.trace_id == trace_id
        assert span.parent is not None and span.parent.span_id == request.context.span_id
    assert wait.end_time is not None and turn.start_time is not None
    assert wait.end_time <= turn.start_time + 1_000_000  # the wait ends as the turn starts
    assert turn.attributes is not None and turn.attributes["bernard.turn.status"] == "completed"
    assert turn.attributes["gen_ai.usage.output_tokens"] == sum(
        (span.attributes or {})["gen_ai.usage.output_tokens"]  # type: ignore[misc]
        for span in finished
        if span.name.startswith("chat ")
    )

    router = by_name(finished, "chat router-model")
    (response,) = by_name(finished, "chat response-model")
    (tool,) = by_name(finished, "execute_tool calculator")
    assert len(router) == 2
    for span in (*router, response, tool):
        assert span.context.trace_id == trace_id
        assert span.parent is not None and span.parent.span_id == turn.context.span_id
        assert span.status.status_code is not StatusCode.ERROR
    assert response.attributes is not None
    assert response.attributes["gen_ai.operation.name"] == "chat"
    assert response.attributes["gen_ai.request.model"] == "response-model"
    assert response.attributes["gen_ai.usage.input_tokens"] == 21
    assert response.attributes["gen_ai.usage.output_tokens"] == 8
    assert response.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert response.attributes["bernard.stage"] == "response"
    assert tool.attributes is not None and tool.attributes["gen_ai.tool.name"] == "calculator"

    every_value = json.dumps(
        [dict(span.attributes or {}) for span in finished], default=str
    ) + json.dumps([[dict(e.attributes or {}) for e in span.events] for span in finished])
    for leak in (PROMPT, EXPRESSION, ANSWER, USER_KEY, UPSTREAM_KEY):
        assert leak not in every_value


async def test_with_log_prompts_the_spans_hold_the_prompt_and_arguments(
    upstream: ScriptedUpstream, spans: InMemorySpanExporter
) -> None:
    async with run_stack(secret_settings(upstream, log_prompts=True)) as stack:
        await tool_turn(stack, upstream)
        await wait_for_span(spans, "invoke_agent bernard")
    finished = spans.get_finished_spans()
    router = by_name(finished, "chat router-model")[0]
    assert router.attributes is not None
    assert PROMPT in str(router.attributes["gen_ai.input.messages"])
    (tool,) = by_name(finished, "execute_tool calculator")
    assert tool.attributes is not None
    assert EXPRESSION in str(tool.attributes["gen_ai.tool.call.arguments"])
    assert tool.attributes["gen_ai.tool.call.result"] == "7006652"


async def test_a_failed_model_call_is_an_error_span_and_so_is_its_turn(
    upstream: ScriptedUpstream, spans: InMemorySpanExporter
) -> None:
    async with run_stack(secret_settings(upstream)) as stack:
        upstream.script(Reply.error(500, "overloaded"))
        response = await chat(stack, "hello")
        assert response.status_code == 502
        await wait_for_span(spans, "invoke_agent bernard")
    finished = spans.get_finished_spans()
    (call,) = by_name(finished, "chat response-model")
    (turn,) = by_name(finished, "invoke_agent bernard")
    for span in (call, turn):
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes is not None and span.attributes["error.type"] == "upstream_error"


def test_a_turn_record_carries_its_traceparent_through_redis() -> None:
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    made = TurnRecord(
        id="t1",
        owner="alice",
        request=TurnRequest(AgentRequest([])),
        model="bernard-v1",
        traceparent=traceparent,
    )
    raw = {
        k.encode(): v if isinstance(v, bytes) else v.encode() for k, v in made.to_redis().items()
    }
    assert TurnRecord.from_redis(raw).traceparent == traceparent
    untraced = TurnRecord(id="t2", owner="a", request=TurnRequest(AgentRequest([])), model="m")
    assert "traceparent" not in untraced.to_redis()


def test_a_traceparent_names_the_parent_of_the_spans_started_under_it() -> None:
    from opentelemetry.trace import get_current_span

    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    parent = get_current_span(traces.parent_context(traceparent)).get_span_context()
    assert (parent.trace_id, parent.span_id) == (
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
    )
    for missing in (None, "", "not-a-traceparent"):
        assert not get_current_span(traces.parent_context(missing)).get_span_context().is_valid


async def test_without_an_otlp_endpoint_nothing_is_set_up_and_turns_carry_no_traceparent(
    upstream: ScriptedUpstream,
) -> None:
    settings = secret_settings(upstream)
    assert settings.otel_exporter_otlp_endpoint is None
    assert traces.configure_tracing(settings, "bernard-test") is False
    assert traces.tracer() is None and traces.current_traceparent() is None
    async with run_stack(settings) as stack:
        turn_id = (await tool_turn(stack, upstream))["turn_id"]
        record = await TurnStore(stack.redis, retention_s=60, stream_maxlen=100).get(turn_id)
    assert record is not None and record.traceparent is None


async def test_an_otlp_endpoint_gets_every_processs_spans_over_otlp_http(
    upstream: ScriptedUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collector on loopback, reading OTLP/HTTP's protobuf: what `./run` sends to one."""
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    received: list[tuple[str, ExportTraceServiceRequest]] = []

    async def export(request: Request) -> Response:
        parsed = ExportTraceServiceRequest()
        parsed.ParseFromString(await request.body())
        received.append((request.url.path, parsed))
        return Response(b"", media_type="application/x-protobuf")

    def exported(attribute: str) -> set[str]:
        return {
            getattr(span, attribute)
            for _, request in received
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        }

    collector = Starlette(routes=[Route("/{path:path}", export, methods=["POST"])])
    async with serve(collector, lifespan="off") as port:
        endpoint = f"http://127.0.0.1:{port}/"
        settings = secret_settings(upstream, otel_exporter_otlp_endpoint=endpoint)
        assert traces.configure_tracing(settings, "bernard-test") is True
        assert traces.configure_tracing(settings, "bernard-test") is False  # one per process
        try:
            async with run_stack(settings) as stack:
                await tool_turn(stack, upstream)
                for _ in range(500):
                    # The exporter posts from its own thread: the loop must stay free to answer.
                    await asyncio.to_thread(traces.flush_tracing)
                    if {"invoke_agent bernard", "POST /v1/chat/completions"} <= exported("name"):
                        break
                    await asyncio.sleep(0.01)
        finally:
            provider = traces._provider
            traces.install(None)
            if provider is not None:
                await asyncio.to_thread(provider.shutdown)
    assert {path for path, _ in received} == {"/v1/traces"}
    names = exported("name")
    assert {"bernard.queue_wait", "chat router-model", "execute_tool calculator"} <= names
    assert len(exported("trace_id")) == 1  # one turn, one trace, across both processes
    services = {
        attribute.value.string_value
        for _, request in received
        for resource in request.resource_spans
        for attribute in resource.resource.attributes
        if attribute.key == "service.name"
    }
    assert services == {"bernard-test"}


def test_the_queue_role_and_sentinel_passwords_are_secrets_too() -> None:
    settings = Settings(
        redis_url="redis+sentinel://:data-pass-1@s1:26379,s2:26379/bernard?sentinel_password=sent-pass-2",
        queue_redis_url="redis://:queue-pass-3@127.0.0.1:6380/0",
    )
    assert {"data-pass-1", "sent-pass-2", "queue-pass-3"} <= set(secrets_of(settings, {}))
