"""The worker's jobs and settings: `python -m worker` (worker/__main__.py) runs them.

Jobs: `run_turn(turn_id)`; `fire_timer(owner, timer_id)` when a timer is due;
`summarize_conversation(owner, conversation_id, until, incarnation)` when a conversation
outgrew its prompts; `title_conversation(owner, conversation_id)` after a conversation's
first exchange; `deliver_webhook(owner, turn_id, type, url, created_at, subject)` when a background
turn with a webhook ends (worker/webhooks.py). Each worker process runs up to
`BERNARD_WORKER_CONCURRENCY` turns at once (turns wait on the network, not the CPU), picks
new ones up through the wake list of `worker.queue`, and keeps no arq results: a turn's
output lives in its stream.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import uuid
from typing import Any

from arq import func
from arq.worker import Worker

from compat.arq import worker_kwargs
from shared.connection import connect, connect_data, queue_client
from shared.logs import configure_logging, hide_in_logs
from shared.queue import RUN_TURN, SUMMARIZE, TITLE, BackgroundLimits
from shared.redis_checks import warn_if_evicting
from shared.settings import Settings, get_settings
from shared.timers import FIRE_TIMER, fire_timer
from shared.traces import configure_tracing, flush_tracing
from shared.webhooks import DELIVER_WEBHOOK
from worker.llm import Models, build_models
from worker.queue import WAKE_OPTIONS, WakeWorker
from worker.summaries import summarize
from worker.supervisor import ENDING_RETRY_S, TurnSupervisor
from worker.titles import name_conversation
from worker.tools.policy import policy_of
from worker.tools.runtime import http_client
from worker.tools.settings import ToolSettings
from worker.tools.sources import read_tool_settings
from worker.turn import run_to_sinks
from worker.webhooks import ATTEMPT_MARGIN_S as WEBHOOK_MARGIN_S
from worker.webhooks import WEBHOOK_CLIENT, deliver

logger = logging.getLogger("bernard.worker")


async def startup(ctx: dict[str, Any]) -> None:
    if not ctx.get(WakeWorker.MARK):
        # arq's own command line builds its plain `Worker`: no wake list, no background
        # budgets, no fair order, half a second more before every turn.
        raise RuntimeError(
            "a Bernard worker runs as `python -m worker` (arq's command line would run it "
            "without Bernard's job pickup)"
        )
    settings: Settings = ctx.get("settings") or get_settings()
    configure_logging(settings)
    # Each tool source's own settings, declared in its module (worker/tools/settings.py);
    # their secrets join those the logs hide (shared/logs.py knows no tool source).
    tool_settings: ToolSettings = ctx.get("tool_settings") or read_tool_settings()
    hide_in_logs(tool_settings.secrets())
    # A policy file that is no policy stops the worker here, saying what is wrong in it,
    # rather than at a turn's first call.
    policy_of(settings)
    traced = configure_tracing(settings, "bernard-worker")
    redis = connect_data(settings.redis_url)
    # The queue role: the data client when one Redis holds both, else arq's own client.
    queue = queue_client(settings, redis, lambda: ctx["redis"])
    models = build_models(settings)
    worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    supervisor = TurnSupervisor(
        redis,
        settings,
        router=models.router,
        responder=models.responder,
        run_to_sinks=run_to_sinks,
        worker_id=worker_id,
        # None: the tools the tool settings enable. Set by tests (tests/support/stack.py
        # `make_worker`), as are the settings and the tool settings.
        tools=ctx.get("tools"),
        tool_settings=tool_settings,
        http=(http := http_client(settings)),
        queue=queue,
    )
    await supervisor.start()  # publishes the tools it offers (worker/tools/catalog.py)
    ctx[WakeWorker.REFUSE_FULL] = supervisor.refuse_full
    ctx.update(
        settings=settings,
        bernard_redis=redis,
        bernard_queue=queue,
        supervisor=supervisor,
        models=models,
        http=http,
        traced=traced,
    )
    # Modules, LangChain's and pydantic's machinery, the clients: all live as long as the
    # process. Frozen, they are no longer scanned by the collector's full passes, which
    # otherwise stalled the worker's loop for 100-130 ms (every turn in flight stalled, the
    # p99 of first tokens and of the relay with it).
    gc.freeze()
    if settings.demo_mode:
        logger.info(
            "Bernard worker %s ready on the offline demo model "
            "(set OPENAI_BASE_URL or OPENAI_API_KEY to use a real LLM)",
            worker_id,
        )
    else:
        logger.info(
            "Bernard worker %s ready: router %s, response %s at %s",
            worker_id,
            settings.router_model,
            settings.response_model,
            settings.openai_base_url or "api.openai.com",
        )
    warning = settings.slot_warning()
    if warning is not None:
        logger.warning(warning)
    await warn_if_evicting(redis, logger)
    if queue is not redis:
        await warn_if_evicting(queue, logger)


async def shutdown(ctx: dict[str, Any]) -> None:
    if "supervisor" in ctx:
        await ctx["supervisor"].stop()
        await ctx["bernard_redis"].aclose()
        await ctx["models"].aclose()
        await ctx["http"].aclose()
        if WEBHOOK_CLIENT in ctx:
            await ctx[WEBHOOK_CLIENT].aclose()
        if ctx.get("traced"):
            flush_tracing()


async def run_turn(ctx: dict[str, Any], turn_id: str) -> str:
    """Run one turn to its end; the status it ended with is the job's result."""
    supervisor: TurnSupervisor = ctx["supervisor"]
    return await supervisor.run(turn_id)


