"""Counting tokens, to keep a prompt within the model's context (worker/harness/memory.py).

With an OpenAI model name and `tiktoken` able to load its encoding (installed, and its
files downloaded once or in `TIKTOKEN_CACHE_DIR`), counts are the tokenizer's own. Otherwise
they are an estimate that errs on the safe side: one token per three bytes of UTF-8 (English
averages about four characters a token; other scripts use more bytes per character, so
counting bytes keeps the estimate above the truth), plus a fixed overhead per message for
the role and separators, as OpenAI documents for its chat format.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

import orjson

logger = logging.getLogger("bernard.worker")

# Role, separators and the like: what OpenAI's cookbook counts for each chat message.
MESSAGE_OVERHEAD = 4

Encode = Callable[[str], int]


def estimate(text: str) -> int:
    """Tokens in `text` by the safe estimate (bytes / 3, rounded up)."""
    return math.ceil(len(text.encode("utf-8", "replace")) / 3)


@lru_cache(maxsize=32)
def counter_for(model: str) -> Encode:
    """The token count function for `model`: its tokenizer when one loads, else `estimate`."""
    try:
        import tiktoken

        encoding = tiktoken.encoding_for_model(model)
    except Exception as exc:  # not installed, unknown model, or its files cannot be fetched
        logger.info("counting tokens for %s by estimate (%s)", model, type(exc).__name__)
        return estimate
    return lambda text: len(encoding.encode(text, disallowed_special=()))


def message_tokens(message: Mapping[str, Any], count: Encode) -> int:
    """Tokens of one OpenAI-shaped message: its text, its tool calls, and the overhead."""
    content = message.get("content")
    text = content if isinstance(content, str) else orjson.dumps(content or "").decode()
    total = MESSAGE_OVERHEAD + count(text)
    for call in message.get("tool_calls") or ():
        function = call.get("function", {})
        total += count(str(function.get("name", ""))) + count(str(function.get("arguments", "")))
    return total
