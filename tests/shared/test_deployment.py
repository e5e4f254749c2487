"""What a worker publishes of what it runs (shared/deployment.py): its models, passwords
hidden. The services its tools reach: tests/worker/test_tool_sources.py."""

from __future__ import annotations

from typing import Any

import pytest

from shared.deployment import models_of
from shared.settings import Settings

NO_LLM: dict[str, Any] = dict.fromkeys(
    ("openai_base_url", "openai_api_key", "anthropic_base_url", "anthropic_api_key")
)


def settings(**values: Any) -> Settings:
    return Settings(_env_file=None, **{**NO_LLM, **values})


@pytest.mark.parametrize(
    ("values", "models"),
    [
        (
            {},
            [
                ("router", "demo", "bernard-demo", None, True),
                ("response", "demo", "bernard-demo", None, True),
            ],
        ),
        (
            {"openai_api_key": "sk-x", "router_model": "small", "response_model": "big"},
            [
                ("router", "openai", "small", "https://api.openai.com/v1", False),
                ("response", "openai", "big", "https://api.openai.com/v1", False),
            ],
        ),
        (
            {
                "openai_base_url": "http://me:pw@ollama:11434/v1",
                "anthropic_api_key": "sk-ant",
                "response_provider": "anthropic",
                "router_model": "qwen",
                "response_model": "claude",
            },
            [
                ("router", "openai", "qwen", "http://me:***@ollama:11434/v1", False),
                ("response", "anthropic", "claude", "https://api.anthropic.com", False),
            ],
        ),
    ],
    ids=["demo", "openai", "two providers, a password"],
)
def test_the_models_a_worker_runs(values: dict[str, Any], models: list[tuple[Any, ...]]) -> None:
    assert [
        (m.role, m.provider, m.model, m.base_url, m.demo) for m in models_of(settings(**values))
    ] == models
