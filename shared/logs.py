"""Logging for Bernard's own `bernard.*` loggers.

arq and uvicorn configure only their own loggers, so without this Bernard's info lines
(which model the worker runs, for one) would never show.
"""

from __future__ import annotations

import logging


def configure_logging(level: int = logging.INFO) -> None:
    """Give the `bernard` logger a stderr handler unless something configured it already."""
    logger = logging.getLogger("bernard")
    if logger.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
