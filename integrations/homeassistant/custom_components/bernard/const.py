"""Names and limits the Bernard integration decides once."""

from __future__ import annotations

import logging
from enum import StrEnum
from typing import Final

DOMAIN: Final = "bernard"
LOGGER = logging.getLogger(__package__)

CONF_CONVERSATIONS: Final = "conversations"
CONF_SHARED_CONVERSATION: Final = "shared_conversation"
CONF_LANGUAGE: Final = "language"


class ConversationMode(StrEnum):
    """Which of Bernard's conversations an utterance goes to (the `conversations` option)."""

    PER_DEVICE = "per_device"  # one per satellite (else per Home Assistant user): each room its own
    SHARED = "shared"  # one for the whole house, named by the `shared_conversation` option


DEFAULT_CONVERSATIONS: Final = ConversationMode.PER_DEVICE
DEFAULT_SHARED_CONVERSATION: Final = "home-assistant"

# How long Bernard may take, in seconds. A connection is refused or made within CONNECT_S;
# a turn's stream sends a keepalive every BERNARD_KEEPALIVE_S (15 s by default), so a stream
# silent for READ_S is dead; a whole answer (tools, a confirmation's tool run) gets ANSWER_S,
# well inside the Assist pipeline's own limit of 300 s, so the user hears an apology from
# this integration, not silence.
CONNECT_S: Final = 10.0
READ_S: Final = 45.0
ANSWER_S: Final = 120.0
# The check the config flow makes, and a decision answered as JSON (no stream).
CHECK_S: Final = 10.0
# The longest one connection of the user's event stream (timers) is held: then it is
# opened again, from its last event, so that no connection is held for ever, whatever the
# server sends (keepalives, or a line that never ends).
EVENTS_S: Final = 3600.0

# The event fired on Home Assistant's bus when one of Bernard's timers rings, whether or not
# a satellite could announce it (automations may act on it).
EVENT_TIMER_FIRED: Final = "bernard_timer_fired"
