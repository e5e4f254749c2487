"""Request bodies, validated strictly but tolerant of fields real clients add.

Unknown fields are ignored (Open WebUI, LibreChat and the SDKs send `metadata`,
`cache_control`, `reasoning`, ...). Known fields are checked as the OpenAI API checks
them, shape and range, so nothing a worker cannot run gets past the API: numbers within
what the model API accepts, every message shape the API accepts (assistant `tool_calls`
included) and nothing else. Known fields with values Bernard cannot honour are refused with
a 400 naming the parameter. The size limits of one request (`check_limits`) come from the
settings.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.errors import invalid
from api.limits import (
    FUNCTION_NAME,
    MAX_DESCRIPTION_CHARS,
    MAX_ID_CHARS,
    MAX_INT32,
    MAX_NAME_CHARS,
    RequestSize,
    check_message_chars,
)
from shared.client_tools import MAX_TOOLS, RESPOND_TOOL_NAME, ChoiceMode, ToolChoice
from shared.requests import AgentRequest, Delivery, MultitaskStrategy, RunMode, TurnRequest
from shared.settings import MODEL_ID, Settings
from shared.webhook_targets import URL_MAX_CHARS

# What the model APIs take: a seed is 64-bit (the other bounds are api/limits.py's).
_MIN_INT64, _MAX_INT64 = -(2**63), 2**63 - 1
# OpenAI's own limit on stop sequences.
_MAX_STOP = 4


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class TextPart(_Body):
    """One part of a multi-part message content; only text is accepted."""

    type: str = Field(max_length=64)
    text: str | None = None


class FunctionCall(_Body):
    """The function an assistant's tool call named, with its arguments as JSON text."""

    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    arguments: str


class ToolCallItem(_Body):
    """One of an assistant message's `tool_calls`."""

    id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(_Body):
    """One message of the conversation, in OpenAI's shape."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = Field(None, max_length=MAX_NAME_CHARS)
    tool_call_id: str | None = Field(None, max_length=MAX_ID_CHARS)
    tool_calls: list[ToolCallItem] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text or "" for part in self.content)
        return self.content or ""


class FunctionDefinition(_Body):
    """A client tool's function: the model reads its name, description and schema."""

    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = Field(None, max_length=MAX_DESCRIPTION_CHARS)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ClientTool(_Body):
    """One of the request's `tools`: only `function` tools are taken (`_tools_make_sense`
    refuses another type by name, rather than pydantic's word for a mismatch)."""

    type: str = Field(max_length=64)
    function: FunctionDefinition | None = None


class NamedFunction(_Body):
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)


class NamedToolChoice(_Body):
    """`tool_choice` naming one function: `{"type": "function", "function": {"name"}}`."""

    type: str = Field(max_length=64)
    function: NamedFunction


class StreamOptions(_Body):
    """`stream_options`: OpenAI's `include_usage` plus Bernard's own choices."""

    include_usage: bool = False
    tool_events: Literal["bernard", "delta", "none"] = "bernard"
    trace: bool = False


