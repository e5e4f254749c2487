"""What the model sent, checked before anything is sent to Home Assistant: names and ids by
Home Assistant's own rules, and a service call against the service's description and the
entity's attributes (`refusal`), for what Home Assistant would refuse without saying why."""

from __future__ import annotations

import json
import re
from typing import Any

from langchain_core.tools import ToolException

from worker.tools.home_assistant.rendering import value_text
from worker.tools.http import trim
from worker.tools.numbers import as_number, is_number

MAX_AREA_CHARS = 100


MAX_DATA_CHARS = 2000


# Home Assistant's own rule for ids (homeassistant/core.py `valid_entity_id`), in short.
_NAME = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*")


ENTITY_ID = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*\.[a-z0-9]+(?:_[a-z0-9]+)*")


# An area name goes into a template, so only what area names are made of gets in.
_AREA = re.compile(r"[\w' .-]+")


# Keys that would widen the call beyond the confirmed entity.
_TARGETS = ("entity_id", "device_id", "area_id", "floor_id", "label_id")


# An option naming a mode, and the attribute listing the entity's modes: Home Assistant
# refuses a mode outside the list (climate's and fan's `_valid_..._mode_or_raise`), except
# an hvac_mode, which 2025.4 only warns about and the entity takes (a generic thermostat
# asked for "cool" is set to cool and turns its heater on): refused here all the same.
_MODES = (
    ("hvac_mode", "hvac_modes"),
    ("preset_mode", "preset_modes"),
    ("fan_mode", "fan_modes"),
    ("swing_mode", "swing_modes"),
    ("effect", "effect_list"),
)


# Numbers an entity bounds with its own attributes (climate's temperature and humidity).
_BOUNDS = (
    ("temperature", "min_temp", "max_temp", "°"),
    ("target_temp_low", "min_temp", "max_temp", "°"),
    ("target_temp_high", "min_temp", "max_temp", "°"),
    ("humidity", "min_humidity", "max_humidity", " %"),
)


def checked_domain(domain: str) -> str:
    name = domain.strip().lower()
    if not _NAME.fullmatch(name) or len(name) > 64:
        raise ToolException(f"Error: the domain {trim(domain, 70)!r} is not a domain name")
    return name


def checked_service(service: str) -> str:
    name = service.strip().lower()
    if not _NAME.fullmatch(name) or len(name) > 64:
        raise ToolException(f"Error: the service {trim(service, 70)!r} is not a service name")
    return name


def checked_entity(entity_id: str) -> str:
    entity = entity_id.strip().lower()
    if not entity:
        raise ToolException("Error: the entity id is empty")
    if not ENTITY_ID.fullmatch(entity) or len(entity) > 255:
        raise ToolException(
            f"Error: the entity id {trim(entity_id, 70)!r} is not one; an entity id is "
            "domain.name, like light.kitchen"
        )
    return entity


def checked_area(area: str) -> str:
    where = " ".join(area.split())
    if len(where) > MAX_AREA_CHARS or not _AREA.fullmatch(where):
        raise ToolException(f"Error: the area {trim(area, 70)!r} is not an area name")
    return where


def checked_data(data: dict[str, Any] | None) -> dict[str, Any]:
    """The service's options; never a second target, never more than a service needs."""
    data = dict(data or {})
    widened = [key for key in _TARGETS if key in data]
    if widened:
        raise ToolException(
            f"Error: data may not hold {', '.join(widened)}: a call acts on its one entity_id"
        )
    if len(json.dumps(data, default=str)) > MAX_DATA_CHARS:
        raise ToolException(f"Error: data is longer than {MAX_DATA_CHARS} characters")
    return data


def refusal(
    domain: str,
    service: str,
    entity: str,
    data: dict[str, Any],
    state: dict[str, Any],
    description: dict[str, Any] | None,
) -> str | None:
    """Why Home Assistant would refuse the call, as far as its description of the service and
    the entity's attributes tell; None when nothing does."""
    what = f"{domain}.{service}"
    attributes = state["attributes"]
    features = attributes.get("supported_features")
    features = features if isinstance(features, int) else 0
    if description is not None:
        if not description:
            return f"Home Assistant has no service {what}"
        fields = _fields(description)
        unknown = [key for key in data if key not in fields]
        if unknown:
            known = ", ".join(sorted(fields)) or "none"
            return f"{what} takes no {', '.join(unknown)}; the options it takes are {known}"
        for key, value in data.items():
            problem = _out_of_selector(key, value, fields[key])
            if problem is not None:
                return problem
        required = [
            f
            for target in (description.get("target") or {}).get("entity") or []
            if isinstance(target, dict)
            for f in [target.get("supported_features")]
            if isinstance(f, list) and f
        ]
        if required and not any(
            any(isinstance(bits, int) and features & bits == bits for bits in needed)
            for needed in required
        ):
            return f"{entity} does not support {what}"
    if domain == "climate" and service == "set_temperature":
        if "temperature" in data and not features & 1:
            return f"{entity} keeps a temperature range: set target_temp_low and target_temp_high"
        if {"target_temp_low", "target_temp_high"} & data.keys() and not features & 2:
            return f"{entity} keeps one temperature: set temperature"
        low = as_number(data.get("target_temp_low"))
        high = as_number(data.get("target_temp_high"))
        if low is not None and high is not None and low > high:
            return f"target_temp_low ({low:g}°) is above target_temp_high ({high:g}°)"
    for key, listed in _MODES:
        modes = attributes.get(listed)
        if key not in data:
            continue
        if modes is None:
            # An entity lists its modes of a kind whenever it has the feature: without the
            # list, Home Assistant refuses the mode (a fan's preset, a 500) or drops it and
            # runs the rest (a light's effect), neither what the user would be asked.
            return f"{entity} has no {key} {value_text(data[key])}: it has no {listed}"
        if isinstance(modes, list) and data[key] not in modes:
            shown = ", ".join(str(m) for m in modes) or "none"
            return f"{entity} has no {key} {value_text(data[key])}; its {listed} are {shown}"
    for key, least, most, unit in _BOUNDS:
        low, high, value = attributes.get(least), attributes.get(most), as_number(data.get(key))
        if value is not None and is_number(low) and is_number(high) and not low <= value <= high:
            return (
                f"{entity} accepts a {key} from {low:g}{unit} to {high:g}{unit}, "
                f"not {value:g}{unit}"
            )
    return None


def _fields(description: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A service's options by name, those of its sections too (`advanced_fields`)."""
    found: dict[str, dict[str, Any]] = {}
    for name, spec in (description.get("fields") or {}).items():
        if not isinstance(spec, dict):
            continue
        if isinstance(spec.get("fields"), dict):  # a section
            found |= {k: v for k, v in spec["fields"].items() if isinstance(v, dict)}
        else:
            found[name] = spec
    return found


def _out_of_selector(key: str, given: Any, spec: dict[str, Any]) -> str | None:
    """What is not a number, or a number outside the bounds the service's own description
    gives it, in an option the description says is a number."""
    number = (spec.get("selector") or {}).get("number")
    if not isinstance(number, dict):
        return None
    value = as_number(given)
    if value is None:
        return f"{key} must be a number, not {value_text(given)}"
    low, high = number.get("min"), number.get("max")
    if is_number(low) and is_number(high) and not low <= value <= high:
        return f"{key} must be from {low:g} to {high:g}, not {value:g}"
    return None
