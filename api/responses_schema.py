"""The body of `POST /v1/responses` (api/routes/responses.py), checked as OpenAI checks it.

Unlike the chat body (api/schemas.py), a field Bernard does not know is a 400 naming it: a
Responses client that sends `reasoning` or `include` would otherwise believe it honoured.
Built-in tool types (`web_search`, `file_search`, ...) are refused by name; Bernard's own
tools are always offered, and the client's `function` tools go to the router beside them
(shared/requests.py `AgentRequest.client_tools`).

`input` is a string (one user message) or items: messages (`input_text` / `output_text`
parts or a string), `function_call` and `function_call_output` (the client's own tools'
round trip, turned into Chat Completions' assistant `tool_calls` and `tool` messages), and
`mcp_approval_response` (a decision on a call Bernard proposed: api/responses_domain.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.errors import invalid
from api.limits import (
    MAX_DESCRIPTION_CHARS,
    MAX_ID_CHARS,
    MAX_INT32,
    MAX_NAME_CHARS,
    RequestSize,
    is_function_name,
)
from shared.client_tools import MAX_TOOLS, RESPOND_TOOL_NAME
from shared.requests import MultitaskStrategy
from shared.settings import MODEL_ID, Settings
from shared.webhook_targets import URL_MAX_CHARS

_MAX_ITEMS = 1000
# OpenAI's limits on `metadata`: 16 pairs, keys up to 64 characters, values up to 512.
_METADATA_PAIRS, _METADATA_KEY, _METADATA_VALUE = 16, 64, 512
_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ConversationRef(_Strict):
    """`conversation` as an object: `{"id": ...}`."""

    id: str = Field(min_length=1, max_length=MAX_ID_CHARS)


class ResponsesRequest(_Strict):
    """`POST /v1/responses`."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"model": MODEL_ID, "input": "Hello!"},
                {"model": MODEL_ID, "input": "What is (2 + 3) * 4?", "stream": True},
            ]
        }
    )

    model: str = Field(MODEL_ID, max_length=MAX_NAME_CHARS, json_schema_extra={"enum": [MODEL_ID]})
    # The bound is on the items alone: a string's length is `check_limits`' to judge.
    input: str | Annotated[list[dict[str, Any]], Field(max_length=_MAX_ITEMS)]
    instructions: str | None = None
    stream: bool = False
    background: bool = False
    store: bool = True
    previous_response_id: str | None = Field(None, min_length=1, max_length=MAX_ID_CHARS)
    conversation: str | ConversationRef | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=MAX_INT32)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    metadata: dict[str, str] | None = Field(None, max_length=_METADATA_PAIRS)
    user: str | None = Field(None, max_length=MAX_NAME_CHARS)
    truncation: Literal["auto", "disabled"] = "disabled"
    parallel_tool_calls: bool = True
    tools: list[dict[str, Any]] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: str | dict[str, Any] | None = None
    # What OpenAI would add to the output (logprobs, encrypted reasoning...): none of it
    # exists here, so only an empty list is taken (the Agents SDK always sends one).
    include: list[str] | None = Field(None, max_length=0)
    # The output's format: only plain text.
    text: dict[str, Any] | None = None
    # Bernard's, as on Chat Completions: where to POST a background response's end instead
    # of BERNARD_WEBHOOK_URL, on an origin of BERNARD_WEBHOOK_ORIGINS (api/turn_service.py).
    webhook_url: str | None = Field(None, max_length=URL_MAX_CHARS)
    # Bernard's (LangGraph's name), as on Chat Completions: what this response does while
    # one runs in its conversation (None: BERNARD_MULTITASK_STRATEGY).
    multitask_strategy: MultitaskStrategy | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ResponsesRequest:
        if self.previous_response_id is not None and self.conversation is not None:
            raise invalid(
                "previous_response_id and conversation cannot both be given: a response "
                "continues the conversation its previous response is in",
                "previous_response_id",
            )
        if not self.store and self.conversation is not None:
            # A response in a conversation is added to it: stored, whatever `store` says.
            raise invalid(
                "a response with store: false is kept in no conversation: drop "
                "conversation, or send store: true",
                "store",
            )
        kind = ((self.text or {}).get("format") or {}).get("type", "text")
        if kind != "text" or set(self.text or {}) - {"format"}:
            raise invalid("only a text format of the output is supported", "text")
        if self.background and not self.store:
            # As OpenAI refuses it: a background response is polled, so it must be kept.
            raise invalid("a background response must be stored (store: true)", "background")
        for key, value in (self.metadata or {}).items():
            if len(key) > _METADATA_KEY or len(value) > _METADATA_VALUE:
                raise invalid(
                    f"metadata keys may have {_METADATA_KEY} characters and values "
                    f"{_METADATA_VALUE}",
                    "metadata",
                )
        return self

    @property
    def conversation_id(self) -> str | None:
        if isinstance(self.conversation, ConversationRef):
            return self.conversation.id
        return self.conversation

    def client_tools(self) -> list[dict[str, Any]]:
        """The client's function tools in Chat Completions' shape; any other type, a name
        given twice or the router's own `respond` is a 400 naming it (a name Bernard's own
        tools take is the route's to refuse: api/client_tools.py)."""
        tools = []
        seen: set[str] = set()
        for i, tool in enumerate(self.tools or ()):
            kind = tool.get("type")
            if kind != "function":
                raise invalid(
                    f"tool type {kind!r} is not supported: send function tools (Bernard's "
                    "own tools are always offered)",
                    f"tools[{i}].type",
                )
            name = tool.get("name")
            if not is_function_name(name):
                raise invalid(
                    "a function tool's name is 1 to 64 letters, digits, _ or -",
                    f"tools[{i}].name",
                )
            if name in seen or name == RESPOND_TOOL_NAME:
                why = "is given twice" if name in seen else "is the router's own"
                raise invalid(f"tool name {name!r} {why}", f"tools[{i}].name")
            seen.add(name)
            unknown = sorted(set(tool) - {"type", "name", "description", "parameters", "strict"})
            if unknown:
                raise invalid(f"unknown field {unknown[0]!r} in a function tool", f"tools[{i}]")
            _check_function(tool, f"tools[{i}]")
            function: dict[str, Any] = {"name": name}
            for key in ("description", "parameters", "strict"):
                if tool.get(key) is not None:
                    function[key] = tool[key]
            tools.append({"type": "function", "function": function})
        return tools

    def chat_tool_choice(self) -> str | dict[str, Any] | None:
        """`tool_choice` in Chat Completions' shape (shared/requests.py); one naming no
        function given, or `required` without tools, is a 400."""
        choice = self.tool_choice
        names = {tool.get("name") for tool in self.tools or ()}
        if choice is None or choice in ("none", "auto"):
            return choice
        if choice == "required":
            if not names:
                raise invalid('tool_choice "required" needs function tools', "tool_choice")
            return choice
        if isinstance(choice, dict) and choice.get("type") == "function":
            name = choice.get("name")
            if isinstance(name, str) and name in names:
                return {"type": "function", "function": {"name": name}}
            raise invalid(f"tool_choice names no function given in tools: {name!r}", "tool_choice")
        raise invalid(
            'tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}',
            "tool_choice",
        )

    def items(self) -> list[dict[str, Any]]:
        """`input` as items (a string is one user message)."""
        if isinstance(self.input, str):
            return [{"type": "message", "role": "user", "content": self.input}]
        return self.input

    def check_limits(self, settings: Settings) -> None:
        """Refuse an input larger than the settings allow, naming what is over."""
        items = self.items()
        if not items:
            raise invalid("input must hold at least one item", "input")
        if len(items) > settings.max_messages:
            raise invalid(
                f"at most {settings.max_messages} input items may be sent "
                f"(BERNARD_MAX_MESSAGES); this request has {len(items)}",
                "input",
            )
        sizes = RequestSize(settings)
        # The instructions are a system message: bounded as one, counted with the rest.
        sizes.add(len(self.instructions or ""), "instructions", "the instructions")
        for i, item in enumerate(items):
            size = sum(len(v) for key in _SIZED for v in _strings(item.get(key)))
            calls = isinstance(item, dict) and item.get("type") == "function_call"
            sizes.add(size, f"input[{i}]", "an input item", int(calls))
        sizes.check("input", "the input", self.tools or [])


