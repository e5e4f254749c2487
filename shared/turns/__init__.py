"""The store of turns in Redis: `TurnStore` admits, creates, reads and moves turn records
(shared/turn_record.py) between their states, one concern a module:

- admission.py: a turn's tokens and slot (`admit`, `release`);
- creation.py: its record stored, its stream opened, its job queued (`create`), and its
  removal (`never_ran`, `forget`);
- reads.py: `get` and `recent`, which write nothing;
- moves.py: `claim`, `finish`, `end`, and its conversation's line moving on (`advance`);
- deliveries.py: the webhook a turn's ending queues again should its first call die;
- reaping.py: the turns that cannot end on their own (`reap_lapsed`, `settle`);
- line.py: where a turn waiting in its conversation's line stands (`take_turn`).

The moves themselves (their scripts, their named results) and how a turn ends for each
cause are shared/lifecycle.py's; the store runs them.
"""

from __future__ import annotations

from shared.turns.admission import Admitting
from shared.turns.creation import Creating
from shared.turns.line import TurnTaking
from shared.turns.reads import Reading

__all__ = ["TurnStore"]


class TurnStore(Admitting, Creating, TurnTaking, Reading):
    """Creates, reads and moves turn records; the one place that writes a turn's status.

    `redis` is the data role, `queue` the queue role (shared/turns/roles.py).
    """
