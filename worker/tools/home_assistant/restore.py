"""The service calls that put an entity back as it was (`restore_of`): the artifact of a
service call, which `undo` runs."""

from __future__ import annotations

from typing import Any

from shared.records.undo import Restore
from worker.tools.home_assistant.rendering import brief
from worker.tools.numbers import is_number

# States of a lock, and the service that brings each back.
_LOCK_SERVICES = {"locked": "lock", "locking": "lock", "unlocked": "unlock", "unlocking": "unlock"}


_COVER_SERVICES = {
    "open": "open_cover",
    "opening": "open_cover",
    "closed": "close_cover",
    "closing": "close_cover",
}


_PLAYER_SERVICES = {"off": "turn_off", "playing": "media_play", "paused": "media_pause"}


# A light's colour, by its color_mode: the option that sets it again.
_COLOURS = {
    "color_temp": "color_temp_kelvin",
    "hs": "hs_color",
    "rgb": "rgb_color",
    "rgbw": "rgbw_color",
    "rgbww": "rgbww_color",
    "xy": "xy_color",
}


_ON_OFF = frozenset({"switch", "fan", "light", "input_boolean", "humidifier", "siren"})


def restore_of(state: dict[str, Any]) -> Restore | None:
    """The service calls that put an entity back in `state` (its state object); None for
    what cannot be put back (a scene or a script ran: nothing says what it changed; an
    entity unavailable, or in a state no service sets)."""
    entity, value = state["entity_id"], state["state"]
    attributes = state.get("attributes") or {}
    domain = entity.split(".", 1)[0]
    calls: list[tuple[str, dict[str, Any]]] = []
    if domain == "light" and value == "on":
        data: dict[str, Any] = {}
        if is_number(attributes.get("brightness")):
            data["brightness"] = round(attributes["brightness"])
        colour = _COLOURS.get(str(attributes.get("color_mode")))
        if colour is not None and attributes.get(colour) is not None:
            data[colour] = attributes[colour]
        calls.append(("turn_on", data))
    elif domain == "fan" and value == "on" and is_number(attributes.get("percentage")):
        calls.append(("turn_on", {"percentage": attributes["percentage"]}))
    elif domain in _ON_OFF and value in ("on", "off"):
        calls.append((f"turn_{value}", {}))
    elif domain == "lock" and value in _LOCK_SERVICES:
        calls.append((_LOCK_SERVICES[value], {}))
    elif domain == "cover" and is_number(attributes.get("current_position")):
        calls.append(("set_cover_position", {"position": attributes["current_position"]}))
    elif domain == "cover" and value in _COVER_SERVICES:
        calls.append((_COVER_SERVICES[value], {}))
    elif domain == "climate" and value in (attributes.get("hvac_modes") or ()):
        wanted = {k: attributes.get(k) for k in ("target_temp_low", "target_temp_high")}
        if is_number(attributes.get("temperature")):
            calls.append(
                ("set_temperature", {"temperature": attributes["temperature"], "hvac_mode": value})
            )
        elif all(is_number(v) for v in wanted.values()):
            calls.append(("set_temperature", {**wanted, "hvac_mode": value}))
        else:
            calls.append(("set_hvac_mode", {"hvac_mode": value}))
    elif domain == "media_player" and value in _PLAYER_SERVICES:
        calls.append((_PLAYER_SERVICES[value], {}))
    elif domain == "media_player" and value in ("on", "idle"):
        calls.append(("turn_on", {}))
    if not calls:
        return None
    made = tuple(
        {"domain": domain, "service": service, "entity_id": entity, "data": data}
        for service, data in calls
    )
    return Restore(made, f"{entity} back to {brief(state)}")


def restore_or_none(state: dict[str, Any]) -> Restore | None:
    """`restore_of`, None for a state it cannot read (an attribute of an unexpected type):
    a call that cannot be undone still runs."""
    try:
        return restore_of(state)
    except (TypeError, ValueError, KeyError, AttributeError):
        return None
