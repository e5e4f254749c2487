"""The registry of wire encodings: a turn's delivery names its encoding, and the encoder
for it is built here (api/encoding.py says what an encoder does).

Adding an encoding is its module beside these, one line in `ENCODINGS`, and the route that
creates its turns with that name (and serves its stream: api/turn_service.py).
"""

from __future__ import annotations

from api.encoding import Encoder
from api.encodings.chat import ChatEncoder
from api.encodings.completion import CompletionEncoder
from api.encodings.conversation import ConversationEncoder
from api.encodings.responses import ResponsesEncoder
from shared.turn_record import TurnRecord

__all__ = ["ENCODINGS", "encoder_for", "subject_of"]

ENCODINGS: dict[str, type[Encoder]] = {
    "chat": ChatEncoder,
    "completion": CompletionEncoder,
    "conversation": ConversationEncoder,
    "responses": ResponsesEncoder,
}


def encoder_for(record: TurnRecord) -> Encoder:
    """A fresh encoder of the turn's encoding, for one client's stream or answer."""
    return ENCODINGS[record.request.delivery.encoding](record)


def subject_of(encoding: str, turn_id: str) -> str:
    """The id a client of `encoding` knows the turn by: the one a webhook event names."""
    return ENCODINGS[encoding].subject_prefix + turn_id
