"""Which of Bernard's conversations an utterance belongs to, and back: which device a
conversation's timer should ring on.

Per device (the default), each satellite has its own conversation, `ha-device-<device id>`,
so each room keeps its own history; an utterance with no device (the Home Assistant app,
the text box) goes to its user's, `ha-user-<user id>`, and one with neither to the shared
one. Shared: every utterance goes to the one conversation the options name. Bernard's
conversation ids are 1-128 letters, digits or `_ . : -`; a device or user id that does not
fit is replaced by its hash, so it still names one conversation.

A timer rings in the conversation that set it (`timer_fired` names it); the device that last
spoke in that conversation is where it is announced. `ha-device-` ids name their device
themselves, which survives a restart of Home Assistant; for the others the last speaker is
remembered while Home Assistant runs.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Final

from .const import ConversationMode

DEVICE_PREFIX: Final = "ha-device-"
USER_PREFIX: Final = "ha-user-"
# Bernard's grammar for a conversation id (api/conversations.py).
CONVERSATION_ID: Final = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def conversation_id(
    mode: ConversationMode, shared: str, device_id: str | None, user_id: str | None
) -> str:
    """The conversation an utterance from this device (or user) goes to."""
    if mode is ConversationMode.PER_DEVICE:
        if device_id:
            return _fitting(DEVICE_PREFIX, device_id)
        if user_id:
            return _fitting(USER_PREFIX, user_id)
    return shared


def _fitting(prefix: str, name: str) -> str:
    candidate = prefix + name
    if CONVERSATION_ID.fullmatch(candidate):
        return candidate
    return prefix + hashlib.sha256(name.encode()).hexdigest()[:40]


@dataclass
class Household:
    """One config entry's conversations: where each utterance goes, and who spoke last in
    each."""

    mode: ConversationMode
    shared: str
    _speakers: dict[str, str] = field(default_factory=dict)

    def conversation_for(self, device_id: str | None, user_id: str | None) -> str:
        conversation = conversation_id(self.mode, self.shared, device_id, user_id)
        if device_id:
            self._speakers[conversation] = device_id
        return conversation

    def device_for(self, conversation: str | None) -> str | None:
        """The device a conversation's timer rings on, if any is known."""
        if conversation is None:
            return None
        if conversation in self._speakers:
            return self._speakers[conversation]
        if conversation.startswith(DEVICE_PREFIX):
            return conversation.removeprefix(DEVICE_PREFIX)
        return None
