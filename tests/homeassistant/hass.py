"""A real Home Assistant 2025.4 for the end-to-end tests of the Bernard integration.

`start_home_assistant` runs `hass -c <dir> --skip-pip` from the venv that
integrations/homeassistant/tests/setup builds (Python 3.13), on a free loopback port, with
tests/homeassistant/config/ as its configuration (a small house in YAML, and a test
satellite) and the integration copied into its `custom_components`. It onboards it as a
person would, through its own HTTP API (the owner, then the steps that need nothing from
the internet), and makes a
long-lived access token on its websocket API, as its profile page does. `stop()` ends it.

`HomeAssistantApi` is what a test says to it, over the same APIs: REST with the token, and
websocket commands (`command`), including an Assist pipeline run from a device
(`run_pipeline`, as a satellite starts one) with every event it sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.sync.client import connect as connect_sync

from launcher.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
INTEGRATION = ROOT / "integrations" / "homeassistant"
SETUP = INTEGRATION / "tests" / "setup"
HA_VENV = Path(os.environ.get("BERNARD_HA_VENV") or INTEGRATION / ".venv")
CONFIG = Path(__file__).resolve().parent / "config"
OWNER = {"name": "Test Owner", "username": "owner", "password": "owner-password-1"}
START_TIMEOUT_S = 180.0


def venv_problem() -> str | None:
    """Why the Home Assistant venv cannot run these tests (a skip reason), or None."""
    setup = SETUP.relative_to(ROOT)
    if not (HA_VENV / "bin" / "hass").exists():
        return (
            f"no Home Assistant test venv at {HA_VENV}: run {setup} (it needs Python 3.13, "
            "which Home Assistant 2025.4 requires; .ci/run does it)"
        )
    pins = b"".join(
        (SETUP.parent / name).read_bytes() for name in ("requirements.txt", "constraints.txt")
    )
    stamp = HA_VENV / ".bernard-requirements.sha256"
    if not stamp.exists() or stamp.read_text().strip() != hashlib.sha256(pins).hexdigest():
        return f"the Home Assistant test venv at {HA_VENV} is out of date: run {setup}"
    return None


@dataclass
class HomeAssistant:
    """A running Home Assistant: its URL, an owner's long-lived token, its files."""

    url: str
    token: str
    config_dir: Path
    process: subprocess.Popen[bytes]
    output: Path

    def log(self) -> str:
        """Everything Home Assistant logged so far (its log file and its console)."""
        return "\n".join(text for text in self._logs() if text)

    def _logs(self) -> list[str]:
        """Its log file and its console, as written so far."""
        files = (self.config_dir / "home-assistant.log", self.output)
        return [p.read_text(errors="replace") if p.exists() else "" for p in files]

    def log_mark(self) -> tuple[int, ...]:
        """Where its log file and its console end now (for `logged_since`): one mark for
        each, since a mark into the two joined would skip what the first wrote since."""
        return tuple(len(text) for text in self._logs())

    async def logged_since(self, mark: tuple[int, ...], text: str, timeout_s: float = 10) -> str:
        """What it logged since `mark`, once `text` is in it (or after `timeout_s`): Home
        Assistant writes its log from a queue, a moment after the call that logged."""
        deadline = time.monotonic() + timeout_s
        while True:
            since = "\n".join(log[at:] for log, at in zip(self._logs(), mark, strict=True))
            if text in since or time.monotonic() > deadline:
                return since
            await asyncio.sleep(0.05)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def start_home_assistant(workdir: Path) -> HomeAssistant:
    """Start, onboard and return a Home Assistant; it is stopped if any step fails."""
    port = free_port()
    config_dir = workdir / "config"
    shutil.copytree(CONFIG, config_dir)
    yaml = config_dir / "configuration.yaml"
    yaml.write_text(yaml.read_text().replace("${HA_PORT}", str(port)))
    shutil.copytree(
        INTEGRATION / "custom_components" / "bernard",
        config_dir / "custom_components" / "bernard",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    output = workdir / "hass.out"
    with output.open("wb") as out:
        process = subprocess.Popen(
            [str(HA_VENV / "bin" / "hass"), "-c", str(config_dir), "--skip-pip"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    home = HomeAssistant(url, "", config_dir, process, output)
    try:
        _wait_until_up(home)
        home.token = _onboard(url)
        _wait_until_running(home)
    except BaseException:
        home.stop()
        raise
    return home


def _wait_until_up(home: HomeAssistant) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    with httpx.Client(base_url=home.url, timeout=2.0) as http:
        while True:
            if home.process.poll() is not None:
                raise RuntimeError(f"hass exited with {home.process.returncode}:\n{home.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if http.get("/api/onboarding").status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"Home Assistant did not answer in {START_TIMEOUT_S} s")
            time.sleep(0.25)


def _onboard(url: str) -> str:
    """Onboard as the first person to open Home Assistant does; the owner's long-lived
    access token."""
    client_id = f"{url}/"
    with httpx.Client(base_url=url, timeout=30.0) as http:
        made = http.post(
            "/api/onboarding/users", json={"client_id": client_id, "language": "en", **OWNER}
        )
        made.raise_for_status()
        tokens = http.post(
            "/auth/token",
            data={
                "grant_type": "authorization_code",
                "code": made.json()["auth_code"],
                "client_id": client_id,
            },
        )
        tokens.raise_for_status()
        access = tokens.json()["access_token"]
        auth = {"Authorization": f"Bearer {access}"}
        # Not `core_config`: finishing it sets up the integrations a new house gets
        # (weather, radio, translation), which need packages and the internet.
        for step, body in [
            ("analytics", {}),
            ("integration", {"client_id": client_id, "redirect_uri": f"{url}/?auth_callback=1"}),
        ]:
            http.post(f"/api/onboarding/{step}", json=body, headers=auth).raise_for_status()
    with connect_sync(_websocket_url(url)) as ws:
        _authenticate_sync(ws, access)
        ws.send(
            json.dumps(
                {
                    "id": 1,
                    "type": "auth/long_lived_access_token",
                    "client_name": "bernard-tests",
                    "lifespan": 30,
                }
            )
        )
        answer = json.loads(ws.recv(timeout=30))
    assert answer["success"], answer
    return str(answer["result"])


def _authenticate_sync(ws: Any, token: str) -> None:
    assert json.loads(ws.recv(timeout=30))["type"] == "auth_required"
    ws.send(json.dumps({"type": "auth", "access_token": token}))
    reply = json.loads(ws.recv(timeout=30))
    assert reply["type"] == "auth_ok", reply


def _wait_until_running(home: HomeAssistant) -> None:
    """Home Assistant answers during its start; wait until every integration is set up."""
    deadline = time.monotonic() + START_TIMEOUT_S
    headers = {"Authorization": f"Bearer {home.token}"}
    with httpx.Client(base_url=home.url, timeout=5.0, headers=headers) as http:
        while http.get("/api/config").json().get("state") != "RUNNING":
            if time.monotonic() > deadline:
                raise TimeoutError(f"Home Assistant did not finish starting:\n{home.log()}")
            time.sleep(0.25)


def _websocket_url(url: str) -> str:
    return url.replace("http://", "ws://", 1) + "/api/websocket"


class HomeAssistantApi:
    """One test's conversation with a Home Assistant, as an authenticated owner."""

    def __init__(self, home: HomeAssistant) -> None:
        self.home = home
        self.http = httpx.AsyncClient(
            base_url=home.url,
            headers={"Authorization": f"Bearer {home.token}"},
            timeout=httpx.Timeout(60.0),
        )
        self._ids = 0

    async def aclose(self) -> None:
        await self.http.aclose()

    async def state(self, entity_id: str) -> dict[str, Any]:
        response = await self.http.get(f"/api/states/{entity_id}")
        response.raise_for_status()
        return dict(response.json())

    async def call_service(self, domain: str, service: str, **data: Any) -> None:
        response = await self.http.post(f"/api/services/{domain}/{service}", json=data)
        response.raise_for_status()

    async def process(self, text: str, agent_id: str, **more: Any) -> dict[str, Any]:
        """`POST /api/conversation/process`: the conversation result."""
        body = {"text": text, "agent_id": agent_id, "language": "en", **more}
        response = await self.http.post("/api/conversation/process", json=body)
        response.raise_for_status()
        return dict(response.json())

    async def flow(self, handler: str, form: dict[str, Any]) -> dict[str, Any]:
        """A config flow through the REST API the UI uses: its first form, then `form`."""
        started = await self.http.post("/api/config/config_entries/flow", json={"handler": handler})
        started.raise_for_status()
        assert started.json()["type"] == "form", started.json()
        flow_id = started.json()["flow_id"]
        answered = await self.http.post(f"/api/config/config_entries/flow/{flow_id}", json=form)
        answered.raise_for_status()
        return dict(answered.json())

    async def remove_entry(self, entry_id: str) -> None:
        response = await self.http.delete(f"/api/config/config_entries/entry/{entry_id}")
        response.raise_for_status()

    @contextlib.asynccontextmanager
    async def websocket(self) -> AsyncIterator[ClientConnection]:
        async with connect(_websocket_url(self.home.url), max_size=None) as ws:
            assert json.loads(await ws.recv())["type"] == "auth_required"
            await ws.send(json.dumps({"type": "auth", "access_token": self.home.token}))
            reply = json.loads(await ws.recv())
            assert reply["type"] == "auth_ok", reply
            yield ws

    async def command(self, type_: str, **fields: Any) -> Any:
        """One websocket command's result (a failure raises with Home Assistant's error)."""
        async with self.websocket() as ws:
            await ws.send(json.dumps({"id": 1, "type": type_, **fields}))
            while True:
                message = json.loads(await ws.recv())
                if message.get("id") == 1 and message["type"] == "result":
                    break
        if not message["success"]:
            raise RuntimeError(f"{type_}: {message['error']}")
        return message["result"]

    async def run_pipeline(
        self,
        text: str,
        *,
        pipeline: str,
        device_id: str | None = None,
        conversation_id: str | None = None,
    ) -> list[dict[str, Any]]:
        """An Assist pipeline run from text to the agent's answer, as a satellite starts one
        (`assist_pipeline/run` from the intent stage): every event, in order, to `run-end`."""
        events: list[dict[str, Any]] = []
        async with self.websocket() as ws:
            await ws.send(
                json.dumps(
                    {
                        "id": 1,
                        "type": "assist_pipeline/run",
                        "start_stage": "intent",
                        "end_stage": "intent",
                        "input": {"text": text},
                        "pipeline": pipeline,
                        "device_id": device_id,
                        "conversation_id": conversation_id,
                    }
                )
            )
            while True:
                message = json.loads(await ws.recv())
                if message["type"] == "result":
                    assert message["success"], message
                    continue
                event = message["event"]
                events.append({**event, "received": time.monotonic()})
                if event["type"] in ("run-end", "error"):
                    return events
