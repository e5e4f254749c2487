"""What the model reads of an MCP tool's result (worker/tools/mcp/output.py), and which
calls wait for the user (worker/tools/mcp/tool.py `waits`)."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from mcp.types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
    ToolAnnotations,
)

from worker.tools.mcp.config import Confirm
from worker.tools.mcp.output import Output, render_result
from worker.tools.mcp.tool import waits

PNG = base64.b64encode(b"\x89PNG" + b"\0" * 20_476).decode()  # 20,480 bytes
WAV = base64.b64encode(b"RIFF" + b"\0" * 296).decode()  # 300 bytes
DOT = base64.b64encode(b"GIF").decode()  # 3 bytes
# BERNARD_MCP_RESULT_MAX_CHARS's default.
MAX_CHARS = 20_000
PDF = base64.b64encode(b"%PDF" + b"\0" * 2_097_148).decode()  # 2 MiB


def text(value: str) -> TextContent:
    return TextContent(type="text", text=value)


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (
            CallToolResult(content=[text("The kitchen light is on."), text("At 40 %.")]),
            Output("The kitchen light is on.\nAt 40 %."),
        ),
        (
            CallToolResult(content=[text("2 lights")], structured_content={"result": "2 lights"}),
            Output("2 lights", {"structured_content": {"result": "2 lights"}}),
        ),
        (
            CallToolResult(
                content=[text('{"on": true, "brightness": 40}')],
                structured_content={"on": True, "brightness": 40},
            ),
            Output(
                '{"on": true, "brightness": 40}',
                {"structured_content": {"on": True, "brightness": 40}},
            ),
        ),
        (
            CallToolResult(content=[], structured_content={"on": True, "brightness": 40}),
            Output(
                '{"on": true, "brightness": 40}',
                {"structured_content": {"on": True, "brightness": 40}},
            ),
        ),
        (
            CallToolResult(
                content=[text("The light is on.")], structured_content={"brightness": 40}
            ),
            Output(
                'The light is on.\nStructured content: {"brightness": 40}',
                {"structured_content": {"brightness": 40}},
            ),
        ),
        (
            CallToolResult(
                content=[
                    text("Here is the porch camera:"),
                    ImageContent(type="image", data=PNG, mime_type="image/png"),
                    AudioContent(type="audio", data=WAV, mime_type="audio/wav"),
                ]
            ),
            Output(
                "Here is the porch camera:\n[image: image/png, 20 KB, not shown]\n"
                "[audio: audio/wav, 300 bytes, not shown]",
                {
                    "content": [
                        {"type": "image", "mime_type": "image/png", "bytes": 20_480},
                        {"type": "audio", "mime_type": "audio/wav", "bytes": 300},
                    ]
                },
            ),
        ),
        (
            CallToolResult(
                content=[
                    ResourceLink(
                        type="resource_link",
                        name="manual.pdf",
                        uri="file:///srv/manual.pdf",
                        mime_type="application/pdf",
                        size=3_500_000,
                    )
                ]
            ),
            Output(
                "[resource link: manual.pdf <file:///srv/manual.pdf>, application/pdf, 3.3 MB]",
                {
                    "content": [
                        {
                            "type": "resource_link",
                            "uri": "file:///srv/manual.pdf",
                            "name": "manual.pdf",
                            "mime_type": "application/pdf",
                        }
                    ]
                },
            ),
        ),
        (
            CallToolResult(
                content=[
                    EmbeddedResource(
                        type="resource",
                        resource=TextResourceContents(
                            uri="file:///srv/notes.txt", mime_type="text/plain", text="buy milk"
                        ),
                    ),
                    EmbeddedResource(
                        type="resource",
                        resource=TextResourceContents(uri="file:///srv/log.txt", text="x" * 4001),
                    ),
                    EmbeddedResource(
                        type="resource",
                        resource=BlobResourceContents(
                            uri="file:///srv/manual.pdf", mime_type="application/pdf", blob=PDF
                        ),
                    ),
                ]
            ),
            Output(
                "[resource <file:///srv/notes.txt>, text/plain]\nbuy milk\n"
                "[resource <file:///srv/log.txt>, 4001 characters, not shown]\n"
                "[resource <file:///srv/manual.pdf>, application/pdf, 2.0 MB, not shown]",
                {
                    "content": [
                        {
                            "type": "resource",
                            "uri": "file:///srv/notes.txt",
                            "mime_type": "text/plain",
                        },
                        {"type": "resource", "uri": "file:///srv/log.txt", "mime_type": None},
                        {
                            "type": "resource",
                            "uri": "file:///srv/manual.pdf",
                            "mime_type": "application/pdf",
                            "bytes": 2_097_152,
                        },
                    ]
                },
            ),
        ),
    ],
)
def test_a_result_is_text_for_the_model_with_the_rest_kept_or_referenced(
    result: CallToolResult, expected: Output
) -> None:
    assert render_result(result, max_chars=MAX_CHARS) == expected


def test_a_result_longer_than_the_cap_is_cut_saying_how_much_was_left_out() -> None:
    result = CallToolResult(content=[text("abcdefghij" * 3)])
    assert render_result(result, max_chars=12) == Output(
        "abcdefghijab\n…[cut: the server sent 18 characters more]"
    )


def test_blocks_past_the_cut_are_measured_not_rendered_nor_structured_content_added() -> None:
    result = CallToolResult(
        content=[
            text("abcdefghij"),
            ImageContent(type="image", data=PNG, mime_type="image/png"),
            text("klmno"),
            AudioContent(type="audio", data=WAV, mime_type="audio/wav"),
        ],
        structured_content={"on": True},
    )
    # "\n[image: image/png, 20 KB, not shown]" is 37 characters, 35 of them past the cut;
    # then "\nklmno" (6) and "\n[audio: audio/wav, 300 bytes, not shown]" (41).
    assert render_result(result, max_chars=12) == Output(
        "abcdefghij\n[\n…[cut: the server sent 82 characters more]",
        {
            "structured_content": {"on": True},
            "content": [{"type": "image", "mime_type": "image/png", "bytes": 20_480}],
            "content_not_listed": 1,
        },
    )


def test_structured_content_over_the_cap_is_cut_in_the_text_and_measured_in_the_artifact() -> None:
    rows = [{"entity": f"light.{n}", "on": True} for n in range(3)]
    result = CallToolResult(content=[text("3 lights")], structured_content={"rows": rows})
    assert render_result(result, max_chars=60) == Output(
        '3 lights\nStructured content: {"rows": [{"entity": "light.0",'
        "\n…[cut: the server sent 84 characters more]",
        {"structured_content_chars": 115},
    )


def test_a_result_of_many_blocks_refers_to_the_first_ones_in_the_artifact() -> None:
    result = CallToolResult(
        content=[ImageContent(type="image", data=DOT, mime_type="image/gif")] * 100
    )
    output = render_result(result, max_chars=MAX_CHARS)
    assert output.text == "\n".join(["[image: image/gif, 3 bytes, not shown]"] * 100)
    assert output.artifact == {
        "content": [{"type": "image", "mime_type": "image/gif", "bytes": 3}] * 64,
        "content_not_listed": 36,
    }


@pytest.mark.parametrize(
    ("hints", "confirm", "trusted", "expected"),
    [
        ({"readOnlyHint": True}, Confirm.ANNOTATIONS, True, False),
        ({"readOnlyHint": True, "destructiveHint": False}, Confirm.ANNOTATIONS, True, False),
        ({"readOnlyHint": False, "destructiveHint": False}, Confirm.ANNOTATIONS, True, True),
        ({"readOnlyHint": False}, Confirm.ANNOTATIONS, True, True),
        ({}, Confirm.ANNOTATIONS, True, True),
        (None, Confirm.ANNOTATIONS, True, True),
        ({"readOnlyHint": True, "destructiveHint": True}, Confirm.ANNOTATIONS, True, True),
        # A server whose hints are not trusted: its word that a tool only reads is not taken.
        ({"readOnlyHint": True}, Confirm.ANNOTATIONS, False, True),
        ({"readOnlyHint": True, "destructiveHint": False}, Confirm.ANNOTATIONS, False, True),
        ({"readOnlyHint": True}, Confirm.ALWAYS, True, True),
        ({"readOnlyHint": False, "destructiveHint": True}, Confirm.NEVER, True, False),
        ({"readOnlyHint": False, "destructiveHint": True}, Confirm.NEVER, False, False),
    ],
)
def test_a_call_waits_unless_a_trusted_tool_says_it_only_reads_or_the_server_overrides(
    hints: dict[str, Any] | None, confirm: Confirm, trusted: bool, expected: bool
) -> None:
    annotations = None if hints is None else ToolAnnotations.model_validate(hints)
    assert waits(annotations, confirm, trusted) is expected
