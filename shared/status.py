"""`GET /v1/status`'s answer (api/status.py builds it; `bernard doctor` reads it): one shape
for the server that writes it and the clients that read it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from shared.backends import Kind
from shared.deployment import ModelFacts
from shared.mcp_health import McpServerStatus
from shared.redis_checks import ServerFacts


class Probe(BaseModel):
    """One request to a model's or a service's URL: whether anything answered, its HTTP
    status, and what to tell a person."""

    reachable: bool
    status: int | None
    detail: str


class ModelStatus(ModelFacts):
    probe: Probe | None  # None for the demo model, which runs inside the worker


class ServiceStatus(BaseModel):
    tool: str  # as published (shared/deployment.py `ServiceFacts`): `ha_*` for them all
    variable: str
    url: str
    probe: Probe


class ToolStatus(BaseModel):
    name: str
    requires_confirmation: bool
    services: list[ServiceStatus]


class RedisStatus(BaseModel):
    """One Redis deployment and the roles it holds (shared/keys.py): one entry holds both
    when one Redis serves them."""

    roles: list[Literal["data", "queue"]]
    kind: Kind
    url: str  # never with its password
    servers: list[ServerFacts]
    error: str | None


class WorkersStatus(BaseModel):
    alive: int | None  # None when the queue role's Redis did not answer
    fresh_within_s: int


class StatusReport(BaseModel):
    object: Literal["bernard.status"] = "bernard.status"
    version: str
    checked_at: float
    # When a worker last published what it runs (None: none has, so models and tools are
    # unknown and empty).
    published_at: float | None
    workers_version: str | None
    models: list[ModelStatus]
    tools: list[ToolStatus]
    # The MCP servers the workers alive connect to (shared/mcp_health.py).
    mcp_servers: list[McpServerStatus]
    redis: list[RedisStatus]
    workers: WorkersStatus
