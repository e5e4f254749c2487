"""shared/endings.py: what a stream ends with, for each way a turn can end short of completing."""

from __future__ import annotations

import pytest

from shared.endings import ENDINGS, ended, ending_events
from shared.errors import ErrorCode
from shared.events import Done, Error


@pytest.mark.parametrize("code", list(ENDINGS))
def test_a_stream_ends_with_its_done_after_a_failed_turns_error_event(code: ErrorCode) -> None:
    events = ending_events(code)
    done = ended(code)
    assert events[-1] == done
    if ENDINGS[code].status == "failed":
        assert done.error is not None
        assert events == [Error(message=done.error["message"], code=code), done]
    else:  # a cancelled turn is no error to show
        assert events == [done]


def test_a_message_given_replaces_the_tables_in_both_events() -> None:
    error, done = ending_events(ErrorCode.UPSTREAM_ERROR, "the model said 500")
    assert isinstance(error, Error) and isinstance(done, Done)
    assert error.message == "the model said 500"
    assert done.error is not None and done.error["message"] == "the model said 500"
