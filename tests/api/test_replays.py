"""`ReplayGate` (api/replays.py): how many replays of a stream one API process runs at once,
and that one user's many leave room for another's."""

from __future__ import annotations

import asyncio

from api.replays import ReplayGate


async def test_a_gate_lets_in_its_number_at_once_one_per_user() -> None:
    gate = ReplayGate(concurrent=2)
    inside: list[str] = []
    most = 0
    clash = False

    async def run(owner: str) -> None:
        nonlocal most, clash
        async with gate.slot(owner):
            clash = clash or owner in inside
            inside.append(owner)
            most = max(most, len(inside))
            await asyncio.sleep(0.01)
            inside.remove(owner)

    await asyncio.gather(*(run(owner) for owner in ["a"] * 3 + ["b"] * 3 + ["c"] * 3))
    assert (most, clash) == (2, False)
    assert gate._owners == {}  # nothing is kept of users who replay no more


async def test_one_users_waiting_replays_leave_room_for_another_user() -> None:
    gate = ReplayGate(concurrent=2)
    release = asyncio.Event()
    entered: list[str] = []

    async def run(name: str, owner: str) -> None:
        async with gate.slot(owner):
            entered.append(name)
            await release.wait()

    tasks = [asyncio.create_task(run(f"a{i}", "a")) for i in range(5)]
    await asyncio.sleep(0.01)
    tasks.append(asyncio.create_task(run("b0", "b")))
    await asyncio.sleep(0.01)
    assert entered == ["a0", "b0"]
    release.set()
    await asyncio.gather(*tasks)
    assert sorted(entered) == ["a0", "a1", "a2", "a3", "a4", "b0"]
