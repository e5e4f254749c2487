"""`python -m launcher [serve]`: what `./run` calls."""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import httpx
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from rich.console import Console
from rich.markup import escape

from launcher.children import Supervisor
from launcher.redis_server import (
    RedisUnavailable,
    free_port,
    ping_error,
    port_is_free,
    start_embedded_redis,
)
from shared import keys
from shared.connection import REDIS_ERRORS, connect_data, redact
from shared.deployment import base_url_of, models_request
from shared.settings import LOCAL_USER, MODEL_ID, Settings

# Under the repository root (`./run` runs from there); gitignored.
STATE_DIR = Path(".bernard")
# How long a Redis named by REDIS_URL has to answer PING (a remote one may need a TLS
# handshake) before `./run` gives up.
SET_REDIS_TIMEOUT_S = 3.0
# How long the upstream LLM has to answer `GET /models` before `./run` gives up on it.
UPSTREAM_TIMEOUT_S = 5.0


# What a Redis that cannot say raises (ValueError: a URL the client cannot use).
_NO_ANSWER: tuple[type[Exception], ...] = (*REDIS_ERRORS, TimeoutError, ValueError)


class UpstreamUnavailable(RuntimeError):
    """The upstream LLM the settings name does not answer, or refuses the key."""


def worker_argv(python: str) -> list[str]:
    """The Procfile's `worker` command, run by `python`."""
    return [python, "-m", "worker"]


def api_argv(python: str, host: str, port: int) -> list[str]:
    """The Procfile's `api` command, run by `python`."""
    return [python, "-m", "uvicorn", "api.main:app", "--host", host, "--port", str(port)]


def demo_home_argv(python: str, port: int) -> list[str]:
    """The demo home (launcher/demo_home.py) on 127.0.0.1:`port`, run by `python`."""
    return [python, "-m", "launcher.demo_home", "--port", str(port)]


@dataclass(frozen=True)
class DemoHomeEndpoint:
    """The pretend Home Assistant a first run talks to: where it listens, what it accepts."""

    port: int
    token: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """What the demo home and the worker read: the same URL and token."""
        return {"BERNARD_HA_URL": self.url, "BERNARD_HA_TOKEN": self.token}


class HomeAssistantSet(BaseSettings):
    """Home Assistant's address as the worker reads it (worker/tools/home_assistant/config.py
    `HomeAssistantSettings` declares it; the launcher imports shared/ only), for the one
    question the launcher asks of it: whether a demo home should stand in."""

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", populate_by_name=True)

    ha_url: str | None = Field(None, alias="BERNARD_HA_URL")


def demo_home_for(settings: Settings, ha_url: str | None) -> DemoHomeEndpoint | None:
    """The demo home to start: only on the offline demo model with no Home Assistant set
    (`ha_url`, from `HomeAssistantSet`)."""
    if not settings.demo_mode or ha_url:
        return None
    return DemoHomeEndpoint(port=free_port(), token=secrets.token_urlsafe(24))


def connect_host(host: str) -> str:
    """Where a local client reaches a server bound to `host`."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def http_ok(url: str, timeout_s: float = 1.0) -> bool:
    """True when GET `url` answers 2xx. Ignores proxy settings: the server is local."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout_s) as response:
            return 200 <= int(response.status) < 300
    except OSError:
        return False


def curl_command(base_url: str, with_api_key: bool) -> str:
    """A ready-to-paste curl for a streaming chat completion."""
    body = (
        f'{{"model": "{MODEL_ID}", "stream": true, '
        '"messages": [{"role": "user", "content": "What is 17 * 23?"}]}'
    )
    lines = [f"curl -N {base_url}/v1/chat/completions", "-H 'Content-Type: application/json'"]
    if with_api_key:
        lines.append('-H "Authorization: Bearer <key>"')
    lines.append(f"-d {shlex.quote(body)}")
    return " \\\n  ".join(lines)


def model_line(settings: Settings) -> str:
    if settings.demo_mode:
        return "Model: offline demo model (set OPENAI_BASE_URL / OPENAI_API_KEY for a real LLM)"
    upstream = redact(settings.openai_base_url) if settings.openai_base_url else "OpenAI"
    return f"Model: {upstream} (router {settings.router_model}, response {settings.response_model})"


_UPSTREAM_VARIABLES = {
    "openai": ("OPENAI_BASE_URL", "OPENAI_API_KEY"),
    "anthropic": ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"),
}


