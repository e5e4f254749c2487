"""compat/requests.py: a body read elsewhere is the one a `requests.Response` answers with,
whatever its connection still holds."""

from __future__ import annotations

import io

import requests

from compat.requests import keep_body


def test_the_kept_body_is_the_responses_content_text_and_json() -> None:
    response = requests.Response()
    response.status_code = 200
    response.encoding = "utf-8"
    response.raw = io.BytesIO(b'{"from": "the connection"}')
    keep_body(response, b'{"from": "the guard"}')
    assert response.content == b'{"from": "the guard"}'
    assert response.text == '{"from": "the guard"}'
    assert response.json() == {"from": "the guard"}
    assert response.raw.read() == b'{"from": "the connection"}', "never read again"