class _TurnBody(_Body):
    # Any string validates (another model answers 404, as OpenAI does); the schema names
    # the one model there is, so generated clients and fuzzers send it.
    model: str = Field(max_length=MAX_NAME_CHARS, json_schema_extra={"enum": [MODEL_ID]})
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(None, ge=1, le=MAX_INT32)
    max_tokens: int | None = Field(None, ge=1, le=MAX_INT32)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    stop: str | list[str] | None = Field(None, max_length=_MAX_STOP)
    seed: int | None = Field(None, ge=_MIN_INT64, le=_MAX_INT64)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    user: str | None = Field(None, max_length=MAX_NAME_CHARS)
    logprobs: bool | None = None
    background: bool = False
    on_disconnect: Literal["cancel", "continue"] | None = None
    # Bernard's: where to POST a background turn's end instead of BERNARD_WEBHOOK_URL, on
    # an origin of BERNARD_WEBHOOK_ORIGINS (api/turn_service.py, shared/webhook_targets.py).
    webhook_url: str | None = Field(None, max_length=URL_MAX_CHARS)

    def check_honourable(self) -> None:
        """Refuse known parameters with values Bernard cannot honour."""
        if self.n not in (None, 1):
            raise invalid("only n=1 is supported", "n")
        if self.logprobs:
            raise invalid("logprobs are not supported", "logprobs")
        if self.background and not self.stream and self.on_disconnect == "cancel":
            raise invalid("a background turn always continues", "on_disconnect")

    def delivery(self, encoding: str) -> Delivery:
        """How the turn is delivered, in `encoding` (api/encodings/)."""
        options = self.stream_options or StreamOptions()
        return Delivery(
            encoding=encoding,
            # A background chat turn answers 202 at once, streamed or not (docs/api.md).
            stream=self.stream and not self.background,
            include_usage=options.include_usage,
            tool_events=options.tool_events,
            background=self.background,
            webhook_url=self.webhook_url,
            # A request nobody streams has nobody to lose: only a streaming client's
            # disconnect may stop the turn, and only when it did not ask to continue.
            on_disconnect="cancel"
            if self.stream and not self.background and self.on_disconnect != "continue"
            else "continue",
        )

    def agent_options(self) -> dict[str, Any]:
        """The options of the agent request (shared/requests.py `AgentRequest`)."""
        options = self.stream_options or StreamOptions()
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        return {
            "trace": options.trace,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stop": stop or None,
            "seed": self.seed,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "user": self.user,
        }


