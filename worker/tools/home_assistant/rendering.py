"""What the model and the user read: a call in plain words (`describe_call`, the summary
the user confirms), an entity's state and a list of entities."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from worker.tools.http import trim

if TYPE_CHECKING:
    from worker.tools.home_assistant.client import Area


MAX_LISTED = 40  # entities in one list; the model narrows by domain or area for the rest


MAX_ATTRIBUTES = 25


ATTRIBUTE_CHARS = 200


# Domains whose state is when the entity was last activated, not a condition it is in.
_ACTIVATED = frozenset({"scene", "button", "input_button"})


# A script is on while it runs (homeassistant/components/script/__init__.py).
_SCRIPT_STATES = {"on": "running", "off": "not running"}


def changes(entity: str, latest: dict[str, dict[str, Any]]) -> list[str]:
    """What the model reads of the states a call changed."""
    latest = dict(latest)
    mine = latest.pop(entity, None)
    lines = [
        f"{_now(mine)}."
        if mine is not None
        else f"Home Assistant reported no change of {entity}'s state."
    ]
    return lines + [f"Also changed: {_now(s)}." for s in list(latest.values())[:5]]


_VERBS = {
    "turn_on": "Turn on",
    "turn_off": "Turn off",
    "toggle": "Toggle",
    "open_cover": "Open",
    "close_cover": "Close",
    "stop_cover": "Stop",
    "lock": "Lock",
    "unlock": "Unlock",
    "media_play": "Play",
    "media_pause": "Pause",
    "media_stop": "Stop",
    "media_next_track": "Skip to the next track on",
    "media_previous_track": "Go back a track on",
    "volume_up": "Turn up the volume of",
    "volume_down": "Turn down the volume of",
}


def describe_call(args: dict[str, Any]) -> str:
    """What a service call does, in plain words, every option of `data` named.

    `{"domain": "light", "service": "turn_on", "entity_id": "light.kitchen", "data":
    {"brightness_pct": 40}}` -> "Turn on light.kitchen at 40 % brightness". Temperatures are
    in the unit Home Assistant is set to, which a call does not say, so they read "21°".
    """
    domain, service = str(args.get("domain", "")), str(args.get("service", ""))
    entity = str(args.get("entity_id", ""))
    data = dict(args.get("data") or {})
    head = _head(domain, service, entity, data)
    parts = [head, *_options(data)]
    rest = ", ".join(f"{key}={value_text(value)}" for key, value in data.items())
    if rest:
        parts.append(f"with {rest}")
    return " ".join(parts)


def _head(domain: str, service: str, entity: str, data: dict[str, Any]) -> str:
    """The call's verb and object; takes the options it says out of `data`."""
    if domain == "scene" and service == "turn_on":
        return f"Activate {entity}"
    if domain == "script" and (service == "turn_on" or entity == f"script.{service}"):
        return f"Run {entity}"  # script.turn_on, or the script's own service
    if service == "set_temperature":
        if "temperature" in data:
            head = f"Set {entity} to {_degrees(data.pop('temperature'))}"
        elif {"target_temp_low", "target_temp_high"} <= data.keys():
            low, high = data.pop("target_temp_low"), data.pop("target_temp_high")
            head = f"Keep {entity} between {_degrees(low)} and {_degrees(high)}"
        else:
            head = f"Change the temperature of {entity}"
        if "hvac_mode" in data:
            head += f" in {value_text(data.pop('hvac_mode'), quote=False)} mode"
        return head
    if service == "set_hvac_mode" and "hvac_mode" in data:
        return f"Switch {entity} to {value_text(data.pop('hvac_mode'), quote=False)} mode"
    if service == "set_cover_position" and "position" in data:
        return f"Open {entity} to {value_text(data.pop('position'))} %"
    if service == "volume_set" and isinstance(data.get("volume_level"), int | float):
        return f"Set the volume of {entity} to {data.pop('volume_level') * 100:g} %"
    if service in _VERBS:
        return f"{_VERBS[service]} {entity}"
    return f"Call {domain}.{service} on {entity}"


def _options(data: dict[str, Any]) -> list[str]:
    """The light options a person would name, in words; taken out of `data`."""
    said = []
    if "brightness_pct" in data:
        said.append(f"at {value_text(data.pop('brightness_pct'))} % brightness")
    elif isinstance(data.get("brightness"), int | float):
        said.append(f"at {round(data.pop('brightness') / 255 * 100)} % brightness")
    if "color_name" in data:
        said.append(f"in {value_text(data.pop('color_name'), quote=False)}")
    if "color_temp_kelvin" in data:
        said.append(f"at {value_text(data.pop('color_temp_kelvin'))} K")
    if "transition" in data:
        said.append(f"over {value_text(data.pop('transition'))} s")
    return said


