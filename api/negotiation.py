"""Content negotiation: which of the media types a route can answer with the client's
`Accept` header prefers (RFC 9110, section 12.5.1).

The header is a list of media ranges (`text/event-stream`, `text/*`, `*/*`), each with an
optional weight `q` from 0 to 1 (1 when left out; 0 means "not this"). An offered type
takes the weight of the most specific range that matches it (a full type before `type/*`,
before `*/*`; the first listed among equals); a type no range matches has weight 0. The
answer is the offered type of the highest weight above 0, the route's first choice among
equals. When the header is absent, or accepts none of the offered types, the route answers
with its first choice, as RFC 9110 allows (rather than a 406 a client would not expect).

`Accept-Language` (RFC 9110, section 12.5.4) is read the same way (`language`): language
ranges with weights, of which Bernard keeps the primary subtag ("fr-CH" is French).

Types and parameter names are case-insensitive. A range's parameters other than `q` are
ignored (no offered type here has any), as are the extension parameters after `q`. A range
that cannot be read (no `/`, a `q` that is not a number from 0 to 1 with at most three
decimals) is skipped.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

__all__ = ["EVENT_STREAM", "JSON", "language", "negotiate"]

JSON = "application/json"
EVENT_STREAM = "text/event-stream"

_QVALUE = re.compile(r"0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")


@dataclass(frozen=True, slots=True)
class _Range:
    type: str
    subtype: str
    q: float

    def specificity(self, media_type: str) -> int:
        """How closely this range matches `media_type`: 2 exactly, 1 by `type/*`, 0 by
        `*/*`; -1 when it does not match."""
        kind, _, sub = media_type.partition("/")
        if self.type == "*":
            return 0 if self.subtype == "*" else -1
        if self.type != kind:
            return -1
        if self.subtype == "*":
            return 1
        return 2 if self.subtype == sub else -1


def _qvalue(params: Sequence[str]) -> float | None:
    """The weight a range's parameters give it: its first `q` (what follows are extension
    parameters), 1 without one, None when the `q` cannot be read."""
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            value = value.strip()
            return float(value) if _QVALUE.fullmatch(value) else None
    return 1.0


def _ranges(accept: str) -> list[_Range]:
    ranges: list[_Range] = []
    for element in accept.split(","):
        media_range, *params = (part.strip() for part in element.split(";"))
        kind, slash, sub = media_range.lower().partition("/")
        if not slash or not _TOKEN.fullmatch(kind) or not _TOKEN.fullmatch(sub):
            continue
        if kind == "*" and sub != "*":
            continue
        q = _qvalue(params)
        if q is not None:
            ranges.append(_Range(kind, sub, q))
    return ranges


def _weight(ranges: Sequence[_Range], media_type: str) -> float:
    best, weight = -1, 0.0
    for media_range in ranges:
        specificity = media_range.specificity(media_type)
        if specificity > best:
            best, weight = specificity, media_range.q
    return weight


def negotiate(accept: str | None, offered: Sequence[str]) -> str:
    """The one of `offered` (in the route's order of preference) that `accept` prefers."""
    if not accept or not accept.strip():
        return offered[0]
    ranges = _ranges(accept)
    weights = [_weight(ranges, media_type) for media_type in offered]
    best = max(weights)
    return offered[weights.index(best)] if best > 0 else offered[0]


_LANGUAGE_RANGE = re.compile(r"\*|[a-z]{1,8}(?:-[a-z0-9]{1,8})*")


def language(accept_language: str | None, known: Collection[str]) -> str | None:
    """The primary subtag of the `known` language `accept_language` prefers ("fr-CH, de;q=0.5"
    -> "fr"), None when it names none of them (the caller's default, then)."""
    best, weight = None, 0.0
    for element in (accept_language or "").split(","):
        tag, *params = (part.strip() for part in element.split(";"))
        tag = tag.lower()
        if not _LANGUAGE_RANGE.fullmatch(tag):
            continue
        q = _qvalue(params)
        primary = tag.split("-")[0]
        if q is not None and q > weight and primary in known:
            best, weight = primary, q
    return best
