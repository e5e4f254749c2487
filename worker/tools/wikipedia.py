"""The `wikipedia` tool: the summary of the Wikipedia article that best matches a query.

It speaks two MediaWiki APIs. The Action API's full-text search
(https://www.mediawiki.org/wiki/API:Search, `GET {base}/w/api.php?action=query&list=search`)
finds up to five titles; the REST page-summary endpoint (`GET {base}/api/rest_v1/page/summary/
{title}`, https://en.wikipedia.org/api/rest_v1/#/Page%20content/get_page_summary__title_, its
response described at https://www.mediawiki.org/wiki/Specs/Summary/1.4.0) gives the lead
extract of the best one. A disambiguation page (`type: "disambiguation"`) is skipped for the
next hit; when every hit is one, the tool lists their titles and asks for a more specific
query rather than returning the page's raw list.

`BERNARD_WIKIPEDIA_URL` is the wiki (default https://en.wikipedia.org). `lang` picks another
language edition when that URL is a public `*.wikipedia.org` one; a self-hosted wiki has a
single language, so there `lang` is checked but otherwise ignored.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, urlsplit

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import ToolException, tool
from pydantic import Field

from worker.tools.http import quoted, request_json, trim
from worker.tools.progress import ProgressReporter, get_reporter
from worker.tools.runtime import get_runtime
from worker.tools.settings import SourceSettings
from worker.tools.texts import folded_text

__all__ = ["EXTRACT_CHARS", "WikipediaSettings", "wiki_base", "wikipedia"]

EXTRACT_CHARS = 1500
_MAX_QUERY_CHARS = 300
SEARCH_LIMIT = 5
_SERVICE = "Wikipedia"
_LANG = re.compile(r"[a-z]{2,3}")
_PUBLIC_HOST = re.compile(r"[a-z][a-z-]*\.wikipedia\.org")


class WikipediaSettings(SourceSettings):
    wikipedia_url: str = Field(
        "https://en.wikipedia.org",
        alias="BERNARD_WIKIPEDIA_URL",
        description="The Wikipedia the `wikipedia` tool reads; empty turns the tool off",
    )


@tool
async def wikipedia(query: str, config: RunnableConfig, lang: str | None = None) -> str:
    """Look up a topic on Wikipedia and return the summary of the best-matching article.

    `query` names the topic ("Ada Lovelace", "photosynthesis"). `lang` is an optional
    2-3 letter language code for another Wikipedia edition, such as "de" or "fr".
    """
    reporter = get_reporter(config)
    with reporter.reporting_errors():
        return await _look_up(query, lang, config, reporter)


# The model reads the error text as the tool's result and can answer without the article.
wikipedia.handle_tool_error = True


def wiki_base(url: str, lang: str | None) -> str:
    """The wiki to ask: `url`, switched to the `lang` edition when it is a public Wikipedia."""
    base = url.rstrip("/")
    if lang is None:
        return base
    code = lang.strip().lower()
    if not _LANG.fullmatch(code):
        raise ToolException(
            f"Error: lang must be a 2-3 letter language code like 'de', not {lang!r}"
        )
    parts = urlsplit(base)
    if parts.hostname and _PUBLIC_HOST.fullmatch(parts.hostname):
        return f"{parts.scheme}://{code}.wikipedia.org{parts.path}"
    return base


async def _look_up(
    query: str, lang: str | None, config: RunnableConfig, reporter: ProgressReporter
) -> str:
    query = folded_text(query, "the query", _MAX_QUERY_CHARS)
    wiki = get_runtime(config).tool_settings.of(WikipediaSettings)
    base = wiki_base(wiki.needed("wikipedia_url", "Wikipedia"), lang)

    reporter.step(f"Searching Wikipedia for {quoted(query)}")
    params = {
        "action": "query",
        "list": "search",
        "srsearch": query,
        "format": "json",
        "srlimit": str(SEARCH_LIMIT),
    }
    titles, suggestion = _search_hits(
        await request_json(config, "GET", f"{base}/w/api.php", service=_SERVICE, params=params)
    )
    ambiguous: list[str] = []
    for position, title in enumerate(titles):
        reporter.step(f"Reading {quoted(title)}")
        path = quote(title.replace(" ", "_"), safe="")
        summary = await request_json(
            config,
            "GET",
            f"{base}/api/rest_v1/page/summary/{path}",
            service=_SERVICE,
            missing_ok=True,
        )
        if summary is None:  # deleted or renamed since the search index saw it
            continue
        if not isinstance(summary, dict):
            raise ToolException(f"Error: {_SERVICE} sent an unexpected page summary")
        if summary.get("type") == "disambiguation":
            ambiguous.append(title)
            continue
        reporter.complete(f"Read {quoted(title)}")
        text = _render(summary, title, base)
        if ambiguous:
            others = ", ".join(titles[position + 1 :]) or "none"
            text += f"\nNote: {quoted(ambiguous[0])} is a disambiguation page."
            text += f" Other matches: {others}."
        return text

    reporter.complete("No article to read")
    if ambiguous:
        return (
            f"{quoted(query)} is ambiguous: Wikipedia lists several topics under "
            f"{', '.join(ambiguous)}. Ask the user which one they mean, or call wikipedia "
            "again with a more specific query (add what kind of thing it is)."
        )
    hint = f" Did you mean {quoted(suggestion)}?" if suggestion else ""
    return f"Wikipedia has no article matching {quoted(query)}.{hint}"


def _search_hits(data: Any) -> tuple[list[str], str | None]:
    """The titles an Action API search found, and its spelling suggestion if any."""
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        info = data["error"].get("info") or data["error"].get("code") or "unknown error"
        raise ToolException(f"Error: {_SERVICE} rejected the search: {info}")
    query = data.get("query") if isinstance(data, dict) else None
    hits = query.get("search") if isinstance(query, dict) else None
    if not isinstance(hits, list) or not all(
        isinstance(hit, dict) and isinstance(hit.get("title"), str) for hit in hits
    ):
        raise ToolException(f"Error: {_SERVICE} sent an unexpected search response")
    info = query.get("searchinfo") if isinstance(query, dict) else None
    suggestion = info.get("suggestion") if isinstance(info, dict) else None
    return [hit["title"] for hit in hits], suggestion if isinstance(suggestion, str) else None


def _render(summary: dict[str, Any], title: str, base: str) -> str:
    name = str(summary.get("title") or title)
    extract = trim(str(summary.get("extract") or ""), EXTRACT_CHARS)
    urls = summary.get("content_urls")
    page = urls.get("desktop", {}).get("page") if isinstance(urls, dict) else None
    url = page if isinstance(page, str) else f"{base}/wiki/{quote(title.replace(' ', '_'))}"
    return f"{name}\n\n{extract or '(The article has no summary.)'}\n\nURL: {url}"
