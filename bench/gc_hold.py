"""The benchmark's own processes keep the collector's full passes out of what they measure.

A full pass (generation 2) stops a process for as long as it takes to scan every tracked
object it holds. The load generator keeps every frame it received and the scripted
upstream every exchange it served, so their full passes grow through a run: in a relay
section, up to 190 ms in the load generator and 370 ms in the upstream. A pause
in the load generator lands in every frame then in flight; one in the upstream holds
every stream's next token, so the streams go on in lockstep and their frames arrive in
bursts. Both showed up as Bernard's relay latency (docs/benchmarks.md, "The relay figure
and the benchmark's own collector"), and moved with any change to what these processes
import, which shifts when their passes fall.

So the load generator (bench/cli.py) and the upstream (bench/upstream.py) freeze what
they built and hold full passes; the young generations are still collected (most garbage
dies young), and the load generator collects, in itself and in the upstream, after each
section, where a pause measures nothing. What is measured runs as in production: the API,
the worker and the baseline (bench/baseline.py, which stands for the API and the worker in
one process) freeze what they built at start (api/main.py, worker/main.py) and keep their
full passes.
"""

from __future__ import annotations

import gc

# How many generation-1 passes come before a full pass is considered: a count no run
# reaches (Python then also waits for the long-lived objects to grow by a quarter).
HELD = 1_000_000_000


def hold_full_collections() -> None:
    """Collect now, freeze what survives, and take no full pass until `collect_held`."""
    gc.collect()
    gc.freeze()
    young, older, _ = gc.get_threshold()
    gc.set_threshold(young, older, HELD)


def collect_held() -> None:
    """The full pass that was held: collect everything not frozen, and freeze what
    survives, so the next stretch's passes scan only what it allocates."""
    gc.collect()
    gc.freeze()
