"""The client's own function tool the end-to-end tests offer (`get_weather`), in the
Responses API's flat shape and in Chat Completions' nested one."""

from __future__ import annotations

from typing import Any

# As `POST /v1/responses` takes it (`tools` items of type function).
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city now.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}

# The same tool as `POST /v1/chat/completions` takes it.
CHAT_WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {key: value for key, value in WEATHER.items() if key != "type"},
}
