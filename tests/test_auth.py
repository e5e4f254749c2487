"""`BERNARD_API_KEYS`: bearer keys map to users; without them the server is open, to
requests for its own names only (a page whose name is rebound to 127.0.0.1 is refused)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from starlette.requests import Request

from api.auth import from_loopback, host_names
from shared.records.reads import Archivist
from shared.settings import Settings
from tests.support.processes import private_redis
from tests.support.stack import Stack, make_settings, run_stack
from tests.support.upstream import ScriptedUpstream

CHAT = "/v1/chat/completions"
BODY = {"model": "bernard-v1", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def secured(upstream: ScriptedUpstream) -> AsyncIterator[Stack]:
    settings = make_settings(upstream, api_keys="key-alice:alice,key-bob:bob")
    async with run_stack(settings) as stack:
        yield stack


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("headers", [{}, bearer("wrong"), {"Authorization": "Basic a2V5"}])
async def test_requests_without_a_valid_key_are_401(
    secured: Stack, headers: dict[str, str]
) -> None:
    for method, url in [("POST", CHAT), ("GET", "/v1/models"), ("GET", "/v1/turns/x")]:
        response = await secured.client.request(method, url, json=BODY, headers=headers)
        assert response.status_code == 401, (method, url)
        assert response.json()["error"]["type"] == "authentication_error"


async def test_auth_is_checked_before_the_body(secured: Stack) -> None:
    response = await secured.client.post(CHAT, json={"nonsense": True})
    assert response.status_code == 401


async def test_a_valid_key_runs_the_turn_as_its_user(secured: Stack) -> None:
    response = await secured.client.post(CHAT, json=BODY, headers=bearer("key-alice"))
    assert response.status_code == 200, response.text
    turn_id = response.headers["x-bernard-turn-id"]
    record = await secured.redis.hget(f"bernard:{{{turn_id}}}:turn", "owner")
    assert record == b"alice"


async def test_health_needs_no_key(secured: Stack) -> None:
    assert (await secured.client.get("/healthz")).status_code == 200


async def test_another_users_turn_is_404_and_their_conversation_id_is_not_theirs(
    secured: Stack,
) -> None:
    response = await secured.client.post(CHAT, json=BODY, headers=bearer("key-alice"))
    turn_id = response.headers["x-bernard-turn-id"]
    conversation_id = response.headers["x-bernard-conversation-id"]
    for method, url in [
        ("GET", f"/v1/turns/{turn_id}"),
        ("GET", f"/v1/turns/{turn_id}/events"),
        ("POST", f"/v1/turns/{turn_id}/cancel"),
    ]:
        other = await secured.client.request(method, url, headers=bearer("key-bob"))
        assert other.status_code == 404, (method, url)
    # Bob using Alice's id gets a conversation of his own under it, and learns nothing.
    bobs = {
        **BODY,
        "conversation_id": conversation_id,
        "messages": [{"role": "user", "content": "bob here"}],
    }
    hijack = await secured.client.post(CHAT, json=bobs, headers=bearer("key-bob"))
    assert hijack.status_code == 200
    assert hijack.headers["x-bernard-conversation-id"] == conversation_id
    alices = Archivist(secured.redis, "alice")
    assert "bob here" not in str(await alices.messages(conversation_id))
    bobs_own = await Archivist(secured.redis, "bob").messages(conversation_id)
    assert [m["role"] for m in bobs_own] == ["user", "assistant"]
    assert bobs_own[0]["content"] == "bob here"
    own = await secured.client.post(
        CHAT, json={**BODY, "conversation_id": conversation_id}, headers=bearer("key-alice")
    )
    assert own.status_code == 200
    assert own.headers["x-bernard-conversation-id"] == conversation_id


@pytest.mark.parametrize(
    ("client", "local"),
    [
        (("127.0.0.1", 5000), True),
        (("127.8.9.10", 5000), True),
        (("::1", 5000), True),
        (("::ffff:127.0.0.1", 5000), True),
        (None, True),  # a Unix socket's peer
        (("192.0.2.2", 5000), False),
        (("::ffff:192.0.2.2", 5000), False),
        (("fd00::2", 5000), False),
        (("testclient", 50000), False),  # not an address at all
    ],
)
def test_a_scrape_is_localfrom_loopback_or_a_unix_socket_only(
    client: tuple[str, int] | None, local: bool
) -> None:
    request = Request({"type": "http", "client": client, "headers": []})
    assert from_loopback(request) is local


async def test_turning_keys_on_warns_that_the_open_servers_conversations_are_hidden(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def hidden_warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if "are now hidden" in r.getMessage()]

    keyed = {"api_keys": "key-alice:alice"}
    async with private_redis(tmp_path / "redis") as server:
        async with run_stack(make_settings(redis_url=server.url, **keyed), worker=False):
            pass
        nothing_to_hide = hidden_warnings()
        async with run_stack(make_settings(redis_url=server.url), worker=False) as open_server:
            for conversation_id in ("kitchen", "hall"):
                made = await open_server.client.post(
                    "/v1/conversations", json={"id": conversation_id}
                )
                assert made.status_code == 201, made.text
        caplog.clear()
        async with run_stack(make_settings(redis_url=server.url, **keyed), worker=False) as keys_on:
            hidden = await keys_on.client.get(
                "/v1/conversations", headers={"Authorization": "Bearer key-alice"}
            )
        said = hidden_warnings()
        caplog.clear()
        # The way out the warning names: a key for the user `local`.
        reach = {"api_keys": "key-alice:alice,key-old:local"}
        async with run_stack(make_settings(redis_url=server.url, **reach), worker=False) as back:
            found = await back.client.get(
                "/v1/conversations", headers={"Authorization": "Bearer key-old"}
            )
        unsaid = hidden_warnings()

    assert nothing_to_hide == []
    assert hidden.json()["data"] == []
    assert said == [
        "BERNARD_API_KEYS is set, and the 2 conversation(s) made while the server ran without "
        "keys (user 'local') are now hidden: no key belongs to that user. To reach them, give "
        "it a key: BERNARD_API_KEYS=...,<key>:local"
    ]
    assert unsaid == []
    assert sorted(c["id"] for c in found.json()["data"]) == ["hall", "kitchen"]


# -- without keys: the server's own names only ---------------------------------------------

REBOUND = "rebound.example:8000"


def refused_host(host: str) -> dict[str, object]:
    return {
        "error": {
            "message": "this server answers for its own names only while BERNARD_API_KEYS is "
            f"unset, and the Host header {host!r} is not one (add it to BERNARD_ALLOWED_HOSTS)",
            "type": "invalid_request_error",
            "param": "Host",
            "code": "invalid_host",
        }
    }


@pytest.fixture
async def local(
    upstream: ScriptedUpstream, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Stack]:
    monkeypatch.setenv("HOST", "192.168.1.20")  # the address it is bound to: one of its names
    settings = make_settings(upstream, allowed_hosts="bernard.lan, *.home.example")
    async with run_stack(settings, worker=False) as stack:
        yield stack


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("GET", "/v1/conversations"),
        ("POST", "/v1/conversations"),
        ("GET", "/v1/turns"),
        ("POST", CHAT),
        ("POST", "/v1/conversations/conv_0123/resume"),
        ("GET", "/metrics"),
        ("GET", "/"),
    ],
)
async def test_without_keys_a_request_for_another_name_is_refused_before_any_route(
    local: Stack, method: str, url: str
) -> None:
    answer = await local.client.request(method, url, json=BODY, headers={"host": REBOUND})
    assert answer.status_code == 400
    assert answer.json() == refused_host(REBOUND)
    assert answer.headers["x-should-retry"] == "false"


@pytest.mark.parametrize(
    "host",
    [
        "localhost:8000",
        "LocalHost",
        "127.0.0.1:8000",
        "[::1]:8000",
        "192.168.1.20:8000",
        "bernard.lan",
        "tv.home.example:8000",
    ],
)
async def test_without_keys_the_servers_own_names_are_answered(local: Stack, host: str) -> None:
    answer = await local.client.get("/v1/conversations", headers={"host": host})
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize(
    "host", ["127.0.0.2:8000", "localhost.rebound.example", "home.example", "", "a b"]
)
async def test_without_keys_names_near_the_servers_own_are_refused(local: Stack, host: str) -> None:
    answer = await local.client.get("/v1/turns", headers={"host": host})
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_host"


async def test_the_probes_answer_any_name(local: Stack) -> None:
    for probe in ("/healthz", "/readyz"):
        answer = await local.client.get(probe, headers={"host": REBOUND})
        assert answer.status_code in (200, 503), probe  # /readyz: no worker here
        assert "error" not in answer.json()


async def test_with_keys_any_name_is_answered_and_the_key_decides(secured: Stack) -> None:
    refused = await secured.client.get("/v1/turns", headers={"host": REBOUND})
    assert refused.status_code == 401
    answered = await secured.client.get(
        "/v1/turns", headers={"host": REBOUND, **bearer("key-alice")}
    )
    assert answered.status_code == 200


@pytest.mark.parametrize(
    ("values", "bound", "names"),
    [
        ({}, "127.0.0.1", ["localhost", "127.0.0.1", "[::1]"]),
        ({}, "0.0.0.0", ["localhost", "127.0.0.1", "[::1]"]),
        ({}, "::", ["localhost", "127.0.0.1", "[::1]"]),
        ({}, "::1", ["localhost", "127.0.0.1", "[::1]"]),
        ({}, "192.168.1.20", ["localhost", "127.0.0.1", "[::1]", "192.168.1.20"]),
        ({}, "fd00::20", ["localhost", "127.0.0.1", "[::1]", "[fd00::20]"]),
        ({}, "Bernard.Local", ["localhost", "127.0.0.1", "[::1]", "bernard.local"]),
        (
            {"allowed_hosts": "Bernard.lan, *.home.example"},
            "127.0.0.1",
            ["localhost", "127.0.0.1", "[::1]", "*.home.example", "bernard.lan"],
        ),
        ({"allowed_hosts": "*"}, "127.0.0.1", ["localhost", "127.0.0.1", "[::1]", "*"]),
        ({"api_keys": "k:alice"}, "127.0.0.1", None),
    ],
)
def test_host_names(values: dict[str, str], bound: str, names: list[str] | None) -> None:
    assert host_names(Settings(_env_file=None, **values), bound) == names


@pytest.mark.parametrize("pattern", ["bernard.*", "*bernard.lan", "a.*.lan"])
def test_an_allowed_host_wildcard_must_lead_a_domain(pattern: str) -> None:
    with pytest.raises(ValueError, match="a wildcard is `\\*` or leads a domain"):
        Settings(_env_file=None, allowed_hosts=pattern)
