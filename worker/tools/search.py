"""The `web_search` tool: a web search through a SearXNG instance's JSON API.

SearXNG (https://docs.searxng.org/dev/search_api.html) answers `GET {url}/search?q=...&format=json`
with `{"query", "results": [{"title", "url", "content", ...}], ...}`. The instance must allow
the JSON format (`search.formats` in its settings.yml); one that does not answers 403.

Configured by `BERNARD_SEARXNG_URL`; the request goes through the worker's shared HTTP client
(worker/tools/runtime.py), limited by `BERNARD_TOOL_HTTP_TIMEOUT_S`.
"""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import ToolException, tool
from pydantic import Field

from worker.tools.http import quoted, request_json, trim
from worker.tools.progress import get_reporter
from worker.tools.runtime import get_runtime
from worker.tools.settings import SourceSettings
from worker.tools.texts import folded_text

__all__ = ["MAX_RESULTS", "SNIPPET_CHARS", "WebSearchSettings", "web_search"]

MAX_RESULTS = 10
SNIPPET_CHARS = 300
_MAX_QUERY_CHARS = 500
_SERVICE = "the search service (SearXNG)"


class WebSearchSettings(SourceSettings):
    searxng_url: str | None = Field(
        None,
        alias="BERNARD_SEARXNG_URL",
        description="A SearXNG with the JSON format on, for the `web_search` tool; unset, no "
        "web search (there is no public instance to default to)",
    )


@tool
async def web_search(query: str, config: RunnableConfig, max_results: int = 5) -> str:
    """Search the web and return the top results: title, URL and a short snippet each.

    Use it for current events, facts that change, or anything not known for sure.
    `max_results` is how many results to return (1-10, default 5).
    """
    reporter = get_reporter(config)
    limit = max(1, min(max_results, MAX_RESULTS))
    with reporter.reporting_errors():
        query = folded_text(query, "the search query", _MAX_QUERY_CHARS)
        searxng = get_runtime(config).tool_settings.of(WebSearchSettings)
        base = searxng.needed("searxng_url", "web search")
        reporter.step(f"Searching the web for {quoted(query)}")
        data = await request_json(
            config,
            "GET",
            f"{base.rstrip('/')}/search",
            service=_SERVICE,
            params={"q": query, "format": "json"},
            refused="; the instance may require a login or not allow the JSON format",
        )
        results = _results(data)
    reporter.step(f"Retrieved {len(results)} result{'' if len(results) == 1 else 's'}")
    reporter.complete("Formatting results")
    if not results:
        return f"No results for {quoted(query, limit=_MAX_QUERY_CHARS)}."
    lines = [f"Web results for {quoted(query, limit=_MAX_QUERY_CHARS)}:"]
    for number, result in enumerate(results[:limit], start=1):
        lines.append(f"{number}. {trim(result['title'] or result['url'], 200)}")
        lines.append(f"   {result['url']}")
        if result["content"]:
            lines.append(f"   {trim(result['content'], SNIPPET_CHARS)}")
    return "\n".join(lines)


# The model reads the error text as the tool's result and can answer without the search.
web_search.handle_tool_error = True


def _results(data: Any) -> list[dict[str, str]]:
    """The results with a URL, as {title, url, content}; a tool error for any other shape."""
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, list):
        raise ToolException(f"Error: {_SERVICE} sent an unexpected response (no result list)")
    found = []
    for item in results:
        if isinstance(item, dict) and isinstance(item.get("url"), str) and item["url"]:
            found.append({key: str(item.get(key) or "") for key in ("title", "url", "content")})
    return found
