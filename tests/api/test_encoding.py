"""api/encoding.py: how a completed turn's ending reads in each chunk encoding."""

from __future__ import annotations

import orjson
import pytest

from api.encoding import DONE
from api.encodings import encoder_for
from shared.events import Done
from shared.requests import AgentRequest, Delivery, TurnRequest
from shared.turn_record import TurnRecord

USAGE = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}


def finish_reason(kind: str, model_said: str | None) -> object:
    request = TurnRequest(AgentRequest([]), Delivery(kind))
    frames = encoder_for(TurnRecord(id="t", owner="o", request=request, model="m")).frames(
        Done(status="completed", finish_reason=model_said, usage=USAGE)
    )
    assert frames[-1] == DONE
    (choice,) = orjson.loads(frames[0])["choices"]
    return choice["finish_reason"]


@pytest.mark.parametrize(
    ("kind", "model_said", "client_reads"),
    [
        ("chat", None, "stop"),  # none recorded (an older record, say): the answer ended
        ("chat", "length", "length"),
        ("completion", None, "stop"),
        ("completion", "length", "length"),
    ],
)
def test_a_completed_turn_ends_on_its_finish_reason_or_stop(
    kind: str, model_said: str | None, client_reads: str
) -> None:
    assert finish_reason(kind, model_said) == client_reads
