"""BERNARD_MCP_CONFIG: the `mcpServers` file read as the worker starts (worker/tools/mcp/
config.py), and the names the servers' tools take (worker/tools/mcp/names.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from worker.tools.mcp.config import (
    Confirm,
    HttpServer,
    McpConfigError,
    StdioServer,
    load_config,
    parse_config,
)
from worker.tools.mcp.names import tool_name

ENV = {"HA_TOKEN": "abc123", "ROOT": "/srv/shared"}


def test_a_file_in_the_common_format_gives_each_server_its_transport_and_options() -> None:
    config = parse_config(
        {
            "mcpServers": {
                "home": {
                    "url": "http://homeassistant.local:8123/api/mcp",
                    "headers": {"Authorization": "Bearer ${HA_TOKEN}"},
                },
                "files": {
                    "command": "npx",
                    "args": ["-y", "server-filesystem", "${ROOT}"],
                    "env": {"LOG": "${LOG_LEVEL:-warn}"},
                    "confirm": "always",
                    "trust_hints": True,
                    "timeout_s": 20,
                },
                "off": {"command": "nothing", "disabled": True},
            }
        },
        ENV,
    )
    assert config.servers == {
        "home": HttpServer(
            url="http://homeassistant.local:8123/api/mcp",
            headers={"Authorization": "Bearer abc123"},
        ),
        "files": StdioServer(
            command="npx",
            args=["-y", "server-filesystem", "/srv/shared"],
            env={"LOG": "warn"},
            confirm=Confirm.ALWAYS,
            trust_hints=True,
            timeout_s=20.0,
        ),
    }
    assert config.servers["home"].confirm is Confirm.ANNOTATIONS
    assert config.servers["home"].trust_hints is False


def test_keys_other_assistants_keep_in_the_file_are_ignored() -> None:
    config = parse_config(
        {"mcpServers": {"home": {"url": "https://ha.example/api/mcp", "alwaysAllow": ["x"]}}},
        ENV,
    )
    assert list(config.servers) == ["home"]


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ([], 'the file must be a JSON object with an object "mcpServers"'),
        ({"servers": {}}, 'the file must be a JSON object with an object "mcpServers"'),
        ({"mcpServers": {"home": "http://x"}}, "mcpServers.home: must be an object"),
        (
            {"mcpServers": {"home": {"headers": {}}}},
            'mcpServers.home: give either "url" (streamable HTTP) or "command" (stdio)',
        ),
        (
            {"mcpServers": {"home": {"url": "http://x", "command": "y"}}},
            'mcpServers.home: give either "url" (streamable HTTP) or "command" (stdio), not both',
        ),
        (
            {"mcpServers": {"home": {"url": "ftp://x"}}},
            "mcpServers.home.url: Value error, must be an http:// or https:// URL",
        ),
        (
            {"mcpServers": {"home": {"url": "http://x", "type": "sse"}}},
            "mcpServers.home.type: 'sse' is not a transport Bernard speaks (streamable HTTP "
            'with "url", or stdio with "command")',
        ),
        (
            {"mcpServers": {"home": {"url": "http://x", "confirm": "sometimes"}}},
            "mcpServers.home.confirm: Input should be 'annotations', 'always' or 'never'",
        ),
        (
            {"mcpServers": {"files": {"command": "x", "timeout_s": 0}}},
            "mcpServers.files.timeout_s: Input should be greater than 0",
        ),
        (
            {"mcpServers": {"files": {"command": "x", "args": "-y"}}},
            "mcpServers.files.args: Input should be a valid list",
        ),
        (
            {"mcpServers": {"files": {"command": ""}}},
            "mcpServers.files.command: String should have at least 1 character",
        ),
        (
            {"mcpServers": {"home": {"url": "http://x", "headers": {"A": "${MISSING}"}}}},
            "mcpServers.home.headers.A: ${MISSING} is not set in the environment",
        ),
        (
            {"mcpServers": {"files": {"command": "x", "args": ["a", "${MISSING}"]}}},
            "mcpServers.files.args[1]: ${MISSING} is not set in the environment",
        ),
    ],
)
def test_a_file_that_cannot_be_used_names_the_server_and_the_field(raw: Any, error: str) -> None:
    with pytest.raises(McpConfigError) as caught:
        parse_config(raw, ENV)
    assert str(caught.value) == error


def test_a_file_that_is_not_there_or_not_json_says_which_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    with pytest.raises(McpConfigError) as caught:
        load_config(str(missing), ENV)
    assert (
        str(caught.value) == f"BERNARD_MCP_CONFIG: cannot read {missing}: No such file or directory"
    )
    broken = tmp_path / "broken.json"
    broken.write_text("{'mcpServers': {}}")
    with pytest.raises(McpConfigError) as caught:
        load_config(str(broken), ENV)
    assert str(caught.value).startswith(f"BERNARD_MCP_CONFIG: {broken} is not valid JSON: ")


@pytest.mark.parametrize(
    ("server", "tool", "taken", "name"),
    [
        ("home", "get_light", (), "home__get_light"),
        ("Home Assistant", "HassTurnOn", (), "Home_Assistant__HassTurnOn"),
        ("files", "read.file/v2", (), "files__read_file_v2"),
        ("maison", "allumer_la_lumière", (), "maison__allumer_la_lumi_re"),
        ("home", "get_light", ("home__get_light",), "home__get_light_2"),
        ("home", "get_light", ("home__get_light", "home__get_light_2"), "home__get_light_3"),
        (
            "a-server-with-a-rather-long-name",
            "and_a_tool_whose_name_is_longer_still",
            (),
            "a-server-with-a-rather-long-name__and_a_tool_whose_name_2132815f",
        ),
        (
            "a-server-with-a-rather-long-name",
            "and_a_tool_whose_name_is_longer_still",
            ("a-server-with-a-rather-long-name__and_a_tool_whose_name_2132815f",),
            "a-server-with-a-rather-long-name__and_a_tool_whose_name_213281_2",
        ),
    ],
)
def test_a_servers_tool_is_named_within_openais_rules_and_never_as_one_taken(
    server: str, tool: str, taken: tuple[str, ...], name: str
) -> None:
    assert tool_name(server, tool, taken) == name
    assert len(name) <= 64