# What of an input item counts toward the message limits: its text, not its labels.
_SIZED = ("content", "arguments", "output")


def _check_function(tool: dict[str, Any], where: str) -> None:
    """A function tool's description and schema, as Chat Completions takes them
    (api/schemas.py `FunctionDefinition`)."""
    description = tool.get("description")
    if description is not None and (
        not isinstance(description, str) or len(description) > MAX_DESCRIPTION_CHARS
    ):
        raise invalid(
            f"a function tool's description is text of at most {MAX_DESCRIPTION_CHARS} characters",
            f"{where}.description",
        )
    if tool.get("parameters") is not None and not isinstance(tool["parameters"], dict):
        raise invalid(
            "a function tool's parameters are a JSON Schema object", f"{where}.parameters"
        )
    if tool.get("strict") is not None and not isinstance(tool["strict"], bool):
        raise invalid("a function tool's strict is true or false", f"{where}.strict")


def _check_call_id(call_id: Any, where: str, kind: str) -> None:
    if not isinstance(call_id, str) or not 1 <= len(call_id) <= MAX_ID_CHARS:
        raise invalid(f"a {kind} needs a call_id of at most {MAX_ID_CHARS} characters", where)


def _strings(value: Any) -> list[str]:
    """The text in an item's field: a string, or the `text` of its parts."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return _strings(value.get("text"))
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def message_text(item: dict[str, Any], where: str) -> str:
    """A message item's text: its string content, or its text parts joined."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid("a message needs content: a string or text parts", f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise invalid(
                f"content part type {kind!r} is not supported; send input_text",
                f"{where}.content[{j}].type",
            )
        texts.append(part["text"])
    return "".join(texts)


def chat_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as Chat Completions messages (what the worker runs on). Approval
    responses are not messages: the route takes them out first."""
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid("an input item must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise invalid(
                    f"a message's role must be one of {', '.join(_ROLES)}", f"{where}.role"
                )
            messages.append({"role": role, "content": message_text(item, where)})
        elif kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            arguments = item.get("arguments")
            _check_call_id(call_id, f"{where}.call_id", "function_call")
            if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_CHARS:
                raise invalid(
                    f"a function_call needs a name of at most {MAX_NAME_CHARS} characters",
                    f"{where}.name",
                )
            if not isinstance(arguments, str):
                raise invalid("a function_call's arguments are JSON text", f"{where}.arguments")
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
                last["tool_calls"].append(call)  # parallel calls: one assistant message
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            _check_call_id(call_id, f"{where}.call_id", "function_call_output")
            if isinstance(output, list):
                output = message_text({"content": output}, where)
            if not isinstance(output, str):
                raise invalid("a function_call_output's output is text", f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        else:
            raise invalid(f"input item type {kind!r} is not supported", f"{where}.type")
    return messages
