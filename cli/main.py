"""The `bernard` command ([project.scripts] in pyproject.toml): chat with Bernard, look at
turns and conversations, run it (`serve`) and check a deployment (`doctor`).

Every command that talks to the API takes `--url` (or `BERNARD_URL`) and `--key` (or
`BERNARD_API_KEY`, sent as a bearer token when the API has `BERNARD_API_KEYS`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import orjson
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cli import chat as chat_session
from cli import conversations as conversation_views
from cli import doctor as doctor_checks
from cli import pages
from cli import turns as turn_views
from cli.client import DEFAULT_URL, Api, ApiCallError
from cli.prompt import LineEditor, file_history, history_path
from shared.settings import Settings

app = typer.Typer(
    help="Bernard from the terminal: chat, turns, conversations, serve, doctor.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
turns_app = typer.Typer(help="Your turns: list, show, tail, cancel.", no_args_is_help=True)
conversations_app = typer.Typer(
    help="Your conversations: list, show, rename, delete.", no_args_is_help=True
)
app.add_typer(turns_app, name="turns")
app.add_typer(conversations_app, name="conversations")

Url = Annotated[
    str, typer.Option("--url", envvar="BERNARD_URL", help="The API's base URL.", show_default=True)
]
Key = Annotated[
    str | None,
    typer.Option(
        "--key",
        envvar="BERNARD_API_KEY",
        help="API key: one of the server's BERNARD_API_KEYS.",
        show_default=False,
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print the API's JSON instead.")]
Limit = Annotated[int, typer.Option("--limit", min=1, max=100, help="How many to list.")]
AfterId = Annotated[str | None, typer.Option("--after", help="List those after this id.")]

T = TypeVar("T")


def console() -> Console:
    return Console(highlight=False)


def call(url: str, key: str | None, action: Callable[[Api, Console], T]) -> T:
    """Run `action` against the API; an API error is printed and exits 1."""
    api = Api(url, key)
    out = console()
    try:
        return action(api, out)
    except ApiCallError as exc:
        out.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(1) from None
    finally:
        api.close()


def print_json(body: Any) -> None:
    typer.echo(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode())


@app.command()
def chat(
    conversation: Annotated[
        str | None,
        typer.Option(
            "--conversation", "-c", help="Continue this conversation (created if you have none)."
        ),
    ] = None,
    url: Url = DEFAULT_URL,
    key: Key = None,
) -> None:
    """Chat with Bernard: answers stream as Markdown, tool calls that change things ask first."""
    keyboard = LineEditor(file_history(history_path(url, key)), chat_session.COMMANDS)
    code = call(url, key, lambda api, out: chat_session.chat(api, out, conversation, keyboard))
    raise typer.Exit(code)


def add_list(
    commands: typer.Typer,
    what: str,
    table: Callable[[list[dict[str, Any]]], Table],
    help: str,
) -> None:
    """`bernard <what> list`: a page of the caller's `what` (`turns`, `conversations`)."""

    @commands.command("list", help=help)
    def listed(
        limit: Limit = 20,
        after: AfterId = None,
        as_json: AsJson = False,
        url: Url = DEFAULT_URL,
        key: Key = None,
    ) -> None:
        if as_json:
            print_json(
                call(url, key, lambda api, _: api.get(f"/v1/{what}", limit=limit, after=after))
            )
            return
        call(url, key, lambda api, out: pages.print_page(api, out, what, table, limit, after))


add_list(turns_app, "turns", turn_views.turns_table, "Your turns, newest first.")


@turns_app.command("show")
def turns_show(
    turn_id: str, as_json: AsJson = False, url: Url = DEFAULT_URL, key: Key = None
) -> None:
    """A turn: its status, times, error or answer."""
    if as_json:
        print_json(call(url, key, lambda api, _: api.get(f"/v1/turns/{turn_id}")))
        return
    call(url, key, lambda api, out: turn_views.show_turn(api, out, turn_id))


@turns_app.command("tail")
def turns_tail(turn_id: str, url: Url = DEFAULT_URL, key: Key = None) -> None:
    """Follow a turn's events from its start until it ends (reconnecting if need be)."""
    raise typer.Exit(call(url, key, lambda api, out: turn_views.tail_turn(api, out, turn_id)))


@turns_app.command("cancel")
def turns_cancel(turn_id: str, url: Url = DEFAULT_URL, key: Key = None) -> None:
    """Stop a queued or running turn."""
    call(url, key, lambda api, out: turn_views.cancel_turn(api, out, turn_id))


add_list(
    conversations_app,
    "conversations",
    conversation_views.conversations_table,
    "Your conversations, last used first.",
)


@conversations_app.command("show")
def conversations_show(
    conversation_id: str,
    messages: Annotated[
        int, typer.Option("--messages", "-n", min=0, help="How many of the latest messages.")
    ] = 50,
    as_json: AsJson = False,
    url: Url = DEFAULT_URL,
    key: Key = None,
) -> None:
    """A conversation: its status and latest messages."""
    if as_json:
        print_json(call(url, key, lambda api, _: api.get(f"/v1/conversations/{conversation_id}")))
        return
    call(
        url,
        key,
        lambda api, out: conversation_views.show_conversation(api, out, conversation_id, messages),
    )


@conversations_app.command("rename")
def conversations_rename(
    conversation_id: str, title: str, url: Url = DEFAULT_URL, key: Key = None
) -> None:
    """Give a conversation a title of your own (the generated one never replaces it)."""
    call(
        url,
        key,
        lambda api, out: conversation_views.rename_conversation(api, out, conversation_id, title),
    )


@conversations_app.command("delete")
def conversations_delete(
    conversation_id: str,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask first.")] = False,
    url: Url = DEFAULT_URL,
    key: Key = None,
) -> None:
    """Delete a conversation and everything recorded in it."""
    if not yes and not typer.confirm(
        f"Delete conversation {conversation_id} and everything recorded in it?"
    ):
        typer.echo("Nothing deleted.")
        raise typer.Exit(1)
    call(url, key, lambda api, out: conversation_views.delete_and_report(api, out, conversation_id))


@app.command()
def serve() -> None:
    """Run Bernard here (Redis unless REDIS_URL is set, a worker, the API), as ./run does."""
    from launcher.cli import main as launch

    raise typer.Exit(launch([]))


@app.command()
def doctor(
    url: Url = DEFAULT_URL,
    key: Key = None,
    redis_url: Annotated[
        str | None,
        typer.Option(
            "--redis-url",
            help="Also check this Redis from here, instead of the server's word on its own "
            "(and the workers on BERNARD_QUEUE_REDIS_URL, when set here).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Check the server: the API and the key from here; its Redis, workers, models and tools
    as it reports them (GET /v1/status). Exit 1 when any check fails."""
    queue_url = Settings().queue_redis_url if redis_url is not None else None
    code = call(url, key, lambda api, out: doctor_checks.doctor(out, api, redis_url, queue_url))
    raise typer.Exit(code)
