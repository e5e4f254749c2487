"""`python -m launcher [serve | test-redis]`: what `./run` and `./run test` call."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import urllib.request
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from launcher.redis_server import (
    RedisUnavailable,
    ensure_test_redis,
    find_redis_binary,
    free_port,
    local_url,
    port_is_free,
    redact,
    redis_answers,
    start_redis,
)
from launcher.supervisor import Supervisor
from shared.settings import MODEL_ID, Settings

# Under the repository root (`./run` runs from there); gitignored.
STATE_DIR = Path(".bernard")


def worker_argv(python: str) -> list[str]:
    """The Procfile's `worker` command, run by `python`."""
    return [python, "-m", "arq", "worker.main.WorkerSettings"]


def api_argv(python: str, host: str, port: int) -> list[str]:
    """The Procfile's `api` command, run by `python`."""
    return [python, "-m", "uvicorn", "api.main:app", "--host", host, "--port", str(port)]


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
    upstream = settings.openai_base_url or "OpenAI"
    return f"Model: {upstream} (router {settings.router_model}, response {settings.response_model})"


def print_banner(console: Console, base_url: str, settings: Settings) -> None:
    console.print(f"\n[bold green]Bernard is ready[/] at [bold]{base_url}[/]")
    console.print(model_line(settings), markup=False)
    console.print("Try a streaming chat completion:\n")
    console.print(
        curl_command(base_url, bool(settings.api_key_users())), markup=False, highlight=False
    )
    if settings.api_key_users():
        console.print("\n(<key> is one of the keys in BERNARD_API_KEYS)", markup=False)
    console.print("\nCtrl-C stops everything.\n")


def serve(console: Console) -> int:
    """Run Redis (if none answers), the worker and the API until Ctrl-C or a child dies."""
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
        if redis_answers(settings.redis_url):
            console.print(f"Redis: using {redact(settings.redis_url)}", markup=False)
        else:
            binary = find_redis_binary()
            redis_port = free_port()
            supervisor.adopt("redis", start_redis(binary, redis_port, STATE_DIR))
            env["REDIS_URL"] = local_url(redis_port, like=settings.redis_url)
            console.print(
                f"Redis: none answered at {redact(settings.redis_url)}; started {binary} at "
                f"{env['REDIS_URL']} (in memory, stopped on exit)",
                markup=False,
            )

        supervisor.spawn("worker", worker_argv(sys.executable), env)
        supervisor.spawn("api", api_argv(sys.executable, host, port), env)
        base_url = f"http://{connect_host(host)}:{port}"
        return supervisor.watch(
            console,
            ready=lambda: http_ok(f"{base_url}/healthz"),
            on_ready=lambda: print_banner(console, base_url, settings),
        )
    finally:
        supervisor.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher", description=__doc__)
    parser.add_argument(
        "command",
        nargs="?",
        default="serve",
        choices=["serve", "test-redis"],
        help="serve: run Bernard (default); test-redis: print the URL of a Redis for tests",
    )
    args = parser.parse_args(argv)
    console = Console(stderr=args.command == "test-redis", soft_wrap=True)  # stdout: the URL
    try:
        if args.command == "test-redis":
            print(ensure_test_redis(os.environ.get("REDIS_URL"), STATE_DIR))
            return 0
        return serve(console)
    except RedisUnavailable as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        return 1
