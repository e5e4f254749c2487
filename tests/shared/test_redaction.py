"""Credentials in URLs are hidden wherever a URL is shown (shared/redaction.py)."""

from __future__ import annotations

import pytest

from shared.redaction import redact_url, redact_urls, url_secrets


@pytest.mark.parametrize(
    ("url", "shown", "secrets"),
    [
        ("https://api.example.com/v1", "https://api.example.com/v1", []),
        ("https://user:pa55word@host/v1", "https://user:***@host/v1", ["pa55word"]),
        ("https://sk-token-123@host/v1", "https://***@host/v1", []),
        ("http://user:@host/", "http://user:@host/", []),
        ("https://host/v1?api_key=k3y&model=m", "https://host/v1?api_key=***&model=m", ["k3y"]),
        ("https://host/?token=t0k#frag", "https://host/?token=***#frag", ["t0k"]),
        (
            "https://host/?Access_Token=a&X-Api-Key=b",
            "https://host/?Access_Token=***&X-Api-Key=***",
            ["a", "b"],
        ),
        ("https://host/?sig=s1&signature=s2", "https://host/?sig=***&signature=***", ["s1", "s2"]),
        ("https://host/?password=p&secret=s", "https://host/?password=***&secret=***", ["p", "s"]),
        ("https://host/?q=cats&page=2", "https://host/?q=cats&page=2", []),
        ("https://host/?token=", "https://host/?token=", []),
        ("redis://:s3cret@host:6379/0", "redis://:***@host:6379/0", ["s3cret"]),
        ("rediss://user:s3cret@host/1", "rediss://user:***@host/1", ["s3cret"]),
        (
            "redis+sentinel://:s3cret@h1:26379,h2/svc?sentinel_password=t0p",
            "redis+sentinel://:***@h1:26379,h2/svc?sentinel_password=***",
            ["s3cret", "t0p"],
        ),
        (
            "redis+cluster://u:s3cret@h1:7000,h2:7001",
            "redis+cluster://u:***@h1:7000,h2:7001",
            ["s3cret"],
        ),
        ("https://u:p@[::1/", "https://***@[::1/", []),  # not a URL urlsplit reads
        ("not a url", "not a url", []),
    ],
)
def test_a_urls_credentials_are_hidden_and_the_rest_kept(
    url: str, shown: str, secrets: list[str]
) -> None:
    assert redact_url(url) == shown
    assert url_secrets(url) == secrets


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("nothing here", "nothing here"),
        (
            "ready: router m at https://u:pa55@llm.lan/v1, response m",
            "ready: router m at https://u:***@llm.lan/v1, response m",
        ),
        (
            '{"message":"GET https://h/x?token=abc failed","url":"http://k@h2/"}',
            '{"message":"GET https://h/x?token=*** failed","url":"http://***@h2/"}',
        ),
        ("two: http://a:b@h1/ and redis://:c@h2/0", "two: http://a:***@h1/ and redis://:***@h2/0"),
    ],
)
def test_every_url_in_a_text_is_redacted(text: str, shown: str) -> None:
    assert redact_urls(text) == shown


def test_no_url_has_no_secrets() -> None:
    assert url_secrets(None) == [] and url_secrets("") == []
