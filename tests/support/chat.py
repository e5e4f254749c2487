"""The Chat Completions request body the end-to-end tests send to POST /v1/chat/completions."""

from __future__ import annotations

from typing import Any


def body(content: str = "hello", **extra: Any) -> dict[str, Any]:
    """A request for bernard-v1 with one user message; `extra` adds or replaces top-level fields."""
    return {"model": "bernard-v1", "messages": [{"role": "user", "content": content}], **extra}
