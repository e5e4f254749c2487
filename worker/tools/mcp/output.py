"""What the model reads of an MCP tool's result, and what is kept beside it.

- Text blocks are the text, in order.
- Structured content is kept: as the text when the result has no text, after it when the
  text does not already say it (servers are asked to mirror it as JSON text, and the SDK's
  own wraps a plain value as `{"result": value}`), and whole in the artifact.
- Images, audio and binary resources are referenced (their type and size), never inlined:
  the model reads text. An embedded text resource is inlined up to `INLINE_RESOURCE_CHARS`,
  referenced beyond; a resource link is referenced.
- The whole is cut at `MAX_CHARS`, saying how much was left out, as every tool's output is
  bounded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mcp.types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

__all__ = ["INLINE_RESOURCE_CHARS", "MAX_CHARS", "Output", "render"]

MAX_CHARS = 20_000
INLINE_RESOURCE_CHARS = 4_000


@dataclass(frozen=True, slots=True)
class Output:
    """The text the model reads, and what the result held beyond it (`None`: nothing)."""

    text: str
    artifact: dict[str, Any] | None = None


def render(result: CallToolResult, *, max_chars: int = MAX_CHARS) -> Output:
    """`result` as the model reads it (see the module docstring)."""
    parts = [_block(block) for block in result.content]
    text = "\n".join(part for part in parts if part)
    structured = result.structured_content
    if structured is not None and not _says(text, structured):
        shown = json.dumps(structured, ensure_ascii=False)
        text = f"{text}\nStructured content: {shown}" if text else shown
    artifact: dict[str, Any] = {}
    if structured is not None:
        artifact["structured_content"] = structured
    references = [_reference(block) for block in result.content]
    if any(references):
        artifact["content"] = [r for r in references if r]
    return Output(text=_cut(text, max_chars), artifact=artifact or None)


def _block(block: ContentBlock) -> str:
    if isinstance(block, TextContent):
        return block.text
    if isinstance(block, ImageContent | AudioContent):
        kind = "image" if isinstance(block, ImageContent) else "audio"
        return f"[{kind}: {block.mime_type}, {_size(_decoded_bytes(block.data))}, not shown]"
    if isinstance(block, ResourceLink):
        size = f", {_size(block.size)}" if block.size is not None else ""
        mime = f", {block.mime_type}" if block.mime_type else ""
        return f"[resource link: {block.name} <{block.uri}>{mime}{size}]"
    if isinstance(block, EmbeddedResource):
        resource = block.resource
        mime = f", {resource.mime_type}" if resource.mime_type else ""
        if isinstance(resource, TextResourceContents):
            if len(resource.text) <= INLINE_RESOURCE_CHARS:
                return f"[resource <{resource.uri}>{mime}]\n{resource.text}"
            return f"[resource <{resource.uri}>{mime}, {len(resource.text)} characters, not shown]"
        size = _size(_decoded_bytes(resource.blob))
        return f"[resource <{resource.uri}>{mime}, {size}, not shown]"
    return ""  # pragma: no cover - a content type of a protocol newer than this client


def _reference(block: ContentBlock) -> dict[str, Any] | None:
    """What the artifact keeps of a block the text only refers to (never its data)."""
    if isinstance(block, ImageContent | AudioContent):
        return {
            "type": block.type,
            "mime_type": block.mime_type,
            "bytes": _decoded_bytes(block.data),
        }
    if isinstance(block, ResourceLink):
        return {
            "type": "resource_link",
            "uri": block.uri,
            "name": block.name,
            "mime_type": block.mime_type,
        }
    if isinstance(block, EmbeddedResource):
        resource = block.resource
        entry: dict[str, Any] = {
            "type": "resource",
            "uri": resource.uri,
            "mime_type": resource.mime_type,
        }
        if isinstance(resource, BlobResourceContents):
            entry["bytes"] = _decoded_bytes(resource.blob)
        return entry
    return None


def _says(text: str, structured: Any) -> bool:
    """Whether `text` already says what `structured` holds: its JSON, or the value the
    SDK's servers wrap as `{"result": value}`."""
    try:
        if json.loads(text) == structured:
            return True
    except ValueError:
        pass
    if isinstance(structured, dict) and set(structured) == {"result"}:
        value = structured["result"]
        return text == (value if isinstance(value, str) else json.dumps(value))
    return False


def _decoded_bytes(data: str) -> int:
    """The size of base64 `data` once decoded, without decoding it."""
    return len("".join(data.split()).rstrip("=")) * 3 // 4


def _size(count: int) -> str:
    if count < 1024:
        return f"{count} bytes"
    if count < 1024 * 1024:
        return f"{count / 1024:.0f} KB"
    return f"{count / (1024 * 1024):.1f} MB"


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n…[cut: the server sent {len(text) - limit} characters more]"