class ChatCompletionRequest(_TurnBody):
    """`POST /v1/chat/completions`."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"model": MODEL_ID, "messages": [{"role": "user", "content": "Hello!"}]},
                {
                    "model": MODEL_ID,
                    "messages": [{"role": "user", "content": "What is (2 + 3) * 4?"}],
                    "stream": True,
                    "stream_options": {"include_usage": True, "tool_events": "bernard"},
                },
            ]
        }
    )

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_INT32)
    response_format: dict[str, Any] | None = None
    # The client's own function tools, offered to the router beside Bernard's: a call of one
    # ends the turn with finish_reason "tool_calls" (shared/client_tools.py).
    tools: list[ClientTool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: str | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    conversation_id: str | None = Field(None, max_length=MAX_ID_CHARS)
    # Bernard's (LangGraph's name): what this message does while a turn runs on its
    # conversation (None: BERNARD_MULTITASK_STRATEGY; shared/conversation_state.py).
    multitask_strategy: MultitaskStrategy | None = None

    @model_validator(mode="after")
    def _messages_make_sense(self) -> ChatCompletionRequest:
        for i, message in enumerate(self.messages):
            if isinstance(message.content, list):
                for j, part in enumerate(message.content):
                    if part.type != "text":
                        raise invalid(
                            f"content part type {part.type!r} is not supported; send text",
                            f"messages[{i}].content[{j}].type",
                        )
            if message.role == "tool" and not message.tool_call_id:
                raise invalid("a tool message needs tool_call_id", f"messages[{i}].tool_call_id")
            if message.tool_calls is not None and message.role != "assistant":
                raise invalid(
                    "only an assistant message may carry tool_calls", f"messages[{i}].tool_calls"
                )
            if message.role in ("user", "system", "developer", "tool") and message.content is None:
                raise invalid(f"a {message.role} message needs content", f"messages[{i}].content")
        return self

    @model_validator(mode="after")
    def _tools_make_sense(self) -> ChatCompletionRequest:
        """Function tools only, each name once and none the router's own, and a
        `tool_choice` that asks for what `tools` holds. A clash with one of Bernard's tools
        is checked against the deployment's tools (api/client_tools.py)."""
        names: set[str] = set()
        for i, tool in enumerate(self.tools or ()):
            if tool.type != "function":
                raise invalid(
                    f"tool type {tool.type!r} is not supported; only function tools are",
                    f"tools[{i}].type",
                )
            if tool.function is None:
                raise invalid("a function tool needs its function", f"tools[{i}].function")
            name = tool.function.name
            if name == RESPOND_TOOL_NAME:
                raise invalid(
                    f"tool name {name!r} is the name of Bernard's router's own tool; "
                    "rename the tool",
                    f"tools[{i}].function.name",
                )
            if name in names:
                raise invalid(f"tool name {name!r} is given twice", f"tools[{i}].function.name")
            names.add(name)
        if names and self.stream_options and self.stream_options.tool_events == "delta":
            # Bernard's own calls would be among `delta.tool_calls`, and the client would
            # take them for calls of its tools.
            raise invalid(
                "stream_options.tool_events 'delta' cannot be used with tools: Bernard's own "
                "tool calls would read as the client's; use 'bernard' or 'none'",
                "stream_options.tool_events",
            )
        try:
            choice = ToolChoice.of(
                self.tool_choice.model_dump()
                if isinstance(self.tool_choice, NamedToolChoice)
                else self.tool_choice
            )
        except ValueError as exc:
            raise invalid(str(exc), "tool_choice") from exc
        if choice.mode in (ChoiceMode.REQUIRED, ChoiceMode.NAMED) and not names:
            raise invalid(f"tool_choice {choice.mode.value!r} needs tools", "tool_choice")
        if choice.name is not None and choice.name not in names:
            raise invalid(
                f"tool_choice names function {choice.name!r}, which is not in tools",
                "tool_choice.function.name",
            )
        return self

    def client_tools(self) -> list[dict[str, Any]]:
        """The request's tools as the router is offered them (shared/requests.py)."""
        return [
            {"type": "function", "function": tool.function.model_dump(exclude_none=True)}
            for tool in self.tools or ()
            if tool.function is not None
        ]

    def check_honourable(self) -> None:
        super().check_honourable()
        kind = (self.response_format or {}).get("type", "text")
        if kind != "text":
            raise invalid(f"response_format {kind!r} is not supported", "response_format.type")

    def check_limits(self, settings: Settings) -> None:
        """Refuse a request larger than the settings allow, naming what is over."""
        if len(self.messages) > settings.max_messages:
            raise invalid(
                f"at most {settings.max_messages} messages may be sent "
                f"(BERNARD_MAX_MESSAGES); this request has {len(self.messages)}",
                "messages",
            )
        sizes = RequestSize(settings)
        for i, message in enumerate(self.messages):
            calls = message.tool_calls or ()
            size = len(message.text()) + sum(len(call.function.arguments) for call in calls)
            sizes.add(size, f"messages[{i}].content", "a message", len(calls))
        sizes.check("messages", "the messages", self.client_tools())

    def to_turn(self) -> TurnRequest:
        options = self.agent_options()
        options["max_tokens"] = self.max_completion_tokens or self.max_tokens
        messages = [_as_dict(m) for m in self.messages]
        tool_choice = (
            self.tool_choice.model_dump()
            if isinstance(self.tool_choice, NamedToolChoice)
            else self.tool_choice
        )
        agent = AgentRequest(
            messages,
            client_tools=self.client_tools(),
            tool_choice=tool_choice,
            parallel_tool_calls=self.parallel_tool_calls is not False,
            **options,
        )
        return TurnRequest(agent, self.delivery("chat"))


class CompletionRequest(_TurnBody):
    """`POST /v1/completions` (legacy): a prompt instead of messages."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"model": MODEL_ID, "prompt": "Once upon a time"}]}
    )

    prompt: str | list[str] = Field(min_length=1)

    def check_limits(self, settings: Settings) -> None:
        """Refuse a prompt larger than one message may be."""
        check_message_chars(len(self._prompt()), settings, "prompt", "the prompt")

    def _prompt(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else "".join(self.prompt)

    def to_turn(self) -> TurnRequest:
        prompt = self._prompt()
        if not prompt:
            raise invalid("prompt must not be empty", "prompt")
        agent = AgentRequest(
            [{"role": "user", "content": prompt}], mode=RunMode.MODEL, **self.agent_options()
        )
        return TurnRequest(agent, self.delivery("completion"))


def _as_dict(message: ChatMessage) -> dict[str, Any]:
    """The message as LangChain's `convert_to_messages` reads it (developer → system)."""
    out: dict[str, Any] = {
        "role": "system" if message.role == "developer" else message.role,
        "content": message.text(),
    }
    if message.name:
        out["name"] = message.name
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        out["tool_calls"] = [call.model_dump() for call in message.tool_calls]
    return out
