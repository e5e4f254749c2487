"""The chat's keyboard (cli/prompt.py), driven with keys through a pipe: what Enter, Alt-Enter,
a paste, Up, Ctrl-C and Ctrl-D do, where the history lives, and the argument editor.
tests/test_terminal.py runs the same in a real terminal."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import platformdirs
import pytest
from prompt_toolkit.history import InMemoryHistory
from prompt_toolkit.input import PipeInput, create_pipe_input
from prompt_toolkit.output import DummyOutput

from cli.chat import COMMANDS
from cli.prompt import LineEditor, edit_in, file_history, history_path

UP = "\x1b[A"
ALT_ENTER = "\x1b\r"
PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"


@pytest.mark.parametrize(
    ("url", "key", "name"),
    [
        ("http://127.0.0.1:8000", None, "127.0.0.1_8000-b943806c5d326028"),
        ("http://127.0.0.1:8000/", "key-alice", "127.0.0.1_8000-56ebd7209cba59f5"),
        ("https://bernard.example.com/api", "key-alice", "bernard.example.com-a2be8ce822e239d9"),
    ],
)
def test_each_server_and_key_has_its_history_file(url: str, key: str | None, name: str) -> None:
    assert history_path(url, key, Path("/data")) == Path("/data/history") / name


def test_the_same_server_with_or_without_a_slash_is_one_history() -> None:
    assert history_path("http://h:1/", "k") == history_path("http://h:1", "k")
    assert history_path("http://h:1", "k") != history_path("http://h:1", "other")


def test_the_history_lives_in_the_users_data_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    if platformdirs.user_data_path("bernard") != tmp_path / "bernard":
        pytest.skip("a platform whose data directory is not XDG_DATA_HOME's")
    path = history_path("http://127.0.0.1:8000", None)
    assert path == tmp_path / "bernard/history/127.0.0.1_8000-b943806c5d326028"


def test_the_history_file_is_its_owners_alone(tmp_path: Path) -> None:
    path = tmp_path / "bernard" / "history" / "h-1"
    file_history(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


@pytest.fixture
def keys() -> Iterator[PipeInput]:
    with create_pipe_input() as pipe:
        yield pipe


def editor(keys: PipeInput, history: InMemoryHistory | None = None) -> LineEditor:
    return LineEditor(history or InMemoryHistory(), COMMANDS, input=keys, output=DummyOutput())


@pytest.mark.parametrize(
    ("typed", "message"),
    [
        ("hello\r", "hello"),
        (f"line one{ALT_ENTER}line two\r", "line one\nline two"),
        ("line one\nline two\r", "line one\nline two"),  # Ctrl-J is a new line too
        (f"{PASTE_START}pasted one\r\npasted two\r\n{PASTE_END}\x7f\r", "pasted one\npasted two"),
        ("hello wrld\x1b[D\x1b[D\x1b[Do\x01say: \r", "say: hello world"),  # Left, Ctrl-A
    ],
    ids=["enter sends", "alt-enter", "ctrl-j", "a paste is not sent half-way", "editing keys"],
)
def test_what_the_message_line_sends(keys: PipeInput, typed: str, message: str) -> None:
    keys.send_text(typed)
    assert editor(keys).message() == message


def test_up_recalls_the_history(keys: PipeInput) -> None:
    history = InMemoryHistory()
    history.append_string("an earlier message")
    keys.send_text(f"{UP}\r")
    assert editor(keys, history).message() == "an earlier message"


def test_what_is_sent_goes_to_the_history_file_for_the_next_session(
    keys: PipeInput, tmp_path: Path
) -> None:
    path = tmp_path / "history"
    keys.send_text("first\r")
    assert LineEditor(file_history(path), COMMANDS, input=keys, output=DummyOutput()).message()
    keys.send_text(f"{UP}\r")
    later = LineEditor(file_history(path), COMMANDS, input=keys, output=DummyOutput())
    assert later.message() == "first"


@pytest.mark.parametrize(("key", "raised"), [("\x03", KeyboardInterrupt), ("\x04", EOFError)])
def test_ctrl_c_and_ctrl_d_at_the_prompt(keys: PipeInput, key: str, raised: type) -> None:
    keys.send_text(key)
    with pytest.raises(raised):
        editor(keys).message()


def test_a_question_has_no_history_of_messages(keys: PipeInput) -> None:
    history = InMemoryHistory()
    history.append_string("a message")
    keys.send_text(f"{UP}y\r")
    assert editor(keys, history).ask("Approve? ") == "y"


def test_without_an_editor_the_arguments_are_edited_here(keys: PipeInput) -> None:
    end, back = "\x1b[F", "\x7f"
    keys.send_text(f'{UP}{UP}{end}{back * 6}"4321"{ALT_ENTER}')
    edited = editor(keys).edit('{\n  "code": "1234"\n}\n', environ={})
    assert edited == '{\n  "code": "4321"\n}\n'


def test_the_editor_gets_the_text_and_gives_back_its_edit(tmp_path: Path) -> None:
    script = tmp_path / "ed"
    # The file is the last argument: $EDITOR may hold options ("code --wait").
    script.write_text(
        f'#!/bin/sh\nfor f; do :; done\ncp "$f" {tmp_path}/seen\nprintf edited > "$f"\n'
    )
    script.chmod(0o755)
    assert edit_in(f"{script} --wait", "before") == "edited"
    assert (tmp_path / "seen").read_text() == "before"


@pytest.mark.parametrize("command", ["false", "/no/such/editor"])
def test_an_editor_that_fails_edits_nothing(command: str) -> None:
    assert edit_in(command, "before") is None