def check_upstream(settings: Settings, timeout_s: float = UPSTREAM_TIMEOUT_S) -> str | None:
    """The line `./run` prints about the upstream LLM (None on the offline demo model).

    Each upstream the two models use must answer `GET /models` within `timeout_s`: one
    that does not answer, or refuses the key, raises UpstreamUnavailable naming it
    (password hidden), as a REDIS_URL that does not answer does, having started nothing:
    every turn would fail. Any other answer (a server without `/models`) is said, and
    `./run` goes on.
    """
    if settings.demo_mode:
        return None
    said: list[str] = []
    for provider in dict.fromkeys((settings.router_provider, settings.response_provider)):
        base = base_url_of(provider, settings)
        url, headers = models_request(provider, base, settings)
        where, key = _UPSTREAM_VARIABLES[provider]
        try:
            response = httpx.get(url, headers=headers, timeout=timeout_s, trust_env=True)
        except httpx.HTTPError as exc:
            raise UpstreamUnavailable(
                f"no model server answers at {redact(base)} ({where}): "
                f"{str(exc) or type(exc).__name__}; start it or fix {where} (with {where} "
                f"and {key} unset, Bernard runs its offline demo model)"
            ) from None
        if response.status_code in (401, 403):
            raise UpstreamUnavailable(
                f"the model server at {redact(base)} ({where}) refuses the key: "
                f"GET {redact(url)} answers {response.status_code}; check {key}"
            )
        if response.status_code >= 400:
            said.append(
                f"{redact(base)} answers GET /models with {response.status_code}; "
                "going on (turns will tell whether it works)"
            )
        else:
            said.append(f"{redact(base)} answers")
    return f"Upstream: {'; '.join(said)}"


def command_line() -> str | None:
    """What the banner says of the `bernard` command: its full path, unless PATH finds this
    very one (None when it is not installed beside this Python)."""
    here = Path(sys.executable).absolute().parent  # not resolved: the venv's own bin
    command = here / "bernard"
    if not command.exists():
        return None
    found = shutil.which("bernard")
    if found is not None and Path(found).absolute() == command:
        return "Command line: bernard chat (bernard doctor checks this server)"
    return (
        f"Command line: {command} chat (add {here} to PATH to type just bernard; "
        "bernard doctor checks this server)"
    )


def local_conversations_note(settings: Settings, redis_url: str) -> str | None:
    """With BERNARD_API_KEYS set and no key for the user `local`: a note that the
    conversations made while the API was open (they are `local`'s) are out of every
    key's reach, when Redis holds some (None otherwise, or when Redis cannot say)."""
    users = settings.api_key_users()
    if not users or LOCAL_USER in users.values():
        return None

    async def count() -> int:
        client = connect_data(redis_url, retries=0)
        try:
            async with asyncio.timeout(SET_REDIS_TIMEOUT_S):
                return int(await client.zcard(keys.conversations(LOCAL_USER)))
        finally:
            await client.aclose()

    try:
        held = asyncio.run(count())
    except _NO_ANSWER:
        return None
    if not held:
        return None
    return (
        f"Note: {held} conversation(s) made while BERNARD_API_KEYS was unset belong to the "
        f"user {LOCAL_USER!r}, which no key maps to: they are hidden. To keep them, map a "
        f"key to it: BERNARD_API_KEYS=<key>:{LOCAL_USER},..."
    )


def print_banner(
    console: Console, base_url: str, settings: Settings, notes: list[str] | None = None
) -> None:
    console.print(f"\n[bold green]Bernard is ready[/] at [bold]{base_url}[/]")
    console.print(f"Open the playground in a browser: {base_url}/", markup=False)
    console.print(model_line(settings), markup=False)
    command = command_line()
    if command is not None:
        console.print(command, markup=False, highlight=False)
    for note in notes or []:
        console.print(note, markup=False, highlight=False, style="yellow")
    console.print("Try a streaming chat completion:\n")
    console.print(
        curl_command(base_url, bool(settings.api_key_users())), markup=False, highlight=False
    )
    if settings.api_key_users():
        console.print("\n(<key> is one of the keys in BERNARD_API_KEYS)", markup=False)
    console.print("\nCtrl-C stops everything.\n")


@dataclass(frozen=True)
class RunRedis:
    """The Redis a `./run` uses."""

    url: str  # what the worker and the API get as REDIS_URL
    process: subprocess.Popen[bytes] | None  # the embedded server, to stop last; else None
    description: str  # the line `./run` prints about it


def configured_redis_url(settings: Settings) -> str | None:
    """REDIS_URL as set in the environment or .env (what the children read), else None."""
    return settings.redis_url if "redis_url" in settings.model_fields_set else None


