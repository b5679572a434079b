"""Every reachable (place, event) pair of the supervisor's machine, reached by a search.

The search makes the moves of :class:`~tests.serve.test_supervisor_machine.Play` (the world that
plays the I/O layer, with its checks after every step) from the first generation's start, fewest
disturbances first, never twice from one state. What bounds it is the number of *disturbances* a
sequence holds: a progress move is free (a worker that was started reports ready with the app's
usual state kind, a worker told to stop exits, a drain reports begun or settles drained, a
handover's new generation proves it serves, the grace is over, the state is handed, the queue is
emptied, a replacement's pause is over); every other move (a reload, a signal, a scaling, a crash,
a timeout, a refusing state kind, an orchestrator's drain or rollback, a failed drain or proof)
costs one. Each configuration is searched exhaustively within its bound: one worker a generation
(scaled to two at most) with up to three disturbances, with and without a state adapter, and two
workers (the first generation's private drains need a worker ready while another starts) with up to
two, one of them without a handoff token (every state refused); at most two generations. Within
these bounds the search reaches every pair the table allows, save those named and argued in
:data:`~tests.serve.test_supervisor_machine.UNREACHABLE`, and none of those; it also reaches the
abort of a handover whose new generation refuses the state.
"""

from __future__ import annotations

import collections
import pickle
from typing import Any, Final

import pytest

from .test_supervisor_machine import KINDS, POSSIBLE, REACHABLE, UNREACHABLE, Play, Reach

#: The configurations searched: (workers, a state adapter, a handoff token, disturbances).
CONFIGURATIONS: Final = (
    (1, False, True, 3),
    (1, True, True, 3),
    (2, False, True, 2),
    (2, True, True, 2),
    (2, True, False, 2),
)
#: The most generations a sequence starts (one handover, or one aborted).
GENERATIONS: Final = 2
#: A generation's most workers (``--workers`` and scaling up).
MOST_WORKERS: Final = 2

Move = tuple[str, tuple[Any, ...]]


def _free(play: Play, move: Move) -> bool:
    """A progress move: what follows on its own from what the supervisor did."""
    name, args = move
    processes = play.world.processes
    match name:
        case "ready":
            g, i, kind = args
            return processes[(g, i)] == "starting" and kind in (None, KINDS[0])
        case "exit":
            return processes[args] not in ("starting", "ready", "accepting")
        case "drain_settles":
            return bool(args[1])
        case "proof_settles":
            return bool(args[1])
        case _:
            return name in (
                "drain_begun",
                "grace_over",
                "state_handed",
                "queue_emptied",
                "replace_due",
            )


def _key(play: Play) -> str:
    """The state: the machine's and the world's, its stop timers numbered by rank (a new timer
    is always the highest) and the stops counted up to the forced one."""
    machine, world = play.machine, play.world
    generations = vars(machine)["_generations"]
    timers = set(world.stop_timers) | {t for g in generations.values() for t in g.timers if t}
    rank = {timer: index for index, timer in enumerate(sorted(timers), 1)}
    held = {
        number: {**vars(g), "timers": [rank.get(t, 0) for t in g.timers]}
        for number, g in generations.items()
    }
    ours = {**vars(machine), "_generations": held, "_timers": 0, "stops": min(machine.stops, 2)}
    theirs = {**vars(world), "stop_timers": {rank[t]: v for t, v in world.stop_timers.items()}}
    return repr((sorted(ours.items()), sorted(theirs.items()), play.kinds))


def _search(workers: int, kinds: bool, token: bool, budget: int) -> Reach:
    reach = Reach()
    root = Play(workers, kinds=kinds, token=token, max_workers=MOST_WORKERS, reach=reach)
    root.begin()
    root.reach = Reach()  # not pickled with each state
    best = {_key(root): 0}
    queue: collections.deque[tuple[int, bytes, tuple[Move, ...]]] = collections.deque(
        [(0, pickle.dumps(root), ())]
    )
    while queue:
        cost, state, path = queue.popleft()
        before = pickle.loads(state)
        for move in before.moves():
            spent = cost if _free(before, move) else cost + 1
            if spent > budget:
                continue
            play = pickle.loads(state)
            play.reach = reach
            try:
                getattr(play, move[0])(*move[1])
                play.check()
            except AssertionError as error:
                raise AssertionError(f"{error} after {[*path, move]}") from error
            if vars(play.machine)["_number"] > GENERATIONS:
                continue
            play.reach = root.reach
            key = _key(play)
            if best.get(key, budget + 1) <= spent:
                continue
            best[key] = spent
            entry = (spent, pickle.dumps(play), (*path, move))
            if spent == cost:
                queue.appendleft(entry)
            else:
                queue.append(entry)
    return reach


# About 10 s alone (some 80,000 moves); more under coverage on a loaded machine, as the random
# sequences of test_supervisor_machine.py.
@pytest.mark.timeout(300)
def test_search_reaches_every_reachable_pair() -> None:
    """Every sequence within the bounds keeps every invariant and reaches no pair the table rules
    out nor any argued unreachable; together they reach every other pair the table allows, and
    a handover aborted because the new generation could not take the state."""
    reached = Reach()
    for configuration in CONFIGURATIONS:
        found = _search(*configuration)
        assert found.pairs <= POSSIBLE, (configuration, sorted(found.pairs - POSSIBLE))
        unreachable = found.pairs & set(UNREACHABLE)
        assert not unreachable, (configuration, sorted(unreachable))
        reached.pairs |= found.pairs
        reached.state_refused |= found.state_refused
    assert not REACHABLE - reached.pairs, sorted(REACHABLE - reached.pairs)
    assert reached.state_refused
