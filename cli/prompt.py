"""The chat's line editor (prompt_toolkit): what `bernard chat` reads from the keyboard.

- The message line: editing keys as in a shell (arrows, Home/End, Ctrl-A/E/K/U/W, Alt-B/F,
  Ctrl-R to search), **Enter** sends, **Alt-Enter** (or Esc then Enter, or Ctrl-J) starts
  a new line; a paste is inserted as it is, newlines included, never sent half-way
  (bracketed paste). Up and Down recall earlier messages, from this session and the ones
  before it: the history is a file per server and key (`history_path`). Tab completes the
  chat's `/commands`. Ctrl-C clears the line; Ctrl-D on an empty line leaves.
- Questions (approve? stop the turn?): one line each, no history.
- Arguments to edit: in `$VISUAL` or `$EDITOR` when set, else in a multi-line editor here
  (Alt-Enter, or Esc then Enter, saves).

Each reader takes prompt_toolkit's `input` and `output` (the terminal by default), so
tests/cli/test_prompt.py drives it with keys through a pipe.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

import platformdirs
from prompt_toolkit import PromptSession
from prompt_toolkit.completion import CompleteEvent, Completer, Completion
from prompt_toolkit.document import Document
from prompt_toolkit.formatted_text import FormattedText
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.input import Input
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.output import Output

PROMPT = FormattedText([("bold ansicyan", "you> ")])
CONTINUATION = FormattedText([("ansicyan", "...  ")])
APP_NAME = "bernard"


def history_path(base_url: str, key: str | None, data_dir: Path | None = None) -> Path:
    """Where the chat keeps what this user typed to this server: `history/<host>-<hash>` in
    the user's data directory (`$XDG_DATA_HOME/bernard`, else `~/.local/share/bernard` on
    Linux; platformdirs elsewhere). One file per base URL and key, so two users of one
    machine, or one user's two servers, recall only their own lines; the key is in the
    hash only, never in the name."""
    base = base_url.rstrip("/")
    digest = hashlib.sha256(f"{base}\n{key or ''}".encode()).hexdigest()[:16]
    host = re.sub(r"[^A-Za-z0-9.-]+", "_", urlsplit(base).netloc or base).strip("_")
    root = data_dir if data_dir is not None else platformdirs.user_data_path(APP_NAME)
    return root / "history" / f"{host or 'server'}-{digest}"


def file_history(path: Path) -> FileHistory:
    """The history file at `path`, readable by its owner alone (what was typed may be
    private), its folder made if need be."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.close(os.open(path, os.O_CREAT | os.O_APPEND | os.O_WRONLY, 0o600))
    return FileHistory(str(path))


class CommandCompleter(Completer):
    """Completes a `/command` typed at the start of the line."""

    def __init__(self, commands: Mapping[str, str]) -> None:
        self.commands = commands

    def get_completions(
        self, document: Document, complete_event: CompleteEvent
    ) -> Iterable[Completion]:
        typed = document.text_before_cursor
        if not typed.startswith("/") or any(c.isspace() for c in typed):
            return
        for name, meaning in self.commands.items():
            if name.startswith(typed):
                yield Completion(name, start_position=-len(typed), display_meta=meaning)


def _message_keys() -> KeyBindings:
    keys = KeyBindings()

    @keys.add("enter")
    def _send(event: KeyPressEvent) -> None:
        event.current_buffer.validate_and_handle()

    @keys.add("escape", "enter")
    @keys.add("c-j")
    def _new_line(event: KeyPressEvent) -> None:
        event.current_buffer.newline(copy_margin=False)

    return keys


class LineEditor:
    """The keyboard of one chat: its message line (with `history`), its questions and its
    argument editor."""

    def __init__(
        self,
        history: History,
        commands: Mapping[str, str],
        *,
        input: Input | None = None,
        output: Output | None = None,
    ) -> None:
        self.messages: PromptSession[str] = PromptSession(
            PROMPT,
            history=history,
            multiline=True,  # shown and edited as lines; Enter still sends (`_message_keys`)
            prompt_continuation=CONTINUATION,
            key_bindings=_message_keys(),
            completer=CommandCompleter(commands),
            complete_while_typing=True,
            enable_history_search=False,
            input=input,
            output=output,
        )
        self.questions: PromptSession[str] = PromptSession(
            history=InMemoryHistory(), input=input, output=output
        )
        self.input, self.output = input, output

    def message(self) -> str:
        """The next message. Ctrl-C raises KeyboardInterrupt (the caller starts a fresh
        line), Ctrl-D on an empty line EOFError."""
        return self.messages.prompt()

    def ask(self, question: str) -> str:
        """One answer to `question`; KeyboardInterrupt or EOFError as `message`."""
        return self.questions.prompt(question)

    def edit(self, text: str, environ: Mapping[str, str] | None = None) -> str | None:
        """`text` as the user edited it: in `$VISUAL` or `$EDITOR`, else here. None when
        the editor failed, or the edit was abandoned (Ctrl-C)."""
        env = os.environ if environ is None else environ
        editor = env.get("VISUAL") or env.get("EDITOR")
        if editor:
            return edit_in(editor, text)
        session: PromptSession[str] = PromptSession(
            multiline=True, input=self.input, output=self.output
        )
        try:
            return session.prompt("", default=text)
        except (KeyboardInterrupt, EOFError):
            return None


def edit_in(editor: str, text: str) -> str | None:
    """`text` edited in `editor` (a command line, as `$EDITOR` holds it), through a file
    only its owner can read; None when the editor exits with an error."""
    fd, name = tempfile.mkstemp(prefix="bernard-arguments-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        try:
            ran = subprocess.run([*shlex.split(editor), name], check=False)
        except OSError:
            return None
        if ran.returncode != 0:
            return None
        return Path(name).read_text(encoding="utf-8")
    finally:
        Path(name).unlink(missing_ok=True)