def choose_redis(configured: str | None, state_dir: Path) -> RunRedis:
    """The Redis to run against: the one REDIS_URL names, or the embedded one.

    REDIS_URL unset (`configured` None): start the embedded Redis, persisted in
    `state_dir`. REDIS_URL set: it must answer PING, or this raises RedisUnavailable
    (naming the URL, password hidden) having started nothing; never another server.
    """
    if configured is None:
        embedded = start_embedded_redis(state_dir)
        where = f"Redis: embedded at {embedded.url}, data in {embedded.data_dir} (persisted)"
        if embedded.process is None:
            where += "; it was already running and is left running"
        return RunRedis(embedded.url, embedded.process, where)

    reason = ping_error(configured, timeout_s=SET_REDIS_TIMEOUT_S)
    if reason is not None:
        raise RedisUnavailable(
            f"no Redis answers at {redact(configured) or repr(configured)} (REDIS_URL); "
            f"start it or unset REDIS_URL to use the embedded one ({reason})"
        )
    return RunRedis(configured, None, f"Redis: using {redact(configured)} (REDIS_URL)")


def check_queue_redis(queue_redis_url: str | None) -> str | None:
    """The line `./run` prints about BERNARD_QUEUE_REDIS_URL (None when it is not set: the
    queue lives on REDIS_URL's Redis). Set, it must answer PING, or this raises
    RedisUnavailable, naming it with its password hidden."""
    if queue_redis_url is None:
        return None
    reason = ping_error(queue_redis_url, timeout_s=SET_REDIS_TIMEOUT_S)
    if reason is not None:
        raise RedisUnavailable(
            f"no Redis answers at {redact(queue_redis_url) or repr(queue_redis_url)} "
            "(BERNARD_QUEUE_REDIS_URL); start it or unset BERNARD_QUEUE_REDIS_URL to keep "
            f"the queue on REDIS_URL's Redis ({reason})"
        )
    return f"Queue: using {redact(queue_redis_url)} (BERNARD_QUEUE_REDIS_URL)"


def serve(console: Console) -> int:
    """Run Redis (the embedded one unless REDIS_URL is set), the demo home (on the demo
    model without BERNARD_HA_URL), the worker and the API.

    Runs until Ctrl-C or a child dies, then stops them all, Redis last.
    """
    settings = Settings()  # reads the environment and .env, as the children will
    host = os.environ.get("HOST", "127.0.0.1")
    port = int(os.environ.get("PORT", "8000"))
    if not port_is_free(port, host):
        console.print(f"[red]error:[/] {host}:{port} is in use; set PORT to another port.")
        return 1

    env = dict(os.environ)
    supervisor = Supervisor()
    supervisor.handle_signals()
    try:
        queue = check_queue_redis(settings.queue_redis_url)  # before anything is started
        upstream = check_upstream(settings)
        redis = choose_redis(configured_redis_url(settings), STATE_DIR)
        if redis.process is not None:
            supervisor.adopt("redis", redis.process)  # first in, so stopped last
        env["REDIS_URL"] = redis.url
        console.print(redis.description, markup=False)
        if queue is not None:
            console.print(queue, markup=False)
        if upstream is not None:
            console.print(upstream, markup=False)
        notes = [note] if (note := local_conversations_note(settings, redis.url)) else []

        home = demo_home_for(settings, HomeAssistantSet().ha_url)
        if home is not None:  # before the worker, so it stops after it
            env.update(home.env())
            supervisor.spawn("demo-home", demo_home_argv(sys.executable, home.port), env)
            console.print(
                f"Home Assistant: a demo home at {home.url} (three lights, a fan, a "
                "thermostat); try “Turn on the kitchen light”, then “Undo that”",
                markup=False,
            )

        supervisor.spawn("worker", worker_argv(sys.executable), env)
        supervisor.spawn("api", api_argv(sys.executable, host, port), env)
        base_url = f"http://{connect_host(host)}:{port}"
        return supervisor.watch(
            console,
            ready=lambda: http_ok(f"{base_url}/healthz"),
            on_ready=lambda: print_banner(console, base_url, settings, notes),
        )
    finally:
        supervisor.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher", description=__doc__)
    parser.add_argument(
        "command",
        nargs="?",
        default="serve",
        choices=["serve"],
        help="serve: run Bernard (the default)",
    )
    parser.parse_args(argv)
    console = Console(soft_wrap=True)
    try:
        return serve(console)
    except (RedisUnavailable, UpstreamUnavailable) as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        return 1
