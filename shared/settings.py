"""Settings read from the environment, shared by the API and the worker.

One `Settings` object, returned by the cached `get_settings()`; tests build their own
`Settings(...)` and pass it in explicitly.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.backends import parse_url
from shared.webhooks import check_webhook_settings

MODEL_ID = "bernard-v1"
# Whom every request belongs to while `BERNARD_API_KEYS` is unset (api/auth.py).
LOCAL_USER = "local"


class Settings(BaseSettings):
    """Every knob Bernard reads. Names are the environment variables, case-insensitive;
    each field's description is its row in docs/variables.md (`python -m cli.variables`)."""

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", populate_by_name=True)

    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="Redis holding turns, streams and conversations (and the queue, unless "
        "`BERNARD_QUEUE_REDIS_URL` is set); unset, `./run` runs its own. `redis+sentinel://` "
        "and `redis+cluster://` too ([deployment](deployment.md#sentinel-and-cluster))",
    )
    # The queue role (shared/keys.py): arq's queue, wake-ups, running set, per-user counters.
    queue_redis_url: str | None = Field(
        None,
        alias="BERNARD_QUEUE_REDIS_URL",
        description="Redis holding arq's queue, the running turns and the per-user counters; "
        "one primary (`redis://` or `redis+sentinel://`), never a Cluster. Unset: `REDIS_URL`",
    )

    # Upstream LLMs. With none of these set, the worker runs the offline demo model.
    openai_base_url: str | None = Field(
        None, description="Any OpenAI-compatible upstream (vLLM, Ollama, a proxy, …)"
    )
    openai_api_key: str | None = Field(
        None,
        description="Upstream key; with no upstream set at all, the offline demo model runs",
    )
    anthropic_base_url: str | None = Field(
        None,
        description="Anthropic's Messages API (or one compatible with it), for a role whose "
        "provider is `anthropic`",
    )
    anthropic_api_key: str | None = Field(None, description="The key of `ANTHROPIC_BASE_URL`")
    router_provider: Literal["openai", "anthropic"] = Field(
        "openai",
        alias="BERNARD_ROUTER_PROVIDER",
        description="Which API the router's model speaks: `openai` (Chat Completions) or "
        "`anthropic` (Messages)",
    )
    response_provider: Literal["openai", "anthropic"] = Field(
        "openai",
        alias="BERNARD_RESPONSE_PROVIDER",
        description="Which API the response model speaks: `openai` or `anthropic`",
    )
    router_model: str = Field(
        "gpt-4o-mini",
        alias="BERNARD_ROUTER_MODEL",
        description="Model that decides on tool calls; the same model and provider as the "
        "response model's (the default) makes one agent loop whose own streamed text is the "
        "answer ([one model or two](../README.md#with-a-real-model))",
    )
    response_model: str = Field(
        "gpt-4o-mini",
        alias="BERNARD_RESPONSE_MODEL",
        description="Model that writes the streamed answer",
    )
    llm_timeout_s: float = Field(
        120.0, alias="BERNARD_LLM_TIMEOUT_S", description="Timeout of one upstream call"
    )
    llm_max_retries: int = Field(
        2, alias="BERNARD_LLM_MAX_RETRIES", description="Retries of a failed upstream call"
    )
    system_prompt: str = Field(
        "You are Bernard, a helpful assistant.",
        alias="BERNARD_SYSTEM_PROMPT",
        description="System prompt",
    )

    api_keys: str | None = Field(
        None,
        alias="BERNARD_API_KEYS",
        description="`key:user,key2:user2`; clients send `Authorization: Bearer key`. Unset, "
        "the API is open and every request is the user `local`'s, so turning it on hides "
        "what was made before (conversations, notes, timers) unless a key maps to `local` "
        "(`key:local`); `./run` and the API's start-up log say so when there are such "
        "conversations",
    )
    # api/auth.py
    metrics_key: str | None = Field(
        None,
        alias="BERNARD_METRICS_KEY",
        description="The key a Prometheus elsewhere than on loopback sends for `/metrics` "
        "(`Authorization: Bearer key`); unset, `/metrics` answers on loopback only (403 "
        "elsewhere), whether `BERNARD_API_KEYS` is set or not",
    )
    cors_origins: str = Field(
        "",
        alias="BERNARD_CORS_ORIGINS",
        description="Comma-separated web origins (`https://chat.lan`) whose pages may call "
        "the API from a browser, or `*` for any; unset, none. The playground needs none: it "
        "is the API's own origin",
    )
    # api/auth.py `host_names`
    allowed_hosts: str = Field(
        "",
        alias="BERNARD_ALLOWED_HOSTS",
        description="While `BERNARD_API_KEYS` is unset, the API answers only requests whose "
        "`Host` is `localhost`, `127.0.0.1`, `[::1]` or the address it is bound to (`HOST`), "
        "so that a web page whose name is rebound to 127.0.0.1 cannot use it (400 "
        "`invalid_host`; `/healthz` and `/readyz` answer any name); these comma-separated "
        "names (`bernard.lan`, `*.lan`, `*` for any) are added",
    )

    worker_concurrency: int = Field(
        500,
        alias="BERNARD_WORKER_CONCURRENCY",
        description="Jobs one worker runs at once: turns, and background work within its "
        "share (its upstream connection pool is sized to match)",
    )
    queue_name: str = Field(
        "bernard:queue", alias="BERNARD_QUEUE_NAME", description="arq queue name"
    )
    turn_timeout_s: float = Field(
        900.0, alias="BERNARD_TURN_TIMEOUT_S", description="Longest a turn may run"
    )
    turn_retention_s: int = Field(
        86_400,
        alias="BERNARD_TURN_RETENTION_S",
        description="How long a finished turn and its stream stay resumable",
    )
    stream_maxlen: int = Field(
        10_000,
        alias="BERNARD_STREAM_MAXLEN",
        description="Cap on entries in one turn's stream; a client further behind gets a "
        "`stream_trimmed` error frame",
    )
    keepalive_s: float = Field(
        15.0, alias="BERNARD_KEEPALIVE_S", description="Keepalive interval on quiet streams"
    )
    max_body_bytes: int = Field(
        4 * 1024 * 1024,
        alias="BERNARD_MAX_BODY_BYTES",
        description="Largest request body (413 beyond)",
    )
    conversation_retention_s: int = Field(
        30 * 86_400,
        alias="BERNARD_CONVERSATION_RETENTION_S",
        description="How long a conversation nobody uses is kept (30 days; every use renews it)",
    )

    # What one request may hold (api/limits.py). A turn's prompt never reads more of a stored
    # conversation than a request may send (the latest `max_messages`, within
    # `max_content_chars`).
    max_messages: int = Field(
        500, alias="BERNARD_MAX_MESSAGES", description="Messages in one request"
    )
    max_message_chars: int = Field(
        100_000,
        alias="BERNARD_MAX_MESSAGE_CHARS",
        description="Characters in one message (content plus tool call arguments), a "
        "Responses input item or its `instructions`, or a legacy `prompt`",
    )
    max_content_chars: int = Field(
        1_000_000,
        alias="BERNARD_MAX_CONTENT_CHARS",
        description="Characters in all of a request's messages",
    )
    max_tool_calls: int = Field(
        128,
        alias="BERNARD_MAX_TOOL_CALLS",
        description="Tool calls in all of a request's assistant messages (Responses: its "
        "`function_call` items)",
    )
    # A turn holds the client's function tools in its record.
    max_tools_bytes: int = Field(
        256 * 1024,
        gt=0,
        alias="BERNARD_MAX_TOOLS_BYTES",
        description="A request's own function `tools`, as JSON (256 KiB)",
    )

    # What a prompt may hold (worker/harness/memory.py).
    context_max_tokens: int = Field(
        16_000,
        alias="BERNARD_CONTEXT_MAX_TOKENS",
        description="The model's context: what a prompt may hold, with the answer",
    )
    context_answer_tokens: int = Field(
        2_000,
        alias="BERNARD_CONTEXT_ANSWER_TOKENS",
        description="The share of it kept for the answer",
    )
    summary_threshold_messages: int = Field(
        40,
        alias="BERNARD_SUMMARY_THRESHOLD_MESSAGES",
        description="Older messages outside the prompts that trigger a new running summary",
    )
    notes_max_tokens: int = Field(
        1_000,
        alias="BERNARD_NOTES_MAX_TOKENS",
        description="The share of a prompt the user's notes may take",
    )
    # worker/titles.py
    conversation_titles: bool = Field(
        True,
        alias="BERNARD_CONVERSATION_TITLES",
        description="Name each conversation after its first exchange (one call of the router "
        "model, in the background, budgeted as a summary is). A chat completion without a "
        "`conversation_id` starts a conversation of its own, so a client that never sends "
        "one costs that call on every request: `false` saves it",
    )

    # shared/conversation_state.py `Strategy`
    multitask_strategy: Literal["interrupt", "enqueue", "reject"] = Field(
        "interrupt",
        alias="BERNARD_MULTITASK_STRATEGY",
        description="What a message does while a turn runs on its conversation, unless its "
        "request says (`multitask_strategy`): `interrupt` it, `enqueue` behind it, or "
        "`reject` (409) ([conversations](api.md#one-turn-at-a-time))",
    )
    max_waiting_turns: int = Field(
        3,
        ge=1,
        le=100,
        alias="BERNARD_MAX_WAITING_TURNS",
        description="Messages that may wait in line behind a conversation's running turn "
        "(`409 conversation_busy` beyond)",
    )

    # What one user may hold at once, across every API process.
    max_active_turns_per_user: int = Field(
        20,
        alias="BERNARD_MAX_ACTIVE_TURNS_PER_USER",
        description="Turns one user has queued or running at once (`429` beyond)",
    )
    max_streams_per_user: int = Field(
        50,
        alias="BERNARD_MAX_STREAMS_PER_USER",
        description="SSE streams one user has open at once (`429` beyond)",
    )
    # Background jobs: summaries, titles, timer firings (shared/queue.py).
    max_background_jobs_per_user: int = Field(
        4,
        ge=1,
        alias="BERNARD_MAX_BACKGROUND_JOBS_PER_USER",
        description="Background jobs (summaries, titles, timer firings) one user has queued or "
        "running at once",
    )
    max_background_jobs: int = Field(
        500,
        ge=1,
        alias="BERNARD_MAX_BACKGROUND_JOBS",
        description="Background jobs queued or running across the deployment",
    )
    worker_background_share: float = Field(
        0.25,
        ge=0.0,
        le=1.0,
        alias="BERNARD_WORKER_BACKGROUND_SHARE",
        description="The share of a worker's slots (`BERNARD_WORKER_CONCURRENCY`) background "
        "jobs may take, at least one, so live turns always find the rest",
    )
    # worker/queue.py
    worker_user_share: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        alias="BERNARD_WORKER_USER_SHARE",
        description="The share of a worker's slots one user's jobs may take, at least one: "
        "the rest stay free for other users' turns (the worker warns at start when one user "
        "could still fill it)",
    )

    # What one user may store (shared/budgets.py), sized for a household: months of a voice
    # satellite's room conversation, thousands of one-off requests.
    max_conversation_bytes: int = Field(
        16 * 2**20,
        gt=0,
        alias="BERNARD_MAX_CONVERSATION_BYTES",
        description="What one conversation stores, messages and call records (16 MiB; "
        "`413 conversation_too_large` beyond)",
    )
    max_user_bytes: int = Field(
        128 * 2**20,
        gt=0,
        alias="BERNARD_MAX_USER_BYTES",
        description="What one user's conversations store together, with what their kept "
        "turns keep of their requests (a response's `instructions` and `tools`) (128 MiB; "
        "`429 storage_quota_exceeded` beyond)",
    )
    max_conversations_per_user: int = Field(
        10_000,
        gt=0,
        alias="BERNARD_MAX_CONVERSATIONS_PER_USER",
        description="Conversations one user has (`429 too_many_conversations` beyond)",
    )
    # shared/notes.py; worker/harness/router.py
    max_notes_per_user: int = Field(
        200,
        gt=0,
        alias="BERNARD_MAX_NOTES_PER_USER",
        description="Notes one user keeps (the note tool's error beyond)",
    )
    max_note_chars: int = Field(
        2000, gt=0, alias="BERNARD_MAX_NOTE_CHARS", description="Characters in one note"
    )
    max_pending_confirmations_per_conversation: int = Field(
        8,
        gt=0,
        alias="BERNARD_MAX_PENDING_CONFIRMATIONS_PER_CONVERSATION",
        description="Tool calls of one step that wait for the user's decision; the others "
        "are not run, and the model is told why",
    )
    max_pending_confirmations_per_user: int = Field(
        32,
        gt=0,
        alias="BERNARD_MAX_PENDING_CONFIRMATIONS_PER_USER",
        description="Tool calls waiting for one user's decision across their conversations",
    )

    # A token bucket per user, across every API process (shared/rate_limit.py).
    rate_limit_per_minute: float = Field(
        120.0,
        ge=0,
        alias="BERNARD_RATE_LIMIT_PER_MINUTE",
        description="How fast one user's rate refills: a token bucket shared by every API "
        "process (`429 rate_limit_exceeded` with the `Retry-After` it needs); `0` turns it "
        "off",
    )
    rate_limit_burst: int = Field(
        120,
        gt=0,
        alias="BERNARD_RATE_LIMIT_BURST",
        description="Tokens the bucket holds: what a user may spend at once",
    )
    rate_limit_turn_cost: int = Field(
        4,
        gt=0,
        alias="BERNARD_RATE_LIMIT_TURN_COST",
        description="Tokens a request that starts a turn costs (any other `/v1` request: 1; "
        "an open stream never pays again)",
    )

    # api/store_guard.py
    redis_memory_guard: float = Field(
        0.9,
        ge=0,
        le=1,
        alias="BERNARD_REDIS_MEMORY_GUARD",
        description="Above this share of a Redis server's `maxmemory` (its machine's memory "
        "without one), new turns and conversations are refused (`503 store_full`) and "
        "`/readyz` says why; `0` turns it off",
    )

    max_router_steps: int = Field(
        5,
        alias="BERNARD_MAX_ROUTER_STEPS",
        description="Router rounds (tool calls, then back to the router) per turn",
    )
    # worker/tools/policy.py; the household default is worker/tools/policy.toml.
    policy_file: str | None = Field(
        None,
        alias="BERNARD_POLICY_FILE",
        description="A TOML file of rules saying which tool calls run, wait for you, or a key "
        "may not make ([policy](policy.md)); unset, the household default",
    )
    confirm_tools: str = Field(
        "",
        alias="BERNARD_CONFIRM_TOOLS",
        description="Comma-separated tools that always wait for confirmation (before the "
        "file's rules; MCP tools by their `<server>__<tool>` name)",
    )
    auto_approve_tools: str = Field(
        "",
        alias="BERNARD_AUTO_APPROVE_TOOLS",
        description="Comma-separated tools that never wait, whatever they declare (before the "
        "file's rules)",
    )
    # shared/records/undo.py
    undo_window_s: float = Field(
        600.0,
        gt=0,
        alias="BERNARD_UNDO_WINDOW_S",
        description='How long after a Home Assistant call "undo" may put it back',
    )
    confirmation_ttl_s: int = Field(
        3600,
        alias="BERNARD_CONFIRMATION_TTL_S",
        description="How long a tool call waits for the user's decision before it lapses "
        "(recorded as not run)",
    )

    # Tools that reach other services (worker/tools/): each declares its URL and token in
    # its own module (worker/tools/settings.py `SourceSettings`).
    tool_http_timeout_s: float = Field(
        10.0,
        alias="BERNARD_TOOL_HTTP_TIMEOUT_S",
        description="Bounds each request a tool makes, whole: connecting, the answer's headers "
        "and all of its body",
    )
    # worker/tools/mcp/
    mcp_config: str | None = Field(
        None,
        alias="BERNARD_MCP_CONFIG",
        description="Path of a JSON file in the common `mcpServers` format: each MCP server's "
        "tools join the router's ([MCP servers](tools.md#mcp-servers))",
    )
    mcp_result_max_chars: int = Field(
        20_000,
        gt=0,
        alias="BERNARD_MCP_RESULT_MAX_CHARS",
        description="What one MCP call's result may put into the conversation (the model's "
        "input, the stream, the stored call), cut with a marker saying how much was left out",
    )
    mcp_response_max_bytes: int = Field(
        8 * 2**20,
        gt=0,
        alias="BERNARD_MCP_RESPONSE_MAX_BYTES",
        description="What Bernard reads of one answer of an MCP server (8 MiB): an HTTP "
        "answer, a line of a stdio server's output; a larger answer fails that call alone",
    )
    # worker/tools/mcp/bounds.py
    mcp_tool_max_bytes: int = Field(
        16 * 2**10,
        gt=0,
        alias="BERNARD_MCP_TOOL_MAX_BYTES",
        description="The most one MCP tool's description and input schema (as JSON) may take "
        "of every router request; a larger tool is left out, saying so",
    )
    mcp_server_max_tools: int = Field(
        64,
        gt=0,
        alias="BERNARD_MCP_SERVER_MAX_TOOLS",
        description="The most tools one MCP server may offer; those it lists beyond are left "
        "out, saying so",
    )
    mcp_server_max_bytes: int = Field(
        128 * 2**10,
        gt=0,
        alias="BERNARD_MCP_SERVER_MAX_BYTES",
        description="The most one MCP server's tools may take of every router request in all "
        "(128 KiB of descriptions and input schemas); the tools beyond are left out, saying so",
    )
    tool_timeout_s: float = Field(
        30.0, alias="BERNARD_TOOL_TIMEOUT_S", description="Timeout of one tool call"
    )
    stream_tool_output_max_chars: int = Field(
        4000,
        alias="BERNARD_STREAM_TOOL_OUTPUT_MAX_CHARS",
        description="Tool output beyond this is cut in the stream",
    )

    api_docs: bool = Field(
        False,
        alias="BERNARD_API_DOCS",
        description="`true`: serve `/docs`, `/redoc` and `/openapi.json` (without a key). Off "
        "by default: the two pages load their scripts from a CDN, on the origin where the "
        "playground keeps your API key",
    )

    # shared/logs.py, shared/traces.py
    log_format: Literal["json", "text"] | None = Field(
        None,
        alias="BERNARD_LOG_FORMAT",
        description="Log lines as `text` or one JSON object each (`json`); unset, text on a "
        "terminal, else JSON ([logs](operations.md#logs))",
    )
    log_prompts: bool = Field(
        False,
        alias="BERNARD_LOG_PROMPTS",
        description="`true`: logs and spans also hold prompts, message content and tool arguments",
    )
    # The OpenTelemetry SDK reads its other OTEL_* variables itself.
    otel_exporter_otlp_endpoint: str | None = Field(
        None,
        description="An OTLP/HTTP collector: traces of every request and turn go there; "
        "unset, no tracing is set up at all",
    )

    # shared/webhooks.py, shared/webhook_targets.py
    webhook_url: str | None = Field(
        None,
        alias="BERNARD_WEBHOOK_URL",
        description="Where a background turn's end is POSTed, signed ([webhooks](api.md#webhooks))",
    )
    webhook_secret: str | None = Field(
        None,
        alias="BERNARD_WEBHOOK_SECRET",
        description="The signing secret, `whsec_` and base64 (as OpenAI's); needed with the "
        "URL or the origins",
    )
    webhook_origins: str = Field(
        "",
        alias="BERNARD_WEBHOOK_ORIGINS",
        description="Comma-separated origins, `scheme://host[:port]` "
        "(`https://hooks.example.com:8443`), a request's own `webhook_url` may name, any "
        "path; the port is part of it (the scheme's default when none is named); unset, none",
    )
    webhook_allow_private: bool = Field(
        False,
        alias="BERNARD_WEBHOOK_ALLOW_PRIVATE",
        description="Let webhooks go to private receivers. Off, a `BERNARD_WEBHOOK_URL` or "
        "origin naming a private, loopback, link-local or reserved address or a local name "
        "(one label, `.local`, `.internal`, `.lan`, `.home.arpa`...; "
        "`metadata.google.internal`) stops the start, and a delivery whose host resolves to "
        "such an address is refused; turn it on for a receiver in the house (Home Assistant)",
    )
    webhook_retry_delays: str = Field(
        "5,30,120,600,1800,3600,10800",
        alias="BERNARD_WEBHOOK_RETRY_DELAYS",
        description="Seconds before each retry of a failed delivery (about 4.4 hours in all by "
        "default, at most 20 hours); then it is given up",
    )
    webhook_timeout_s: float = Field(
        10.0,
        gt=0,
        le=60,
        alias="BERNARD_WEBHOOK_TIMEOUT_S",
        description="Longest one delivery attempt waits for its answer",
    )
    webhook_log_retention_s: int = Field(
        7 * 86_400,
        gt=0,
        alias="BERNARD_WEBHOOK_LOG_RETENTION_S",
        description="How long a user's log of delivery attempts lives after its latest entry "
        "(it keeps the last 100)",
    )

    disconnect_grace_s: float = Field(
        5.0,
        alias="BERNARD_DISCONNECT_GRACE_S",
        description="How long a disconnected client has to come back before its turn is cancelled",
    )
    lease_ttl_s: float = Field(
        5.0,
        alias="BERNARD_LEASE_TTL_S",
        description="How long a worker's liveness key outlives its last renewal; a dead "
        "worker's turns end after this",
    )
    lease_renew_s: float = Field(
        1.0,
        alias="BERNARD_LEASE_RENEW_S",
        description="How often a worker renews its liveness (one key for all its turns), and "
        "how often each process looks for dead workers' turns",
    )

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
        try:
            backend = parse_url(self.queue_url).backend
        except ValueError:
            return self  # refused, saying why, where a client is made for it
        if backend.queue_refused:
            raise ValueError(backend.queue_refused)
        return self

    @model_validator(mode="after")
    def _webhooks_are_signed(self) -> Settings:
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
