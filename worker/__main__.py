"""`python -m worker [SETTINGS] [-v]`: run a Bernard worker (the Procfile's `worker`).

SETTINGS is the import path of the worker's settings class (default
`worker.main.WorkerSettings`, what the environment configures). The worker is
worker/queue.py's `WakeWorker`, an extension of arq's `Worker` (compat/arq.py), on uvloop:
arq's own command line (`arq worker.main.WorkerSettings`) would build a plain `Worker`,
which Bernard's start-up refuses. `-v` logs arq's own debug lines.
"""

from __future__ import annotations

import argparse
import asyncio
import logging.config
import sys
from collections.abc import Sequence

import uvloop
from arq.logs import default_log_config
from arq.utils import import_string

DEFAULT_SETTINGS = "worker.main.WorkerSettings"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker", description=__doc__.splitlines()[0])
    parser.add_argument("settings", nargs="?", default=DEFAULT_SETTINGS)
    parser.add_argument("-v", "--verbose", action="store_true", help="arq's debug lines too")
    args = parser.parse_args(argv)
    logging.config.dictConfig(default_log_config(args.verbose))
    settings_cls = import_string(args.settings)
    # As uvicorn runs the API: arq's `Worker` makes its loop from the policy. Under 100
    # streaming turns the default loop's socket writes alone were 7 % of the worker's CPU
    # (docs/benchmarks.md, cost per token).
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    from worker.main import worker_from

    worker_from(settings_cls).run()  # until SIGINT or SIGTERM; closes its connections
    return 0


if __name__ == "__main__":
    sys.exit(main())
