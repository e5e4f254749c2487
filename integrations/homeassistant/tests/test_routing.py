"""Which of Bernard's conversations an utterance goes to, and where a timer rings."""

from __future__ import annotations

import pytest

from custom_components.bernard.const import ConversationMode
from custom_components.bernard.routing import Household, conversation_id

DEVICE = "5b2d1f0c9e8a4c7b9f6d3e2a1b0c9d8e"
USER = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
PER_DEVICE, SHARED = ConversationMode.PER_DEVICE, ConversationMode.SHARED


@pytest.mark.parametrize(
    ("mode", "device_id", "user_id", "expected"),
    [
        (PER_DEVICE, DEVICE, USER, f"ha-device-{DEVICE}"),
        (PER_DEVICE, DEVICE, None, f"ha-device-{DEVICE}"),
        (PER_DEVICE, None, USER, f"ha-user-{USER}"),
        (PER_DEVICE, None, None, "house"),
        (SHARED, DEVICE, USER, "house"),
        (SHARED, None, None, "house"),
        # An id Bernard would refuse becomes its hash: still one conversation per device.
        (
            PER_DEVICE,
            "kitchen satellite/1",
            None,
            "ha-device-990bba38ac906cfcd87c51b1fb3cb1131d4b4e2c",
        ),
    ],
)
def test_each_utterance_goes_to_its_conversation(
    mode: ConversationMode, device_id: str | None, user_id: str | None, expected: str
) -> None:
    assert conversation_id(mode, "house", device_id, user_id) == expected


def test_a_timer_rings_on_the_device_that_last_spoke_in_its_conversation() -> None:
    household = Household(mode=SHARED, shared="house")
    household.conversation_for("kitchen-device", None)
    household.conversation_for("bedroom-device", None)
    assert household.device_for("house") == "bedroom-device"


def test_a_device_conversation_names_its_device_after_a_restart() -> None:
    household = Household(mode=PER_DEVICE, shared="house")  # nothing heard yet
    assert household.device_for(f"ha-device-{DEVICE}") == DEVICE
    assert household.device_for(f"ha-user-{USER}") is None
    assert household.device_for(None) is None
