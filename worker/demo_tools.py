"""How the offline demo model (worker/demo_model.py) calls a tool it has no rule of its own
for: a client's function tool, an MCP server's, any tool the question's words name, with
arguments made from the tool's JSON schema. Deterministic, and linear in the question.

- **Named.** A tool is named when a word of the question is a word of its name (split at
  `_`, `-`, `.` and camelCase; plurals count as the singular), leaving out the words that
  name no tool in particular (`COMMON`: "get", "set", "the", "what", ...). The tool with the
  most such words wins, then the one whose description shares more words with the question,
  then the first offered.
- **Arguments.** Each property of the schema, by its type: an enum takes the value the
  question names (else its default; a required one its first value); a number or an integer
  the next number written in digits (else a required one its default, its minimum or 0); a
  boolean, required, its default or false; a string, required, the next quoted phrase, else
  the words after the word that named the tool (to the sentence's end, without the common
  words at its ends), else the words just before it ("porch" in "the porch light"), else
  the question; an array or an object, required, empty.
  Optional strings, arrays and objects are left out.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "COMMON",
    "NamedTool",
    "arguments",
    "named_tool",
    "singular",
    "tool_name_of",
    "words_of_name",
]

# Words that name no tool in particular: question words, articles, pronouns, prepositions,
# and the verbs most tools' names start with.
_COMMON_WORDS = """
    a about after all also am an and any are as at be been before but by can could did do
    does for from get give go had has have he her here his how i if in into is it its just
    let like list make me my no not now of off on or our out over please run set shall she
    should show so some tell than that the their them then there these they this those to
    tool too turn under up us use want was we were what when where which who why will with
    would you your yes fetch find call query info data value current new one today
    tomorrow tonight
"""
COMMON = frozenset(_COMMON_WORDS.split())
_WORD = re.compile(r"[A-Za-z0-9]+")
# A name's parts: "get_weather", "HassTurnOn", "plex-now.playing", "files__read_file".
_NAME_PART = re.compile(r"[A-Z]{2,}(?![a-z])|[A-Z]?[a-z]+|[0-9]+|[A-Z]")
# A number in digits, not part of a word or of a dotted name ("v1.2", "notes2.txt").
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?!\w|\.\d)")
# A quoted phrase: in double or curly quotes, or in single quotes that start a word and end
# one (so the apostrophe of "what's" opens none). Each repeat is bounded.
_QUOTED = re.compile(
    r"\"(?P<double>[^\"\n]{1,200})\"|“(?P<curly>[^”\n]{1,200})”"
    r"|(?<![\w'])'(?P<single>[^'\n]{1,200})'(?![\w'])"
)
_EDGE = ".,;:!?()[]{}\"'“”‘’"
_TRIMMED = COMMON | {""}
_DESCRIPTION_CHARS = 300
_TEXT_CHARS = 200


def tool_name_of(tool: dict[str, Any]) -> str:
    """A tool's name in the OpenAI shape `bind_tools` gives (or a bare function's)."""
    return str(tool.get("function", {}).get("name") or tool.get("name") or "")


def _schema(tool: dict[str, Any]) -> dict[str, Any]:
    found = tool.get("function", tool).get("parameters")
    return found if isinstance(found, dict) else {}


def _description(tool: dict[str, Any]) -> str:
    return str(tool.get("function", tool).get("description") or "")[:_DESCRIPTION_CHARS]


def singular(word: str) -> str:
    """A word in lower case, as its singular when it looks like a plural ("lights")."""
    word = word.lower()
    if word.endswith(("ches", "shes", "sses", "xes")):
        return word[:-2]
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def words_of_name(name: str) -> frozenset[str]:
    """The words of a tool's name, as singulars ("files__read_file": files, read, file)."""
    return frozenset(p for p in (singular(p) for p in _NAME_PART.findall(name)) if len(p) > 1)


def _distinct_words(text: str) -> frozenset[str]:
    words = (singular(w) for w in _WORD.findall(text))
    return frozenset(w for w in words if w not in COMMON and len(w) > 1)


@dataclass(frozen=True, slots=True)
class NamedTool:
    """The tool the question names, where in the question the last word naming it starts
    and ends (the words around it say what the tool is asked about), and how many of the
    question's words not in `COMMON` name it."""

    tool: dict[str, Any]
    start: int
    end: int
    words: int


def named_tool(question: str, tools: Sequence[dict[str, Any]]) -> NamedTool | None:
    """The tool of `tools` the question's words name best, if any does: one of its name's
    words not in `COMMON` must be said; then the most such words win, then the most of its
    name's words ("set" in "Set the porch light"), then the most words shared with its
    description, then the first offered."""
    words = [(singular(m.group()), m.span()) for m in _WORD.finditer(question)]
    said = frozenset(w for w, _ in words)
    best: tuple[tuple[int, int, int, int], NamedTool] | None = None
    for order, tool in enumerate(tools):
        naming = words_of_name(tool_name_of(tool)) & said
        distinct = naming - COMMON
        if not distinct:
            continue
        shared = len(_distinct_words(_description(tool)) & said)
        score = (len(distinct), len(naming), shared, -order)
        if best is None or score > best[0]:
            start, end = max(span for word, span in words if word in distinct)
            best = (score, NamedTool(tool, start, end, len(distinct)))
    return best[1] if best is not None else None


