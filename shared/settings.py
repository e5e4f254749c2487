"""Settings read from the environment, shared by the API and the worker.

One `Settings` object, returned by the cached `get_settings()`; tests build their own
`Settings(...)` and pass it in explicitly.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MODEL_ID = "bernard-v1"
# Whom every request belongs to while `BERNARD_API_KEYS` is unset (api/auth.py).
LOCAL_USER = "local"


class Settings(BaseSettings):
    """Every knob Bernard reads. Names are the environment variables, case-insensitive."""

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", populate_by_name=True)

    redis_url: str = "redis://127.0.0.1:6379/0"
    # The queue role (shared/keys.py): arq's queue, wake-ups, running set, per-user counters.
    # Unset: the same Redis as `redis_url`. Never a Cluster (arq cannot use one).
    queue_redis_url: str | None = Field(None, alias="BERNARD_QUEUE_REDIS_URL")

    # Upstream LLMs. With none of these set, the worker runs the offline demo model.
    openai_base_url: str | None = None
    openai_api_key: str | None = None
    anthropic_base_url: str | None = None
    anthropic_api_key: str | None = None
    # Which API each role's model speaks: OpenAI's Chat Completions or Anthropic's Messages.
    router_provider: Literal["openai", "anthropic"] = Field(
        "openai", alias="BERNARD_ROUTER_PROVIDER"
    )
    response_provider: Literal["openai", "anthropic"] = Field(
        "openai", alias="BERNARD_RESPONSE_PROVIDER"
    )
    router_model: str = Field("gpt-4o-mini", alias="BERNARD_ROUTER_MODEL")
    response_model: str = Field("gpt-4o-mini", alias="BERNARD_RESPONSE_MODEL")
    llm_timeout_s: float = Field(120.0, alias="BERNARD_LLM_TIMEOUT_S")
    llm_max_retries: int = Field(2, alias="BERNARD_LLM_MAX_RETRIES")
    system_prompt: str = Field(
        "You are Bernard, a helpful assistant.", alias="BERNARD_SYSTEM_PROMPT"
    )

    # "key:user,key2:user2". Unset: open, single local user.
    api_keys: str | None = Field(None, alias="BERNARD_API_KEYS")
    # The key a scraper elsewhere than loopback sends for /metrics (api/auth.py). Unset:
    # /metrics answers on loopback only, whatever BERNARD_API_KEYS says.
    metrics_key: str | None = Field(None, alias="BERNARD_METRICS_KEY")
    # Comma-separated web origins (`https://chat.lan`) whose pages may call the API from a
    # browser; `*` for any. Unset: none, the playground being the API's own origin.
    cors_origins: str = Field("", alias="BERNARD_CORS_ORIGINS")
    # While `api_keys` is unset, the API answers requests whose Host is one of its own names
    # only (api/auth.py `host_names`: localhost, 127.0.0.1, [::1], the address it is bound
    # to), so that a web page whose name is rebound to it cannot use it; these
    # comma-separated names (`bernard.lan`, `*.lan`, or `*` for any) are added.
    allowed_hosts: str = Field("", alias="BERNARD_ALLOWED_HOSTS")

    worker_concurrency: int = Field(500, alias="BERNARD_WORKER_CONCURRENCY")
    queue_name: str = Field("bernard:queue", alias="BERNARD_QUEUE_NAME")
    turn_timeout_s: float = Field(900.0, alias="BERNARD_TURN_TIMEOUT_S")
    turn_retention_s: int = Field(86_400, alias="BERNARD_TURN_RETENTION_S")
    stream_maxlen: int = Field(10_000, alias="BERNARD_STREAM_MAXLEN")
    keepalive_s: float = Field(15.0, alias="BERNARD_KEEPALIVE_S")
    max_body_bytes: int = Field(4 * 1024 * 1024, alias="BERNARD_MAX_BODY_BYTES")
    conversation_retention_s: int = Field(30 * 86_400, alias="BERNARD_CONVERSATION_RETENTION_S")

    # What one request may hold. A turn's prompt never reads more of a stored conversation
    # than a request may send (the latest `max_messages`, within `max_content_chars`).
    max_messages: int = Field(500, alias="BERNARD_MAX_MESSAGES")
    max_message_chars: int = Field(100_000, alias="BERNARD_MAX_MESSAGE_CHARS")
    max_content_chars: int = Field(1_000_000, alias="BERNARD_MAX_CONTENT_CHARS")
    max_tool_calls: int = Field(128, alias="BERNARD_MAX_TOOL_CALLS")
    # The client's function tools as JSON (api/limits.py): a turn holds them in its record.
    max_tools_bytes: int = Field(256 * 1024, gt=0, alias="BERNARD_MAX_TOOLS_BYTES")

    # What a prompt may hold (worker/harness/memory.py): the model's context, the share kept
    # for the answer, and when older messages get folded into the running summary.
    context_max_tokens: int = Field(16_000, alias="BERNARD_CONTEXT_MAX_TOKENS")
    context_answer_tokens: int = Field(2_000, alias="BERNARD_CONTEXT_ANSWER_TOKENS")
    summary_threshold_messages: int = Field(40, alias="BERNARD_SUMMARY_THRESHOLD_MESSAGES")
    notes_max_tokens: int = Field(1_000, alias="BERNARD_NOTES_MAX_TOKENS")
    # A short title for each conversation, asked of the router model in the background after
    # its first exchange (worker/titles.py): one small call per conversation.
    conversation_titles: bool = Field(True, alias="BERNARD_CONVERSATION_TITLES")

    # What a message does while a turn runs on its conversation, unless its request says
    # (`multitask_strategy`): stop that turn and run next, wait in line behind it, or 409
    # (shared/conversation_state.py `Strategy`); and how many may wait in one line (409
    # beyond).
    multitask_strategy: Literal["interrupt", "enqueue", "reject"] = Field(
        "interrupt", alias="BERNARD_MULTITASK_STRATEGY"
    )
    max_waiting_turns: int = Field(3, ge=1, le=100, alias="BERNARD_MAX_WAITING_TURNS")

    # What one user may hold at once, across every API process (429 beyond).
    max_active_turns_per_user: int = Field(20, alias="BERNARD_MAX_ACTIVE_TURNS_PER_USER")
    max_streams_per_user: int = Field(50, alias="BERNARD_MAX_STREAMS_PER_USER")
    # Background jobs (summaries, timer firings: shared/queue.py) queued or running at once,
    # per user and across the deployment; and the share of each worker's slots they may
    # take (at least one slot), so live turns always find the rest.
    max_background_jobs_per_user: int = Field(4, ge=1, alias="BERNARD_MAX_BACKGROUND_JOBS_PER_USER")
    max_background_jobs: int = Field(500, ge=1, alias="BERNARD_MAX_BACKGROUND_JOBS")
    worker_background_share: float = Field(
        0.25, ge=0.0, le=1.0, alias="BERNARD_WORKER_BACKGROUND_SHARE"
    )
    # The share of each worker's slots one user's jobs may take (at least one slot), so
    # another user's turn finds a free one (worker/queue.py).
    worker_user_share: float = Field(0.5, gt=0.0, le=1.0, alias="BERNARD_WORKER_USER_SHARE")

    # What one user may store (shared/budgets.py): conversation history (messages and call
    # records) per conversation (413 beyond) and across them, and conversations (429 beyond).
    # Sized for a household: months of a voice satellite's room conversation, thousands of
    # one-off requests (each without an id is a conversation of its own, kept
    # `conversation_retention_s`).
    max_conversation_bytes: int = Field(16 * 2**20, gt=0, alias="BERNARD_MAX_CONVERSATION_BYTES")
    max_user_bytes: int = Field(128 * 2**20, gt=0, alias="BERNARD_MAX_USER_BYTES")
    max_conversations_per_user: int = Field(
        10_000, gt=0, alias="BERNARD_MAX_CONVERSATIONS_PER_USER"
    )
    # Notes (shared/notes.py) and tool calls waiting for the user's decision, in one
    # conversation and in all (worker/harness/router.py): a tool error the model reads beyond.
    max_notes_per_user: int = Field(200, gt=0, alias="BERNARD_MAX_NOTES_PER_USER")
    max_note_chars: int = Field(2000, gt=0, alias="BERNARD_MAX_NOTE_CHARS")
    max_pending_confirmations_per_conversation: int = Field(
        8, gt=0, alias="BERNARD_MAX_PENDING_CONFIRMATIONS_PER_CONVERSATION"
    )
    max_pending_confirmations_per_user: int = Field(
        32, gt=0, alias="BERNARD_MAX_PENDING_CONFIRMATIONS_PER_USER"
    )

    # How fast one user may ask, across every API process (shared/rate_limit.py): a token
    # bucket refilled at `rate_limit_per_minute` up to `rate_limit_burst`; a request costs
    # 1, one that starts a turn `rate_limit_turn_cost`. 0 a minute turns it off. A household
    # (a playground, a CLI, a few voice satellites on one key) asks for far less than 30
    # turns in a burst and one every two seconds after; a script hammering the API, more.
    rate_limit_per_minute: float = Field(120.0, ge=0, alias="BERNARD_RATE_LIMIT_PER_MINUTE")
    rate_limit_burst: int = Field(120, gt=0, alias="BERNARD_RATE_LIMIT_BURST")
    rate_limit_turn_cost: int = Field(4, gt=0, alias="BERNARD_RATE_LIMIT_TURN_COST")

    # Above this fraction of a Redis server's `maxmemory` (its machine's memory when it has
    # none), what would store is refused with 503 `store_full` and /readyz says so
    # (api/store_guard.py). 0 turns the guard off.
    redis_memory_guard: float = Field(0.9, ge=0, le=1, alias="BERNARD_REDIS_MEMORY_GUARD")

    max_router_steps: int = Field(5, alias="BERNARD_MAX_ROUTER_STEPS")
    # Which calls run at once, which wait for the user's decision and which a key's user may
    # not make (worker/tools/policy.py): the rules of this TOML file, else the household
    # default (worker/tools/policy.toml); these comma-separated tool names come first.
    policy_file: str | None = Field(None, alias="BERNARD_POLICY_FILE")
    confirm_tools: str = Field("", alias="BERNARD_CONFIRM_TOOLS")
    auto_approve_tools: str = Field("", alias="BERNARD_AUTO_APPROVE_TOOLS")
    # How long after a Home Assistant call "undo" may put its entity back (shared/records/undo.py).
    undo_window_s: float = Field(600.0, gt=0, alias="BERNARD_UNDO_WINDOW_S")
    confirmation_ttl_s: int = Field(3600, alias="BERNARD_CONFIRMATION_TTL_S")

    # Tools that reach other services (worker/tools/): each request's limit, shared by all of
    # them. What each service is (its URL, its token) its source declares in its own module
    # (worker/tools/settings.py `SourceSettings`), read from the same environment and `.env`.
    tool_http_timeout_s: float = Field(10.0, alias="BERNARD_TOOL_HTTP_TIMEOUT_S")
    # MCP servers whose tools join the router's (worker/tools/mcp/): the path of a JSON file
    # in the `mcpServers` format. Unset: none.
    mcp_config: str | None = Field(None, alias="BERNARD_MCP_CONFIG")
    # What one MCP tool call may bring in: the characters of its result the model reads and
    # the conversation stores (cut beyond, saying so), and the bytes of one answer Bernard
    # reads from a server, an HTTP body or a stdio line (the call fails beyond: it is never
    # held whole).
    mcp_result_max_chars: int = Field(20_000, gt=0, alias="BERNARD_MCP_RESULT_MAX_CHARS")
    mcp_response_max_bytes: int = Field(8 * 2**20, gt=0, alias="BERNARD_MCP_RESPONSE_MAX_BYTES")
    # What one MCP server may add to every router request (worker/tools/mcp/bounds.py): each
    # tool's description and input schema, its count of tools, and their bytes in all; a tool
    # beyond is left out, with a warning in the worker's log and the server's health.
    mcp_tool_max_bytes: int = Field(16 * 2**10, gt=0, alias="BERNARD_MCP_TOOL_MAX_BYTES")
    mcp_server_max_tools: int = Field(64, gt=0, alias="BERNARD_MCP_SERVER_MAX_TOOLS")
    mcp_server_max_bytes: int = Field(128 * 2**10, gt=0, alias="BERNARD_MCP_SERVER_MAX_BYTES")
    tool_timeout_s: float = Field(30.0, alias="BERNARD_TOOL_TIMEOUT_S")
    stream_tool_output_max_chars: int = Field(4000, alias="BERNARD_STREAM_TOOL_OUTPUT_MAX_CHARS")

    # The API's own documentation: /docs and /redoc (whose pages load their scripts from a
    # CDN, on the origin where the playground keeps its key) and /openapi.json. Off unless
    # asked for.
    api_docs: bool = Field(False, alias="BERNARD_API_DOCS")

    # Logs and traces (shared/logs.py, shared/traces.py). Format unset: text on a terminal,
    # JSON otherwise. Prompts, message content and tool arguments are logged only when asked.
    log_format: Literal["json", "text"] | None = Field(None, alias="BERNARD_LOG_FORMAT")
    log_prompts: bool = Field(False, alias="BERNARD_LOG_PROMPTS")
    # Set: spans go to this OTLP/HTTP collector (the OpenTelemetry SDK reads its other
    # OTEL_* variables itself). Unset: no tracing is set up at all.
    otel_exporter_otlp_endpoint: str | None = None

    # Signed webhooks (shared/webhooks.py): when a background turn ends, its end is POSTed
    # to `webhook_url`, signed per Standard Webhooks with `webhook_secret` (`whsec_` and
    # base64, as OpenAI's and the `openai` SDK's `client.webhooks.unwrap` take). A request
    # may name its own `webhook_url` only on one of `webhook_origins` (comma-separated
    # `scheme://host[:port]`: shared/webhook_targets.py). A failed delivery is tried again
    # after each of `webhook_retry_delays` (comma-separated seconds), then given up; each
    # attempt waits `webhook_timeout_s` at most. Each user's log of attempts
    # (`GET /v1/webhooks/deliveries`) lives `webhook_log_retention_s` from its latest entry.
    # Receivers must be public unless `webhook_allow_private` (shared/webhook_targets.py).
    webhook_url: str | None = Field(None, alias="BERNARD_WEBHOOK_URL")
    webhook_secret: str | None = Field(None, alias="BERNARD_WEBHOOK_SECRET")
    webhook_origins: str = Field("", alias="BERNARD_WEBHOOK_ORIGINS")
    webhook_allow_private: bool = Field(False, alias="BERNARD_WEBHOOK_ALLOW_PRIVATE")
    webhook_retry_delays: str = Field(
        "5,30,120,600,1800,3600,10800", alias="BERNARD_WEBHOOK_RETRY_DELAYS"
    )
    webhook_timeout_s: float = Field(10.0, gt=0, le=60, alias="BERNARD_WEBHOOK_TIMEOUT_S")
    webhook_log_retention_s: int = Field(7 * 86_400, gt=0, alias="BERNARD_WEBHOOK_LOG_RETENTION_S")

    disconnect_grace_s: float = Field(5.0, alias="BERNARD_DISCONNECT_GRACE_S")
    lease_ttl_s: float = Field(5.0, alias="BERNARD_LEASE_TTL_S")
    lease_renew_s: float = Field(1.0, alias="BERNARD_LEASE_RENEW_S")

    @model_validator(mode="after")
    def _a_turn_fits_the_bucket(self) -> Settings:
        if self.rate_limit_turn_cost > self.rate_limit_burst:
            raise ValueError(
                "BERNARD_RATE_LIMIT_TURN_COST must not exceed BERNARD_RATE_LIMIT_BURST: no turn "
                "could ever start"
            )
        return self

    @model_validator(mode="after")
    def _allowed_hosts_are_names(self) -> Settings:
        for name in self.allowed_host_names():
            if "*" in name[1:] or (name.startswith("*") and name != "*" and name[:2] != "*."):
                raise ValueError(
                    f"BERNARD_ALLOWED_HOSTS' {name!r}: a wildcard is `*` or leads a domain "
                    "(`*.lan`)"
                )
        return self

    @model_validator(mode="after")
    def _queue_is_one_primary(self) -> Settings:
        # The modules that read URLs build on this one.
        from shared.backends import parse_url

        try:
            backend = parse_url(self.queue_url).backend
        except ValueError:
            return self  # refused, saying why, where a client is made for it
        if backend.queue_refused:
            raise ValueError(backend.queue_refused)
        return self

    @model_validator(mode="after")
    def _webhooks_are_signed(self) -> Settings:
        # The module that reads them builds on this one.
        from shared.webhooks import check_webhook_settings

        check_webhook_settings(self)
        return self

    def slot_warning(self) -> str | None:
        """Why one user's turns may hold every slot of a worker, if they may: what the worker
        warns of as it starts."""
        slots = self.worker_concurrency
        if user_slots(slots, self.worker_user_share) < slots:
            return None
        if self.max_active_turns_per_user < slots:
            return None
        return (
            f"one user's turns may hold every one of a worker's {slots} slots "
            f"(BERNARD_WORKER_CONCURRENCY), as BERNARD_WORKER_USER_SHARE "
            f"({self.worker_user_share:g}) leaves none to others and "
            f"BERNARD_MAX_ACTIVE_TURNS_PER_USER ({self.max_active_turns_per_user}) fills them: "
            "another user's turn then waits for one of theirs to end"
        )

    @property
    def queue_url(self) -> str:
        """Where the queue role lives: `BERNARD_QUEUE_REDIS_URL`, else `REDIS_URL`."""
        return self.queue_redis_url or self.redis_url

    @property
    def demo_mode(self) -> bool:
        """True when no upstream LLM is configured: the worker uses the offline demo model."""
        return not (
            self.openai_base_url
            or self.openai_api_key
            or self.anthropic_base_url
            or self.anthropic_api_key
        )

    @property
    def roles_share_model(self) -> bool:
        """Whether the router and the response model are one model (the same provider and
        model name; the demo model serves both): the router's own text is then the answer,
        streamed as it comes (worker/harness/router.py), and a turn that needs no tool makes
        one model call."""
        return self.demo_mode or (
            self.router_provider == self.response_provider
            and self.router_model == self.response_model
        )

    def confirm_tool_names(self) -> frozenset[str]:
        return _names(self.confirm_tools)

    def auto_approve_tool_names(self) -> frozenset[str]:
        return _names(self.auto_approve_tools)

    def cors_origin_list(self) -> list[str]:
        return sorted(_names(self.cors_origins))

    def allowed_host_names(self) -> list[str]:
        return sorted(name.lower() for name in _names(self.allowed_hosts))

    def webhook_retry_delays_s(self) -> tuple[float, ...]:
        """The waits before each delivery attempt after the first, in seconds."""
        return tuple(float(delay) for delay in _names_in_order(self.webhook_retry_delays))

    def api_key_users(self) -> dict[str, str]:
        """Parse `BERNARD_API_KEYS` into {key: user}; empty when the server runs open."""
        pairs: dict[str, str] = {}
        for item in (self.api_keys or "").split(","):
            key, sep, user = item.strip().partition(":")
            if key and sep and user:
                pairs[key] = user
        return pairs


def user_slots(slots: int, share: float) -> int:
    """How many of a worker's `slots` one user's jobs may hold: `share` of them, at least
    one."""
    return max(1, int(slots * share))


def _names(text: str) -> frozenset[str]:
    return frozenset(name.strip() for name in text.split(",") if name.strip())


def _names_in_order(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings, read from the environment once."""
    return Settings()
