"""The offline demo chat model, used when no upstream LLM is configured.

`DemoChatModel` is a real LangChain chat model, so the worker drives it exactly as it drives
`ChatOpenAI`: it streams token by token with usage, and with tools bound it acts as a tiny
keyword router. Its rules, first to last: "remember" / "forget" / "what do you remember" and
the household (timers; "turn on/off the ..." and the thermostat, which list Home Assistant's
entities first and then call the service on the entity whose name the words match, as a real
model is told to); then a tool the words name that has no rule here (a client's function
tool, an MCP server's: worker/demo_tools.py, with arguments from its schema), unless more of
the words name a tool that a later rule calls; then the weather, the time (in the zone the
question names, or that of the city it ends with: "in Tokyo"), a percentage of a number or
other arithmetic, a web search or Wikipedia. A forced `tool_choice` gets its tool with
arguments built the same way. With nothing to call it calls `respond`, or answers. Its
answers are deterministic, say what the tools returned in words for a person (a tool's
advice to the model, "call ha_list_entities for the ids", is left out), answer "What is my
name?" from the conversation and the user's notes, and say that Bernard is running on the
demo model. Asked for a conversation's title (shared/titles.py's prompt), it answers with
the first words of the first question.

It takes the call parameters a real model takes. A text answer honours `stop` (cut before the
first stop string, `finish_reason` "stop") and `max_tokens` (at most that many of its streamed
tokens, `finish_reason` "length" when cut); `temperature`, `top_p`, `seed`, the penalties and
`user` are accepted and ignored, and tool-call answers ignore them all.

It runs on the worker's event loop, so every scan of user text is linear in its length: a
question built to make a backtracking regex slow must not stall the other turns on the worker.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import LanguageModelInput
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
)
from langchain_core.messages.tool import tool_call, tool_call_chunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool

from shared.timers import TimerError, duration_in, parse_duration
from shared.titles import TITLE_PROMPT
from worker.demo_tools import COMMON, NamedTool, arguments, named_tool, singular, tool_name_of
from worker.tools.time import zone_for_place

__all__ = ["DEMO_NOTICE", "DemoChatModel"]

DEMO_NOTICE = (
    "(Bernard is running on its offline demo model; "
    "set OPENAI_BASE_URL and OPENAI_API_KEY to use a real LLM.)"
)

# Both run on user text and are linear in it: the words are fixed, and a zone name starts only
# at a region name and each of its two parts ends at the next "/" or character outside the
# class, so no character is read by more than two starts (the closing `\b` backs off only
# within a part).
_TIME_WORDS = re.compile(r"\b(?:time|date|clock)\b", re.IGNORECASE)
# Notes: anchored at the start of the question (`match`), so each scan is one pass.
_REMEMBER = re.compile(r"\s*(?:please\s+)?remember\s+(?:that\s+)?(?P<text>\S.*)", re.I | re.S)
_FORGET = re.compile(r"\s*(?:please\s+)?forget\s+(?:about\s+|that\s+)?(?P<match>\S.*)", re.I | re.S)
# Household questions. Each pattern is anchored at the start (`match`), or starts at a fixed
# word with a bounded repeat, so every scan is linear in the question.
_SET_TIMER = re.compile(r"\b(?:set|start)\s+(?:a\s+|the\s+|an?\s+)?timer\b", re.I)
_TIMER_LABEL = re.compile(
    r"\b(?:for|called|named)\s+(?:the\s+|my\s+)?(?P<label>[A-Za-z][A-Za-z ]{0,30})[.!?]?\s*$",
    re.I,
)
_LIST_TIMERS = re.compile(r"\b(?:my|the|list|which|what)\s+timers\b", re.I)
_CANCEL = re.compile(r"\b(?:cancel|stop)\b", re.I)
_TIMER_ID = re.compile(r"\btimer_[0-9a-f]{6,}\b")
_SWITCH = re.compile(
    r"\s*(?:please\s+)?(?:turn|switch)\s+(?P<state>on|off)\s+(?P<thing>[A-Za-z ]{1,40})", re.I
)
_TRAILING_LEVEL = re.compile(r"\s+(?:at|to)(?:\s.*)?$")  # on at most 40 characters
_PERCENT = re.compile(r"\b(?P<pct>\d{1,3})\s*%")
_THERMOSTAT = re.compile(r"\b(?:thermostat|heating)\b", re.I)
_DEGREES = re.compile(r"\b(?P<deg>\d{1,2}(?:\.\d)?)\s*(?:°|degrees?\b|c\b)", re.I)
_WEATHER = re.compile(
    r"\b(?:weather|forecast|rain(?:ing|y)?|snow(?:ing|y)?|sunny|umbrella)\b", re.I
)
_PLACE = re.compile(
    r"\b(?:in|for|at)\s+(?P<place>[A-Z][A-Za-z .'-]{0,40}?)"
    r"(?:\s+(?:today|tomorrow|this\s+week|(?:right\s+)?now))?[?.!]?\s*$",
)
_SEARCH = re.compile(
    r"\s*(?:please\s+)?(?:search(?:\s+the\s+web)?\s+for|look\s+up|google)\s+(?P<query>\S.*)",
    re.I | re.S,
)
_ENCYCLOPEDIA = re.compile(
    r"\s*(?:who\s+(?:is|was)|what\s+(?:is|are|was)|tell\s+me\s+about)\s+(?P<subject>\S.*)",
    re.I | re.S,
)
# "What is my name?": answered from the conversation and the notes, never looked up.
_MY_QUESTION = re.compile(
    r"\s*(?:what(?:'s|\s+is)|do\s+you\s+know|tell\s+me)\s+my\s+(?P<what>[A-Za-z]{1,30})\b", re.I
)
_WHO_AM_I = re.compile(r"\s*who\s+am\s+i\b", re.I)
_MY_STATEMENT = re.compile(
    r"\s*my\s+(?P<what>[A-Za-z]{1,30})\s+is\s+(?P<value>[^.!?\n,;]{1,60})", re.I
)
_CALL_ME = re.compile(r"\bcall\s+me\s+(?P<value>[A-Z][\w'-]{0,30})")
# One entity of ha_list_entities' list: "- light.kitchen_light “Kitchen Light”: off".
_LISTED = re.compile(r"^- (?P<id>[a-z0-9_]+\.[a-z0-9_]+)(?: “(?P<name>[^”\n]{0,80})”)?:", re.M)
_RECALL = re.compile(
    r"\bwhat\s+(?:did\s+i\s+ask\s+you\s+to|do\s+you)\s+remember\b|\bmy\s+notes\b",
    re.IGNORECASE,
)
_TIMEZONE = re.compile(
    r"\b(?:(?:Africa|America|Antarctica|Asia|Atlantic|Australia|Europe|Indian|Pacific|Etc)"
    r"/[A-Za-z_\-]+(?:/[A-Za-z_\-]+)?|UTC|GMT)\b",
    re.IGNORECASE,
)
# Arithmetic is found by a tokenizer and a scan rather than one regex: a regex for "number
# (operator number)+" backtracks through every digit of a long run at every start position, and
# "1" * 25_000 + "x" took half a minute. Every character is in exactly one token, and no
# alternative can back off past its own token, so tokenizing is one pass. The operators are
# the calculator tool's; "-" is a token of its own since it is also a sign.
_ARITHMETIC_TOKEN = re.compile(
    r"(?P<num>\d+)|(?P<minus>-)|(?P<op>\*\*|//|[+*/%])|(?P<open>\()|(?P<close>\))"
    r"|(?P<dot>\.)|(?P<space>\s+)|(?P<other>[^\d\s()+\-*/%.]+)"
)
_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
# "17.5 % of 2,340", "20 percent of 80": a share of a number, which the calculator's "%" (a
# remainder) is not. A number may group its thousands with commas. It starts only where a run
# of digits does and every repeat is possessive, so a start reads no character that the next
# number's start reads again but that number's digits: linear.
_SHARE_NUMBER = r"(?<![\d.,])\d++(?:,\d{3}+)*+(?:\.\d++)?+(?!\d|,\d)"
_PERCENT_OF = re.compile(
    rf"(?P<share>{_SHARE_NUMBER})\s*+(?:%|per\s*+cent\b)\s*+of\s++(?P<whole>{_SHARE_NUMBER})",
    re.IGNORECASE,
)
# One streamed token is a word with the whitespace before it. Found as `\S+` and sliced, since
# `\s*\S+` retries a whole whitespace run from each of its characters when no word follows.
_WORD = re.compile(r"\S+")
_WORDS = re.compile(r"[A-Za-z0-9]+")
# A name with an underscore, as tools' names are ("ha_list_entities", "files__read_file").
_TOOL_WORD = re.compile(r"\b[A-Za-z0-9]+(?:_+[A-Za-z0-9]+)+\b")
_TOKENS = re.compile(r"\w+|[^\w\s]")
_QUOTE_MAX_CHARS = 120
_PLACE_TAIL_CHARS = 80  # "for", a place of 41 characters, "this week", with room to spare
_TITLE_WORDS = 6
_BEFORE_THERMOSTAT_CHARS = 40
_LISTED_IN_ANSWER = 5

# The tools the rules here call (and Home Assistant's state reader, which they never need):
# a tool named otherwise is matched by its name's words (worker/demo_tools.py).
RULED = frozenset(
    {
        "respond",
        "save_note",
        "delete_note",
        "list_notes",
        "set_timer",
        "list_timers",
        "cancel_timer",
        "ha_list_entities",
        "ha_get_state",
        "ha_call_service",
        "weather",
        "get_time",
        "calculator",
        "web_search",
        "wikipedia",
    }
)
# The words for a kind of Home Assistant entity: "the kitchen light" is a light whose name
# says "kitchen"; "the fan" may be a fan or a switch whose name says "fan".
_DOMAIN_NOUNS = {
    "light": frozenset({"light", "lamp", "bulb"}),
    "fan": frozenset({"fan"}),
    "switch": frozenset({"switch", "plug", "socket"}),
    "climate": frozenset({"thermostat", "heating", "climate"}),
}


def _text(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    parts = (p if isinstance(p, str) else p.get("text", "") for p in content)
    return "".join(p for p in parts if isinstance(p, str))


def _count_tokens(text: str) -> int:
    # A rough stand-in for a tokenizer: words and punctuation marks.
    return len(_TOKENS.findall(text))


def _find_timezone(text: str) -> str:
    """The zone a question names: an IANA name, else the zone of the place it ends with
    ("in Tokyo" is Asia/Tokyo), else UTC."""
    match = _TIMEZONE.search(text)
    if match is None:
        place = _place(text)
        return (zone_for_place(place) if place else None) or "UTC"
    name = match.group(0)
    return name.upper() if name.upper() in {"UTC", "GMT"} else name


def _place(text: str) -> str | None:
    """The place a question ends with ("Will it rain in Paris tomorrow?"), if it does."""
    # Searched in the last characters only, where such an ending is: from every start the
    # pattern reads on to the end, and a long run of spaces read from each of a few dozen
    # place lengths took a second.
    text = text.rstrip()
    found = _PLACE.search(text, max(0, len(text) - _PLACE_TAIL_CHARS))
    return _clause(found["place"]) if found else None


def _find_percentage(text: str) -> str | None:
    """The first "X % of Y" (or "X percent of Y") in `text` as the calculator's arithmetic:
    "17.5 % of 2,340" is "17.5 * 2340 / 100"."""
    found = _PERCENT_OF.search(text)
    if found is None:
        return None
    share, whole = (_literal(found[name]) for name in ("share", "whole"))
    return f"{share} * {whole} / 100"


def _literal(number: str) -> str:
    """A number as written ("2,340", "007") as the calculator reads one ("2340", "7")."""
    digits = number.replace(",", "").lstrip("0")
    return f"0{digits}" if not digits or digits.startswith(".") else digits


def _find_expression(text: str) -> str | None:
    """The first arithmetic in `text`, as the calculator tool should get it, if there is any.

    That is the first run of numbers joined by operators, where a number is
    `(* -?digits(.digits)? )*` with optional whitespace after the "(" and before the ")",
    minus any parentheses at its ends that do not pair up. If that first run is an ISO date
    ("2024-01-05"), a date rather than a subtraction, there is none: later runs are not tried.
    """
    tokens = [
        (m.lastgroup or "other", m.start(), m.end()) for m in _ARITHMETIC_TOKEN.finditer(text)
    ]
    kinds = [kind for kind, _, _ in tokens]
    # Every run of digits may start the expression (so may the "5" of "1.5": "1.5.6+1" finds
    # "5.6+1"). A start that fails gives up before the digits of its next operand, so a token
    # is read by at most two failed starts (a number's and its fraction's) and the search is
    # linear; the start that succeeds reads on to its end and is the last.
    for first, kind in enumerate(kinds):
        if kind != "num":
            continue
        end = _number(kinds, first)
        if end is None or (end := _next_operand(kinds, end)) is None:
            continue
        while (more := _next_operand(kinds, end)) is not None:
            end = more
        start = _operand_start(kinds, first)
        expression = text[tokens[start][1] : tokens[end - 1][2]].strip()
        if _ISO_DATE.fullmatch(expression):
            return None
        return _trim_parentheses(expression)
    return None


def _operand_start(kinds: Sequence[str], first: int) -> int:
    """Where the operand whose digits are token `first` starts: back over `(* space? -?`."""
    start = first
    if start > 0 and kinds[start - 1] == "minus":
        start -= 1
    if start > 0 and kinds[start - 1] == "space":
        start -= 1
    while start > 0 and kinds[start - 1] == "open":
        start -= 1
    return start


def _number(kinds: Sequence[str], index: int) -> int | None:
    """Past `digits (. digits)? space? )*` at `index`, or None if it does not start with digits."""
    if index >= len(kinds) or kinds[index] != "num":
        return None
    index += 1
    if kinds[index : index + 2] == ["dot", "num"]:
        index += 2
    index = _skip(kinds, index, "space")
    while index < len(kinds) and kinds[index] == "close":
        index += 1
    return index


def _next_operand(kinds: Sequence[str], index: int) -> int | None:
    """Past `space? operator space? (* space? -? number` at `index`, or None if not there."""
    index = _skip(kinds, index, "space")
    if index >= len(kinds) or kinds[index] not in {"op", "minus"}:
        return None
    index = _skip(kinds, index + 1, "space")
    while index < len(kinds) and kinds[index] == "open":
        index += 1
    index = _skip(kinds, index, "space")
    return _number(kinds, _skip(kinds, index, "minus"))


def _skip(kinds: Sequence[str], index: int, kind: str) -> int:
    """Past one optional token of `kind` at `index`."""
    return index + 1 if index < len(kinds) and kinds[index] == kind else index


def _trim_parentheses(expression: str) -> str:
    """`expression` without the "(" it starts with or the ")" it ends with that pair with nothing.

    The number pattern takes every parenthesis next to a number, so "(what is 2+2)" finds
    "2+2)". Counted once and moved past by index: re-counting and re-slicing the string per
    parenthesis was quadratic in a run of them.
    """
    opens, closes = expression.count("("), expression.count(")")
    low, high = 0, len(expression)
    while opens > closes and expression.startswith("(", low, high):
        low, opens = low + 1, opens - 1
        while low < high and expression[low].isspace():
            low += 1
    while closes > opens and expression.endswith(")", low, high):
        high, closes = high - 1, closes - 1
        while high > low and expression[high - 1].isspace():
            high -= 1
    return expression[low:high]


def _split_tokens(text: str) -> list[str]:
    """The tokens the model streams `text` as: each word with the whitespace before it.

    Whitespace after the last word, which only a cut at a stop string leaves, is one more token,
    so the tokens always join back into `text`.
    """
    tokens: list[str] = []
    start = 0
    for word in _WORD.finditer(text):
        tokens.append(text[start : word.end()])
        start = word.end()
    if start < len(text):
        tokens.append(text[start:])
    return tokens


def _limit(text: str, stop: Sequence[str] | str | None, max_tokens: Any) -> tuple[str, str]:
    """`text` as a model with these `stop` strings and `max_tokens` returns it: (text, reason).

    As OpenAI does it: the answer ends before the first stop string, which is not included
    ("stop"), and if more than `max_tokens` tokens are left it ends after that many ("length").
    """
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    cut = len(text)
    for string in stops:
        # An empty stop string would match at once and leave nothing: it stops nothing.
        if string and 0 <= (found := text.find(string)) < cut:
            cut = found
    text = text[:cut]
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
        tokens = _split_tokens(text)
        if len(tokens) > max_tokens:
            return "".join(tokens[: max(max_tokens, 0)]), "length"
    return text, "stop"


def _forced_tool(tool_choice: Any) -> str | None:
    """The one tool a `tool_choice` names, if it names one."""
    if isinstance(tool_choice, dict):
        return str(tool_choice.get("function", {}).get("name") or tool_choice.get("name") or "")
    if isinstance(tool_choice, str) and tool_choice not in {"auto", "any", "required", "none"}:
        return tool_choice
    return None


class DemoChatModel(BaseChatModel):
    """A deterministic, offline chat model: a keyword tool router and a templated answer."""

    model_name: str = "bernard-demo"
    token_delay_s: float = 0.02
    """Pause between streamed tokens, so the demo visibly streams."""

    @property
    def _llm_type(self) -> str:
        return "bernard-demo"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name}

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools as OpenAI tool schemas, the same shape `ChatOpenAI` sends upstream."""
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def plan(
        self,
        messages: Sequence[BaseMessage],
        stop: Sequence[str] | str | None = None,
        **kwargs: Any,
    ) -> AIMessage:
        """The whole answer to `messages` as one message: tool calls, or text with usage.

        `stop` and `kwargs["max_tokens"]` cut a text answer as they would a real model's;
        the other call parameters (`temperature`, `seed`, ...) are accepted and ignored.
        """
        tool_calls = self._route(messages, kwargs.get("tools") or [], kwargs.get("tool_choice"))
        if tool_calls:
            content = ""
            finish_reason = "tool_calls"
            output_tokens = sum(3 + _count_tokens(json.dumps(c["args"])) for c in tool_calls)
        else:
            content, finish_reason = _limit(self._answer(messages), stop, kwargs.get("max_tokens"))
            output_tokens = len(_split_tokens(content))
        input_tokens = sum(4 + _count_tokens(_text(m)) for m in messages)
        return AIMessage(
            content=content,
            tool_calls=tool_calls,
            usage_metadata={
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "total_tokens": input_tokens + output_tokens,
            },
            response_metadata={
                "finish_reason": finish_reason,
                "model_name": self.model_name,
            },
        )

    def _route(
        self, messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]], tool_choice: Any
    ) -> list[ToolCall]:
        offered = {tool_name_of(t): t for t in tools}
        if not offered or tool_choice == "none":
            return []
        last_human = _last_human_index(messages)
        question = _text(messages[last_human]) if last_human is not None else ""
        later = messages[last_human + 1 :] if last_human is not None else []
        if any(isinstance(m, ToolMessage) for m in later):
            wanted = _follow_up(later, question)  # the tools have answered: what they lead to
        else:
            wanted = _calls_for(question, tools)
        wanted = [(name, args) for name, args in wanted if name in offered]
        forced = _forced_tool(tool_choice)
        if forced is not None and forced in offered:
            wanted = [w for w in wanted if w[0] == forced] or [(forced, None)]
        elif tool_choice in {"any", "required"} and not wanted:
            # A tool must be called: the one the words name best, else the first offered.
            found = named_tool(question, [t for n, t in offered.items() if n != "respond"])
            first = found.tool if found is not None else next(iter(offered.values()))
            wanted = [(tool_name_of(first), None)]
        elif not wanted and "respond" in offered:
            wanted = [("respond", {})]
        # Arguments a rule made that the tool's schema does not take (a client's tool named
        # like one of Bernard's) are made again from its schema.
        made = [
            (name, args if _fits(args, offered[name]) else _arguments_for(offered[name], question))
            for name, args in wanted
        ]

        # Ids continue the conversation's count, so they are unique and repeatable.
        seen = sum(len(m.tool_calls) for m in messages if isinstance(m, AIMessage))
        return [
            tool_call(name=name, args=args, id=f"call_demo_{seen + i + 1}")
            for i, (name, args) in enumerate(made)
        ]

    def _answer(self, messages: Sequence[BaseMessage]) -> str:
        if messages and _text(messages[0]) == TITLE_PROMPT:
            return _title(messages)
        last_human = _last_human_index(messages)
        if last_human is None:
            return f"Hello! I'm Bernard. {DEMO_NOTICE}"
        asked = _text(messages[last_human])
        question = " ".join(asked.split())
        if len(question) > _QUOTE_MAX_CHARS:
            question = question[: _QUOTE_MAX_CHARS - 1].rstrip() + "…"
        later = messages[last_human + 1 :]
        calls = {c["id"] or "": c for m in later if isinstance(m, AIMessage) for c in m.tool_calls}
        # Tool names, so that what a tool tells the model to do next is left out of the answer.
        names = RULED | {
            c["name"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls
        }
        command = _command(asked)
        results = [
            _summarize(m, calls.get(m.tool_call_id), names)
            for m in later
            if isinstance(m, ToolMessage)
            and (m.name or "") != "respond"
            # What the lookup found is said by the call it led to (or `_unmatched`).
            and not (command is not None and _called(m, calls) == "ha_list_entities")
        ]
        results = [r for r in results if r]
        looked_up = any(_called(m, calls) == "ha_list_entities" for m in later)
        called = {c["name"] for c in calls.values()}
        if command is not None and looked_up and "ha_call_service" not in called:
            results.append(_unmatched(command, _entities(later)))
        if results:
            body = " ".join(results)
        elif (recalled := _recall(messages[:last_human], asked)) is not None:
            body = recalled
        else:
            body = (
                "I can tell the time, do arithmetic and keep notes: try "
                '"What time is it in Europe/Paris?", "What is (2 + 3) * 4?" or '
                '"Remember that the door code is 1234".'
            )
        stop = "" if question.endswith((".", "?", "!", "…")) else "."
        return f'You said: "{question}"{stop} {body} {DEMO_NOTICE}'

    def _chunks(
        self, messages: list[BaseMessage], stop: list[str] | None, **kwargs: Any
    ) -> Iterator[ChatGenerationChunk]:
        message = self.plan(messages, stop, **kwargs)
        if message.tool_calls:
            for index, call in enumerate(message.tool_calls):
                args = json.dumps(call["args"])
                chunk = tool_call_chunk(name=call["name"], args=args, id=call["id"], index=index)
                yield ChatGenerationChunk(
                    message=AIMessageChunk(content="", tool_call_chunks=[chunk])
                )
        else:
            for token in _split_tokens(str(message.content)):
                yield ChatGenerationChunk(message=AIMessageChunk(content=token))
        last = AIMessageChunk(
            content="",
            usage_metadata=message.usage_metadata,
            response_metadata=message.response_metadata,
            chunk_position="last",
        )
        yield ChatGenerationChunk(message=last)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        message = self.plan(messages, stop, **kwargs)
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        # No I/O: answering inline beats the default hop to a thread.
        return self._generate(messages, stop, **kwargs)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        for i, chunk in enumerate(self._chunks(messages, stop, **kwargs)):
            if i and self.token_delay_s > 0:
                time.sleep(self.token_delay_s)
            yield chunk

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        for i, chunk in enumerate(self._chunks(messages, stop, **kwargs)):
            if i and self.token_delay_s > 0:
                await asyncio.sleep(self.token_delay_s)
            yield chunk


def _title(messages: Sequence[BaseMessage]) -> str:
    """A conversation's title (worker/titles.py): the first words of its first question."""
    exchange = _text(messages[-1]) if len(messages) > 1 else ""
    question = next(
        (line[len("user:") :] for line in exchange.splitlines() if line.startswith("user:")), ""
    )
    words = question.split()[:_TITLE_WORDS]
    title = " ".join(words).rstrip("?.!,;:")
    return title[:1].upper() + title[1:] if title else "Conversation"


def _last_human_index(messages: Sequence[BaseMessage]) -> int | None:
    for index in range(len(messages) - 1, -1, -1):
        if isinstance(messages[index], HumanMessage):
            return index
    return None


Wanted = list[tuple[str, dict[str, Any] | None]]


def _calls_for(question: str, tools: Sequence[dict[str, Any]]) -> Wanted:
    """The calls a new question asks for (the module's docstring gives the rules' order)."""
    offered = {tool_name_of(t) for t in tools}
    if _MY_QUESTION.match(question) or _WHO_AM_I.match(question):
        return []  # the conversation answers it (`_recall`)
    wanted: Wanted = []
    if (note := _REMEMBER.match(question)) is not None:
        wanted.append(("save_note", {"text": _clause(note["text"])}))
    elif (forget := _FORGET.match(question)) is not None:
        wanted.append(("delete_note", {"match": _clause(forget["match"])}))
    elif _RECALL.search(question):
        wanted.append(("list_notes", {}))
    wanted += _household(question)
    if wanted := [w for w in wanted if w[0] in offered]:
        return wanted
    found = named_tool(question, [t for t in tools if tool_name_of(t) not in RULED])
    # Unless more of the words name a tool of the rules below ("Search the web for ..." names
    # web_search by two words, plex_search by one), and those rules call something.
    ruled = named_tool(question, [t for t in tools if tool_name_of(t) in RULED])
    if found is not None and (ruled is None or ruled.words <= found.words):
        return _call_named(found, question)
    if _WEATHER.search(question):
        wanted.append(("weather", {"location": _place(question) or "Paris"}))
    if _TIME_WORDS.search(question):
        wanted.append(("get_time", {"timezone": _find_timezone(question)}))
    if (expression := _find_percentage(question) or _find_expression(question)) is not None:
        wanted.append(("calculator", {"expression": expression}))
    return (
        [w for w in wanted if w[0] in offered] or _lookup(question) or _call_named(found, question)
    )


def _call_named(found: NamedTool | None, question: str) -> Wanted:
    """The call of the tool the words name, with arguments from its schema, if they name one."""
    return [(tool_name_of(found.tool), arguments(found.tool, question, found))] if found else []


def _follow_up(later: Sequence[BaseMessage], question: str) -> Wanted:
    """What the tools' results since the question lead to: the Home Assistant call on the
    entity the words name, once ha_list_entities has listed them; else nothing."""
    command = _command(question)
    calls = {c["name"] for m in later if isinstance(m, AIMessage) for c in m.tool_calls}
    if command is None or "ha_call_service" in calls:
        return []
    entity = _pick(command, _entities(later))
    if entity is None:
        return []
    domain = entity.split(".", 1)[0]
    args: dict[str, Any] = {"domain": domain, "service": command.service, "entity_id": entity}
    if command.data and (domain == "light" or command.service != "turn_on"):
        args["data"] = command.data
    return [("ha_call_service", args)]


def _fits(args: dict[str, Any] | None, tool: dict[str, Any]) -> TypeGuard[dict[str, Any]]:
    """Whether the tool's schema takes `args`: each required property given, none unknown."""
    if args is None:
        return False
    schema = tool.get("function", tool).get("parameters") or {}
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return not args
    return set(schema.get("required") or []) <= args.keys() <= properties.keys()


def _arguments_for(tool: dict[str, Any], question: str) -> dict[str, Any]:
    """Arguments for `tool` from its schema, after the word that names it if one does."""
    return arguments(tool, question, named_tool(question, [tool]))


@dataclass(frozen=True, slots=True)
class _Command:
    """A household command: the kinds of entity it is for, the service, its options, and the
    words that say which entity ("kitchen light")."""

    domains: tuple[str, ...]
    service: str
    data: dict[str, Any]
    thing: str

    def words(self) -> list[str]:
        return [singular(w) for w in _WORDS.findall(self.thing) if w.lower() not in COMMON]


def _command(question: str) -> _Command | None:
    """The light, switch or thermostat command `question` is, if it is one."""
    if (switch := _SWITCH.match(question)) is not None:
        thing = _clause(switch["thing"]).lower().removeprefix("the ")
        thing = _TRAILING_LEVEL.sub("", thing)  # "kitchen light at 40%": the thing is before
        said = {singular(w) for w in thing.split()}
        if said & _DOMAIN_NOUNS["light"]:
            domains: tuple[str, ...] = ("light",)
        elif said & _DOMAIN_NOUNS["fan"]:
            domains = ("fan", "switch")
        else:
            domains = ("switch", "light")
        state = switch["state"].lower()
        data: dict[str, Any] = {}
        if state == "on" and (level := _PERCENT.search(question)):
            data["brightness_pct"] = int(level["pct"])
        return _Command(domains, f"turn_{state}", data, thing)
    named = _THERMOSTAT.search(question)
    if named is not None and (degrees := _DEGREES.search(question)) is not None:
        # The words just before "thermostat" say which ("the hall thermostat").
        before = question[max(0, named.start() - _BEFORE_THERMOSTAT_CHARS) : named.start()]
        which = [w for w in _WORDS.findall(before) if w.lower() not in COMMON][-2:]
        thing = " ".join([*which, named.group().lower()])
        return _Command(
            ("climate",), "set_temperature", {"temperature": float(degrees["deg"])}, thing
        )
    return None


def _household(question: str) -> Wanted:
    """Timers, and the lookup a light, switch or thermostat command starts with."""
    if _SET_TIMER.search(question):
        try:
            duration = f"{parse_duration(duration_in(question) or ''):g}s"
        except TimerError:
            duration = "5 minutes"
        label = _TIMER_LABEL.search(question)
        return [
            (
                "set_timer",
                {"duration": duration, "label": _clause(label["label"]) if label else "timer"},
            )
        ]
    if _CANCEL.search(question) and (timer := _TIMER_ID.search(question)) is not None:
        return [("cancel_timer", {"timer_id": timer.group(0)})]
    if _LIST_TIMERS.search(question):
        return [("list_timers", {})]
    command = _command(question)
    if command is not None:
        # The ids are Home Assistant's: listed first, never guessed from the words.
        return [("ha_list_entities", {"domain": domain}) for domain in command.domains]
    return []


@dataclass(frozen=True, slots=True)
class _Entity:
    entity_id: str
    name: str

    def words(self) -> set[str]:
        object_id = self.entity_id.split(".", 1)[1]
        return {singular(w) for w in _WORDS.findall(f"{object_id.replace('_', ' ')} {self.name}")}

    def label(self) -> str:
        return f"{self.name} ({self.entity_id})" if self.name else self.entity_id


def _entities(later: Sequence[BaseMessage]) -> list[_Entity]:
    """The entities ha_list_entities listed since the question, in its order."""
    listing = {
        c["id"]
        for m in later
        if isinstance(m, AIMessage)
        for c in m.tool_calls
        if c["name"] == "ha_list_entities"
    }
    found: dict[str, _Entity] = {}
    for message in later:
        if isinstance(message, ToolMessage) and message.tool_call_id in listing:
            for row in _LISTED.finditer(_text(message)):
                found.setdefault(row["id"], _Entity(row["id"], row["name"] or ""))
    return list(found.values())


def _pick(command: _Command, entities: Sequence[_Entity]) -> str | None:
    """The one entity the command's words name: every word but the kind's own ("light",
    "lamp") is in its id or its name; of several, the one that has the most of the words,
    then the fewest others. None when none is, when several are alike, or when the words
    name only the kind ("the light") and there are several of it."""
    said = command.words()
    scored: list[tuple[tuple[int, int], str]] = []
    only_the_kind = False
    for entity in entities:
        domain = entity.entity_id.split(".", 1)[0]
        if domain not in command.domains:
            continue
        has = entity.words()
        needed = [w for w in said if w not in _DOMAIN_NOUNS.get(domain, frozenset())]
        if all(w in has for w in needed):
            only_the_kind = only_the_kind or not needed
            scored.append(((sum(w in has for w in said), -len(has)), entity.entity_id))
    if not scored or (len(scored) > 1 and only_the_kind):
        return None
    scored.sort(reverse=True)
    if len(scored) > 1 and scored[0][0] == scored[1][0]:
        return None
    return scored[0][1]


def _lookup(question: str) -> Wanted:
    """Questions for the web or for Wikipedia (only when no other tool answers them)."""
    if (search := _SEARCH.match(question)) is not None:
        return [("web_search", {"query": _clause(search["query"])})]
    if (subject := _ENCYCLOPEDIA.match(question)) is not None:
        return [("wikipedia", {"query": _clause(subject["subject"])})]
    return []


def _clause(text: str) -> str:
    """What follows "remember" or "forget", without the sentence's end."""
    return " ".join(text.split()).rstrip(".!?")


def _called(result: BaseMessage, calls: dict[str, ToolCall]) -> str:
    """The name of the tool whose result `result` is."""
    call = calls.get(getattr(result, "tool_call_id", ""))
    return getattr(result, "name", None) or (call["name"] if call else "")


def _summarize(result: ToolMessage, call: ToolCall | None, names: frozenset[str] | set[str]) -> str:
    """One sentence about one tool result, for the templated answer; what a tool tells the
    model to do next (a clause that names a tool, "call ha_list_entities for the ids") is
    not for the person reading or hearing it, and is left out."""
    name = result.name or (call["name"] if call else "tool")
    args = call["args"] if call else {}
    if name == "weather":  # "Weather for Berlin, ...", then one line for now and one a day
        head, *lines = _text(result).splitlines() or [""]
        text = f"{head}: {'; '.join(lines)}" if lines else head
    else:
        text = _text(result)
    content = _for_a_person(" ".join(text.split()).rstrip("."), names)
    if result.status == "error" or content.startswith("Error"):
        return f"The {name} tool reported a problem: {content}."
    if content.startswith(("The user declined", "Not run")):
        return "As you decided, I did not do that."
    if name == "save_note":
        return f"I will remember: {args.get('text', content)}."
    if name == "list_notes":
        return f"Here is what you asked me to remember: {content}."
    if name == "get_time":
        return f"The time in {args.get('timezone', 'UTC')} is {content}."
    if name == "calculator" and "expression" in args:
        return f"The result of {args['expression']} is {content}."
    if name == "calculator":
        return f"The result is {content}."
    if name in ("weather", "ha_call_service"):
        return f"{content}."  # already a sentence for a person: "Weather for Paris ..."
    return f"The {name} tool returned: {content}."


def _for_a_person(text: str, names: frozenset[str] | set[str]) -> str:
    """`text` without its clauses (between "; ") that name a tool: the part of such a clause
    before its last ": " is kept ("the call may have run all the same")."""
    kept = []
    for clause in text.split("; "):
        named = [m.start() for m in _TOOL_WORD.finditer(clause) if m.group() in names]
        if not named:
            kept.append(clause)
        elif (colon := clause.rfind(": ", 0, named[0])) > 0:
            kept.append(clause[:colon])
    return "; ".join(kept)


def _unmatched(command: _Command, entities: Sequence[_Entity]) -> str:
    """Why the command ran on no entity, in words for a person."""
    kinds = [e for e in entities if e.entity_id.split(".", 1)[0] in command.domains]
    thing = " ".join(command.thing.split()) or "that"
    if not kinds:
        return f"I found nothing in Home Assistant for “{thing}”."
    shown = ", ".join(e.label() for e in kinds[:_LISTED_IN_ANSWER])
    more = f" and {len(kinds) - _LISTED_IN_ANSWER} more" if len(kinds) > _LISTED_IN_ANSWER else ""
    return f"I could not tell which one you mean by “{thing}”; Home Assistant has {shown}{more}."


def _recall(earlier: Sequence[BaseMessage], question: str) -> str | None:
    """The answer to "What is my name?" (or any "my ...") from what the user said earlier or
    asked to be remembered, the latest first; to "My name is Ann." that it is heard."""
    if (stated := _MY_STATEMENT.match(question)) is not None:
        what, value = stated["what"].lower(), _clause(stated["value"])
        return (
            f"Nice to meet you, {value}." if what == "name" else f"Noted: your {what} is {value}."
        )
    asked = _MY_QUESTION.match(question)
    what = asked["what"].lower() if asked is not None else None
    if what is None and _WHO_AM_I.match(question):
        what = "name"
    if what is None:
        return None
    said = re.compile(rf"\bmy\s+{re.escape(what)}\s+is\s+(?P<value>[^.!?\n,;]{{1,60}})", re.I)
    for message in reversed(earlier):
        if not isinstance(message, HumanMessage | SystemMessage):
            continue
        text = _text(message)
        found = [m["value"] for m in said.finditer(text)]
        if what == "name":
            found += [m["value"] for m in _CALL_ME.finditer(text)]
        if found:
            return f"Your {what} is {_clause(found[-1])}."
    return f"You have not told me your {what} yet."