def arguments(
    tool: dict[str, Any], question: str, named: NamedTool | None = None
) -> dict[str, Any]:
    """Arguments for `tool` from the question, by its schema (the module's docstring says
    how); `named` says where the word that named the tool is, if one did."""
    schema = _schema(tool)
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return {}
    required = set(schema.get("required") or [])
    words = frozenset(singular(w) for w in _WORD.findall(question))
    numbers = list(_NUMBER.finditer(question))
    used: list[tuple[int, int]] = []
    args: dict[str, Any] = {}
    strings: list[str] = []
    for name, given in properties.items():
        spec = _concrete(given)
        kind = spec.get("type")
        needed = name in required
        if isinstance(spec.get("enum"), list) and spec["enum"]:
            value = _enum(spec, words, needed)
            if value is not None:
                args[name] = value
        elif kind in ("integer", "number"):
            if numbers:
                number = numbers.pop(0)
                used.append(number.span())
                value = float(number.group())
                args[name] = int(value) if kind == "integer" or value.is_integer() else value
            elif needed:
                args[name] = spec.get("default", spec.get("minimum", 0))
        elif kind == "boolean" and needed:
            args[name] = bool(spec.get("default", False))
        elif kind == "string" and needed:
            strings.append(name)
            args[name] = ""  # in the schema's order; filled below
        elif kind == "array" and needed:
            args[name] = []
        elif kind == "object" and needed:
            args[name] = {}
    texts = _texts(question, named, used)
    for name in strings:
        args[name] = next(texts)
    return args


def _concrete(spec: Any) -> dict[str, Any]:
    """A property's schema, the first that is not null of an `anyOf` / `oneOf`."""
    if not isinstance(spec, dict):
        return {}
    for key in ("anyOf", "oneOf"):
        options = spec.get(key)
        if isinstance(options, list):
            for option in options:
                if isinstance(option, dict) and option.get("type") != "null":
                    return {**option, **{k: v for k, v in spec.items() if k != key}}
    return spec


def _enum(spec: dict[str, Any], words: frozenset[str], needed: bool) -> Any:
    for value in spec["enum"]:
        if isinstance(value, str) and singular(value) in words:
            return value
    if "default" in spec:
        return spec["default"]
    return spec["enum"][0] if needed else None


def _texts(question: str, named: NamedTool | None, used: list[tuple[int, int]]) -> Iterator[str]:
    """What required strings take, in turn: the quoted phrases, the words after the naming
    word, the words just before it, then the whole question (the numbers taken by other
    arguments left out of each); the last one again once all are taken."""
    text = _blank(question, used)
    phrases = list(_QUOTED.finditer(text))
    quoted = [next(g for g in m.groups() if g is not None) for m in phrases]
    # Taken by the first strings, not again by the others.
    text = _blank(text, [m.span() for m in phrases])
    found = [*quoted]
    if named is not None:
        found += [_trim(text[named.end :]), _just_before(text[: named.start])]
    found.append(_trim(text))
    kept = [t for t in found if t]
    last = kept[-1] if kept else question.strip()[:_TEXT_CHARS]
    yield from kept
    while True:
        yield last


def _just_before(text: str) -> str:
    """The words at the end of `text` up to the last common word ("How bright is the porch"
    -> "porch"): what the naming word that follows is about."""
    tokens = text.split()
    while tokens and tokens[-1].strip(_EDGE).lower() in _TRIMMED:
        tokens.pop()
    start = len(tokens)
    while start > 0 and tokens[start - 1].strip(_EDGE).lower() not in _TRIMMED:
        start -= 1
    return " ".join(tokens[start:]).strip(_EDGE)[:_TEXT_CHARS]


def _blank(text: str, spans: Sequence[tuple[int, int]]) -> str:
    """`text` with each of the (ordered, apart) `spans` made spaces, so offsets still hold."""
    parts: list[str] = []
    at = 0
    for start, stop in spans:
        parts += [text[at:start], " " * (stop - start)]
        at = stop
    return "".join([*parts, text[at:]])


def _trim(text: str) -> str:
    """`text` to its first sentence, without the common words and punctuation at its ends."""
    for stop in (". ", "? ", "! "):
        if stop in text.strip():
            text = text.strip().split(stop, 1)[0]
    tokens = text.split()
    start, end = 0, len(tokens)
    while start < end and tokens[start].strip(_EDGE).lower() in _TRIMMED:
        start += 1
    while end > start and tokens[end - 1].strip(_EDGE).lower() in _TRIMMED:
        end -= 1
    return " ".join(tokens[start:end]).strip(_EDGE)[:_TEXT_CHARS]
