"""Numbers as Home Assistant's service schemas read them, for the tools that check a call
(worker/tools/home_assistant/checks.py) and the policy that matches one (worker/tools/policy.py)."""

from __future__ import annotations

import math
from typing import Any, TypeGuard


def is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def as_number(value: Any) -> float | None:
    """A value as `vol.Coerce(float)` reads it ("40" is 40.0, and a temperature of "40" is
    refused as 40 is); None when it is not one, and for not-a-number and the infinities,
    which Home Assistant takes or refuses without meaning them."""
    if is_number(value):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None
