"""Webhook signing, events and targets (shared/webhooks.py, shared/webhook_targets.py),
against literal values: the
Standard Webhooks specification's own test vector, and signatures computed once by hand
(`hmac.new(key, b"{id}.{timestamp}.{body}", hashlib.sha256)`, base64) and written out."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from shared.events import Done, TurnStatus
from shared.settings import Settings
from shared.webhook_targets import (
    Origin,
    WebhookTargetError,
    private_reason,
    read_url,
    requested_target,
)
from shared.webhooks import (
    event_body,
    event_type,
    logged_origin,
    secret_key,
    sign,
    signed_headers,
)

# base64 of b"bernard webhook test key".
SECRET = "whsec_YmVybmFyZCB3ZWJob29rIHRlc3Qga2V5"
BODY = (
    b'{"id":"evt_abc","object":"event","created_at":1764201600,'
    b'"type":"response.completed","data":{"id":"abc"}}'
)


@pytest.mark.parametrize(
    ("secret", "message_id", "timestamp", "body", "signature"),
    [
        # The specification's test vector (https://www.standardwebhooks.com).
        (
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            b'{"test": 2432232314}',
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
        ),
        (SECRET, "evt_abc", 1764201600, BODY, "v1,qB8CDnsOVR6MawXH9lp23x27U+DJ3V/Sw6htAO4JDX4="),
        # Another attempt of the same event: its time, so its signature, differ.
        (SECRET, "evt_abc", 1764201605, BODY, "v1,LZ6c+X/AhfsqQ11vXkKH9JeNmCiYUqAIkdOhNjBcaAo="),
        (
            SECRET,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            b'{"test": 2432232314}',
            "v1,kBJneFHexC75CaM/40tO1SVMB6JfLt+T4pfmhBZOczw=",
        ),
    ],
)
def test_signatures_are_standard_webhooks(
    secret: str, message_id: str, timestamp: int, body: bytes, signature: str
) -> None:
    assert sign(secret_key(secret), message_id, timestamp, body) == signature


def test_an_attempt_carries_the_three_headers() -> None:
    assert signed_headers(secret_key(SECRET), "evt_abc", 1764201600, BODY) == {
        "content-type": "application/json",
        "webhook-id": "evt_abc",
        "webhook-timestamp": "1764201600",
        "webhook-signature": "v1,qB8CDnsOVR6MawXH9lp23x27U+DJ3V/Sw6htAO4JDX4=",
    }


def test_the_body_is_openais_event() -> None:
    assert event_body("abc", "response.completed", 1764201600) == BODY
    assert event_body("abc", "response.failed", 1764201600, "resp_abc") == (
        b'{"id":"evt_abc","object":"event","created_at":1764201600,'
        b'"type":"response.failed","data":{"id":"resp_abc"}}'
    )


@pytest.mark.parametrize(
    ("done", "kind"),
    [
        (Done(TurnStatus.COMPLETED, finish_reason="stop"), "response.completed"),
        (Done(TurnStatus.COMPLETED, finish_reason="tool_calls"), "response.completed"),
        (Done(TurnStatus.COMPLETED, finish_reason="length"), "response.incomplete"),
        (Done(TurnStatus.AWAITING_CONFIRMATION), "response.completed"),
        (Done(TurnStatus.FAILED, error={"code": "worker_lost"}), "response.failed"),
        (Done(TurnStatus.CANCELLED), "response.cancelled"),
    ],
)
def test_event_types(done: Done, kind: str) -> None:
    assert event_type(done) == kind


def settings(**values: Any) -> Settings:
    return Settings(_env_file=None, **values)


def refused_origin(origin: str) -> str:
    return (
        f"webhook_url's origin '{origin}' is not one this server may call (BERNARD_WEBHOOK_ORIGINS)"
    )


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("http://hooks.example/in", None),
        ("http://hooks.example:80/in", None),
        ("https://HOOKS.example:8443/in?x=1", None),
        ("https://hooks.example:8443", None),
        ("http://127.0.0.1:8123/api/webhook/x", None),
        ("https://evil.example/in", refused_origin("https://evil.example:443")),
        # An allowed host on another port or scheme is another origin.
        ("http://hooks.example:6379/", refused_origin("http://hooks.example:6379")),
        ("https://hooks.example/in", refused_origin("https://hooks.example:443")),
        ("http://hooks.example:8443/in", refused_origin("http://hooks.example:8443")),
        ("http://127.0.0.1/in", refused_origin("http://127.0.0.1:80")),
        # A user name, a backslash: read as two servers by two parsers, or a way to one.
        ("https://hooks.example@evil.example/", "webhook_url must not hold a user name"),
        (
            "http://evil.example:1\\@hooks.example/",
            "webhook_url holds a backslash, a space or a control character",
        ),
        (
            "http://hooks.example/a b",
            "webhook_url holds a backslash, a space or a control character",
        ),
        (
            "http://hooks.example/\r\nx",
            "webhook_url holds a backslash, a space or a control character",
        ),
        ("ftp://hooks.example/in", "webhook_url must be an http:// or https:// URL"),
        ("hooks.example/in", "webhook_url must be an http:// or https:// URL"),
        ("http://[::1/in", "webhook_url is not a URL"),
        ("http://hooks.example:99999/", "webhook_url is not a URL"),
    ],
)
def test_a_requested_target_must_be_on_an_allowed_origin(url: str, error: str | None) -> None:
    allowed = settings(
        webhook_secret=SECRET,
        webhook_origins="http://hooks.example, https://hooks.example:8443/, http://127.0.0.1:8123",
        webhook_allow_private=True,
    )
    if error is None:
        assert requested_target(url, allowed) == url
    else:
        with pytest.raises(WebhookTargetError) as raised:
            requested_target(url, allowed)
        assert str(raised.value) == error


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("http://Hooks.Example/in", Origin("http", "hooks.example", 80)),
        ("https://hooks.example/in", Origin("https", "hooks.example", 443)),
        ("HTTPS://hooks.example:8443", Origin("https", "hooks.example", 8443)),
        ("http://[::1]:8080/", Origin("http", "::1", 8080)),
    ],
)
def test_read_url(url: str, origin: Origin) -> None:
    assert read_url(url, "x") == origin


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"webhook_url": "http://hooks.example/"}, "need BERNARD_WEBHOOK_SECRET"),
        ({"webhook_origins": "https://hooks.example"}, "need BERNARD_WEBHOOK_SECRET"),
        (
            {"webhook_secret": SECRET, "webhook_origins": "hooks.example"},
            "BERNARD_WEBHOOK_ORIGINS' 'hooks.example' must be an http:// or https:// URL",
        ),
        (
            {"webhook_secret": SECRET, "webhook_origins": "https://hooks.example/in"},
            "BERNARD_WEBHOOK_ORIGINS' 'https://hooks.example/in' must be scheme://host",
        ),
        (
            {"webhook_secret": SECRET, "webhook_origins": "https://hooks.example?x=1"},
            "must be scheme://host",
        ),
        (
            {"webhook_secret": SECRET, "webhook_origins": "https://me@hooks.example"},
            "must not hold a user name",
        ),
        (
            {"webhook_secret": SECRET, "webhook_url": "http://a:1\\@hooks.example/"},
            "BERNARD_WEBHOOK_URL holds a backslash",
        ),
        ({"webhook_secret": "YmVybmFyZA=="}, "must start with whsec_"),
        ({"webhook_secret": "whsec_not base64!"}, "whsec_ followed by base64"),
        ({"webhook_secret": "whsec_"}, "must not be empty"),
        ({"webhook_secret": SECRET, "webhook_url": "hooks.example"}, "http:// or https://"),
        ({"webhook_retry_delays": "5,x"}, "comma-separated seconds"),
        ({"webhook_retry_delays": "5,0"}, "positive seconds"),
        ({"webhook_retry_delays": "36000,36001"}, "at most 72000"),
    ],
)
def test_settings_that_cannot_work_are_refused(values: dict[str, Any], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        settings(**values)


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        ("hooks.example.com", None),
        ("8.8.8.8", None),
        ("2606:4700::1", None),
        ("10.1.2.3", "a private address"),
        ("192.168.1.10", "a private address"),
        ("fd00::", "a private address"),
        ("::ffff:10.0.0.1", "a private address"),
        ("2002:a00:1::", "a private address"),  # 6to4 of 10.0.0.1
        ("169.254.169.254", "a link-local address"),
        ("fe80::1", "a link-local address"),
        ("127.0.0.1", "a loopback address"),
        ("::1", "a loopback address"),
        ("[::1]", "a loopback address"),
        ("0.0.0.0", "an unspecified address"),
        ("224.0.0.1", "a multicast address"),
        ("240.0.0.1", "a private address"),
        ("100.64.0.1", "not a public address"),
        ("64:ff9b::a00:1", "a reserved address"),
        ("metadata.google.internal", "a local name"),
        ("localhost", "a local name"),
        ("api.localhost", "a local name"),
        ("homeassistant.local", "a local name"),
        ("nas.home.arpa", "a local name"),
        ("printer.lan", "a local name"),
        ("metadata", "a local name"),
        ("Metadata.Google.Internal.", "a local name"),
    ],
)
def test_private_reason(host: str, reason: str | None) -> None:
    assert private_reason(host) == reason


@pytest.mark.parametrize(
    ("values", "error"),
    [
        (
            {"webhook_url": "http://10.0.0.5/hook"},
            "BERNARD_WEBHOOK_URL names 10.0.0.5, a private address: webhooks go to public "
            "receivers unless BERNARD_WEBHOOK_ALLOW_PRIVATE=true",
        ),
        (
            {"webhook_origins": "https://hooks.example.com, http://169.254.169.254"},
            "BERNARD_WEBHOOK_ORIGINS' 'http://169.254.169.254:80' names 169.254.169.254, a "
            "link-local address: webhooks go to public receivers unless "
            "BERNARD_WEBHOOK_ALLOW_PRIVATE=true",
        ),
        (
            {"webhook_origins": "http://metadata.google.internal"},
            "BERNARD_WEBHOOK_ORIGINS' 'http://metadata.google.internal:80' names "
            "metadata.google.internal, a local name",
        ),
        ({"webhook_origins": "http://[fd00::]:8080"}, "names fd00::, a private address"),
        ({"webhook_url": "http://localhost:8123/hook"}, "names localhost, a local name"),
    ],
)
def test_private_targets_are_refused_at_start_unless_allowed(
    values: dict[str, Any], error: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        settings(webhook_secret=SECRET, **values)
    assert error in str(refused.value)
    allowed = settings(webhook_secret=SECRET, webhook_allow_private=True, **values)
    assert allowed.webhook_allow_private is True


def test_retry_delays_are_read_in_order() -> None:
    assert settings(webhook_retry_delays="5, 30,0.5").webhook_retry_delays_s() == (5, 30, 0.5)


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("https://hooks.example/in?token=secret", "https://hooks.example"),
        ("http://user:pass@hooks.example:8080/a/b", "http://hooks.example:8080"),
    ],
)
def test_the_log_shows_only_a_targets_origin(url: str, origin: str) -> None:
    assert logged_origin(url) == origin
