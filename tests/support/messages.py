"""Chat messages in OpenAI's shape, as the tests write them into prompts and conversations."""

from __future__ import annotations

from typing import Any


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}