def _degrees(value: Any) -> str:
    return f"{value:g}°" if isinstance(value, int | float) else value_text(value)


def value_text(value: Any, *, quote: bool = True) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int | float):
        return f"{value:g}"
    if isinstance(value, str) and not quote:
        return value
    return json.dumps(value, ensure_ascii=False)


def mentions(state: dict[str, Any], words: str) -> bool:
    wanted = words.lower().replace(" ", "_")
    name = str(state["attributes"].get("friendly_name") or "").lower().replace(" ", "_")
    return wanted in name or wanted in state["entity_id"]


def _label(state: dict[str, Any]) -> str:
    name = state["attributes"].get("friendly_name")
    return (
        f"{state['entity_id']} “{trim(name, 60)}”" if isinstance(name, str) else state["entity_id"]
    )


def _now(state: dict[str, Any]) -> str:
    """A changed entity as the call's result says it: what it is now, or, for an entity whose
    state is the time it was last activated (a scene), that it was; a script is running or
    not (its on and off), not switched on or off."""
    entity = state["entity_id"]
    kind = entity.split(".", 1)[0]
    if kind in _ACTIVATED:
        return f"{entity} was activated at {trim(state['state'], 60)}"
    if kind == "script" and state["state"] in _SCRIPT_STATES:
        return f"{entity} is {_SCRIPT_STATES[state['state']]}"
    return f"{entity} is now {brief(state)}"


def brief(state: dict[str, Any]) -> str:
    """The state with the attributes a person asks about first."""
    value, attributes = state["state"], state["attributes"]
    kind = state["entity_id"].split(".", 1)[0]
    if kind in _ACTIVATED:
        return (
            f"last activated {trim(value, 60)}"
            if value not in ("unknown", "")
            else "never activated"
        )
    if kind == "script" and value in _SCRIPT_STATES:
        return _SCRIPT_STATES[value]
    parts = [trim(value, 60)]
    unit = attributes.get("unit_of_measurement")
    if isinstance(unit, str) and unit:
        parts = [f"{trim(value, 60)} {unit}"]
    brightness = attributes.get("brightness")
    if kind == "light" and value == "on" and isinstance(brightness, int | float):
        parts.append(f"brightness {round(brightness / 255 * 100)} %")
    if kind == "climate":
        now, target = attributes.get("current_temperature"), attributes.get("temperature")
        if isinstance(now, int | float):
            parts.append(f"{now:g}° now")
        if isinstance(target, int | float):
            parts.append(f"set to {target:g}°")
    position = attributes.get("current_position")
    if kind == "cover" and isinstance(position, int | float):
        parts.append(f"{position:g} % open")
    percentage = attributes.get("percentage")
    if kind == "fan" and value == "on" and isinstance(percentage, int | float):
        parts.append(f"speed {percentage:g} %")
    title = attributes.get("media_title")
    if kind == "media_player" and isinstance(title, str) and title:
        parts.append(f"playing “{trim(title, 60)}”")
    return ", ".join(parts)


def render_list(
    states: list[dict[str, Any]], kind: str | None, asked: str | None, place: Area | None
) -> str:
    what = f"{kind} entities" if kind else "entities"
    if place is not None and place.name is None:
        if not states:
            one = f"{kind} entity" if kind else "entity"
            return f"Home Assistant has no area “{asked}”, and no {one}'s name mentions it."
        where = f" whose name mentions “{asked}” (Home Assistant has no area “{asked}”)"
    else:
        where = f" in the area “{place.name}”" if place is not None else ""
    if not states:
        return f"Home Assistant has no {what}{where}."
    ordered = sorted(states, key=lambda s: s["entity_id"])
    lines = [f"Home Assistant {what}{where}: {len(ordered)}"]
    lines += [f"- {_label(s)}: {brief(s)}" for s in ordered[:MAX_LISTED]]
    if len(ordered) > MAX_LISTED:
        lines.append(f"… and {len(ordered) - MAX_LISTED} more; ask again with a domain or an area")
    return "\n".join(lines)


def render_state(state: dict[str, Any]) -> str:
    attributes = state["attributes"]
    lines = [f"{_label(state)} is {brief(state)}."]
    changed = state.get("last_changed")
    if isinstance(changed, str):
        lines.append(f"Last changed: {changed}")
    shown = [(k, v) for k, v in attributes.items() if k != "friendly_name"]
    if shown:
        lines.append("Attributes:")
        for key, value in shown[:MAX_ATTRIBUTES]:
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            lines.append(f"- {trim(str(key), 60)}: {trim(text, ATTRIBUTE_CHARS)}")
        if len(shown) > MAX_ATTRIBUTES:
            lines.append(f"… and {len(shown) - MAX_ATTRIBUTES} more attributes")
    return "\n".join(lines)