async def fire(ctx: dict[str, Any], owner: str, timer_id: str) -> str:
    """A timer is due: ring it (shared/timers.py)."""
    settings: Settings = ctx["settings"]
    return await fire_timer(
        ctx["bernard_redis"],
        owner,
        timer_id,
        retention_s=settings.conversation_retention_s,
        queue_name=settings.queue_name,
        queue=ctx["bernard_queue"],
    )


async def summarize_conversation(
    ctx: dict[str, Any],
    owner: str,
    conversation_id: str,
    until: int,
    incarnation: str | None = None,
) -> str:
    """Fold a conversation's older messages into its summary (worker/summaries.py)."""
    models: Models = ctx["models"]
    return await summarize(
        ctx["bernard_redis"],
        models.router,
        ctx["settings"],
        owner,
        conversation_id,
        until,
        incarnation=incarnation,
    )


async def title_conversation(ctx: dict[str, Any], owner: str, conversation_id: str) -> str:
    """Name a conversation after its first exchange (worker/titles.py)."""
    models: Models = ctx["models"]
    return await name_conversation(
        ctx["bernard_redis"], models.router, ctx["settings"], owner, conversation_id
    )


def worker_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for arq's `Worker`, from Bernard's settings."""
    return {
        # max_tries=1: a job delivered again after a crash must not run the turn again.
        "functions": [
            func(run_turn, name=RUN_TURN, max_tries=1),
            # A timer fires once however often its job runs (shared/timers.py): retried.
            func(fire, name=FIRE_TIMER, max_tries=3),
            # A summary or a title stopped by its worker's shutdown runs again on another
            # (worker/queue.py); each only ever moves its conversation forward.
            func(summarize_conversation, name=SUMMARIZE, max_tries=3),
            func(title_conversation, name=TITLE, max_tries=3),
            # Each attempt a run; its retries are its own (`Retry`), and a shutdown's
            # cancellation costs a try too: a few to spare.
            func(
                deliver,
                name=DELIVER_WEBHOOK,
                max_tries=len(settings.webhook_retry_delays_s()) + 4,
                timeout=settings.webhook_timeout_s + WEBHOOK_MARGIN_S,
            ),
        ],
        "on_startup": startup,
        "on_shutdown": shutdown,
        "queue_name": settings.queue_name,
        # arq's own client would use redis-py's default pool (see shared.connection).
        "redis_pool": connect(settings.queue_url),
        "max_jobs": settings.worker_concurrency,
        # Above the cluster's concurrency and every background job the queue may hold
        # (workers may leave those queued), or new turns starve behind them.
        "queue_read_limit": max(settings.worker_concurrency * 4, 1000)
        + settings.max_background_jobs,
        # WakeWorker's own (worker/queue.py): what background jobs may take.
        "background": BackgroundLimits.of(settings),
        "background_share": settings.worker_background_share,
        "user_share": settings.worker_user_share,
        # A turn's own timeout, then the time its ending may take to land (a failover).
        "job_timeout": settings.turn_timeout_s + ENDING_RETRY_S + 30,
        "keep_result": 0,
        "max_tries": 1,
        "health_check_interval": 10,
        # On SIGTERM, let running turns finish (arq stops picking new ones meanwhile).
        "job_completion_wait": int(min(settings.turn_timeout_s, 60)),
    }


def worker_from(settings_cls: Any) -> Worker:
    """The worker a settings class (`WorkerSettings`, or one like it) describes."""
    return WakeWorker(**worker_kwargs(settings_cls, *WAKE_OPTIONS))


WorkerSettings = type(
    "WorkerSettings",
    (),
    {
        "__doc__": "What `python -m worker` builds its `WakeWorker` from (the environment's).",
        **worker_options(get_settings()),
    },
)
