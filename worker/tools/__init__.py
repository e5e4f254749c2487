"""The tools the router may call, each a LangChain tool that may report live progress.

A tool that reports progress takes `config: RunnableConfig` and calls
`get_reporter(config)`; see `worker.tools.progress` for how the router passes the reporter.
"""

from __future__ import annotations

from langchain_core.tools import BaseTool

from worker.tools.calculator import calculator
from worker.tools.progress import ProgressReporter, get_reporter, progress_config
from worker.tools.time import get_time

__all__ = [
    "ProgressReporter",
    "calculator",
    "default_tools",
    "get_reporter",
    "get_time",
    "progress_config",
]


def default_tools() -> list[BaseTool]:
    """The tools a turn gets unless configured otherwise; a new list each call."""
    return [calculator, get_time]
