"""Keyed work queue: ordering, width, pauses, refusals, intake fence, drain, abort, participant."""

from __future__ import annotations

import asyncio
import gc
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forgezero_lifecycle._errors import (
    ConfigurationError,
    QueueIntakePausedError,
    QueueKeyStoppedError,
    QueueStoppedError,
    TaskCancelledError,
)
from forgezero_lifecycle.core.participant import WorkParticipant
from forgezero_lifecycle.core.queue import KeyedQueue, QueueDrainReport, QueueStatistics
from forgezero_lifecycle.testing import ManualClock, settle


class Blocker:
    """A handler that records when it starts and finishes only when released."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.active: set[str] = set()
        self.peak = 0
        self._gates: dict[str, asyncio.Event] = {}

    async def __call__(self, name: str) -> str:
        self.started.append(name)
        self.active.add(name)
        self.peak = max(self.peak, len(self.active))
        gate = self._gates.setdefault(name, asyncio.Event())
        try:
            await gate.wait()
        finally:
            self.active.discard(name)
        return name

    def release(self, name: str) -> None:
        self._gates.setdefault(name, asyncio.Event()).set()


async def _ok(value: int) -> int:
    return value


async def _ok_text(value: str) -> str:
    return value


async def _boom() -> None:
    raise LookupError("handler failed")


@pytest.mark.anyio
async def test_run_is_transparent() -> None:
    """`run` is transparent: the handler's value comes back, its exception propagates."""
    queue = KeyedQueue()
    assert await queue.run("k", _ok, 7) == 7
    with pytest.raises(LookupError, match="handler failed"):
        await queue.run("k", _boom)
    stats = queue.statistics()
    assert (stats.completed, stats.failed, stats.running, stats.queued, stats.keys) == (
        1,
        1,
        0,
        0,
        0,
    )


class _OrderTracker:
    """Records, per key, the order tasks were submitted and run, and how many ran at once."""

    def __init__(self) -> None:
        self.submitted: defaultdict[str, list[int]] = defaultdict(list)
        self.executed: defaultdict[str, list[int]] = defaultdict(list)
        self.active: set[str] = set()
        self.peak = 0

    async def handler(self, key: str, index: int, steps: int) -> int:
        assert key not in self.active, f"two tasks of {key} overlap"
        self.active.add(key)
        self.peak = max(self.peak, len(self.active))
        self.executed[key].append(index)
        for _ in range(steps):
            await asyncio.sleep(0)
        self.active.discard(key)
        return index

    async def submit(self, queue: KeyedQueue, key: str, index: int, steps: int) -> int:
        self.submitted[key].append(index)
        result: int = await queue.run(key, self.handler, key, index, steps)
        return result


@pytest.mark.anyio
@settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    plan=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 4), st.integers(0, 4)),
        min_size=1,
        max_size=25,
    ),
    width=st.integers(1, 4),
)
async def test_same_key_keeps_order(plan: list[tuple[int, int, int]], width: int) -> None:
    """Per key, handlers start in submission order and never overlap; at most width run."""
    queue = KeyedQueue(width=width)
    tracker = _OrderTracker()

    async def submit(index: int, key_number: int, delay: int, steps: int) -> None:
        for _ in range(delay):
            await asyncio.sleep(0)
        assert await tracker.submit(queue, f"k{key_number}", index, steps) == index

    await asyncio.gather(*(submit(i, *step) for i, step in enumerate(plan)))
    assert tracker.executed == tracker.submitted
    assert tracker.peak <= width
    stats = queue.statistics()
    assert (stats.running, stats.queued, stats.keys, stats.completed) == (0, 0, 0, len(plan))


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(0, 3), st.integers(0, 3)),
        st.tuples(st.sampled_from(["pause", "resume"]), st.just(0), st.just(0)),
        st.tuples(st.sampled_from(["pause_key", "resume_key"]), st.integers(0, 3), st.just(0)),
        st.tuples(st.just("yield"), st.just(0), st.integers(1, 3)),
    ),
    max_size=40,
)


@pytest.mark.anyio
@settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS, width=st.integers(1, 3))
async def test_order_holds_across_pauses(ops: list[tuple[str, int, int]], width: int) -> None:
    """Random pause/resume of the queue and of keys never reorders, overlaps or loses a task."""
    queue = KeyedQueue(width=width)
    tracker = _OrderTracker()
    tasks = []
    for index, (op, key_number, amount) in enumerate(ops):
        key = f"k{key_number}"
        if op == "submit":
            tasks.append(asyncio.create_task(tracker.submit(queue, key, index, amount)))
        elif op == "pause":
            queue.pause()
        elif op == "resume":
            queue.resume()
        elif op == "pause_key":
            queue.pause_key(key)
        elif op == "resume_key":
            queue.resume_key(key)
        for _ in range(amount if op == "yield" else 0):
            await asyncio.sleep(0)
    queue.resume()
    for key_number in range(4):
        queue.resume_key(f"k{key_number}")
    await asyncio.gather(*tasks)
    await queue.wait_idle()
    assert tracker.executed == tracker.submitted
    assert tracker.peak <= width
    stats = queue.statistics()
    assert (stats.running, stats.queued, stats.keys, stats.completed) == (0, 0, 0, len(tasks))


@pytest.mark.anyio
async def test_keys_parallel_up_to_width() -> None:
    """Four keys on a width-2 queue: two run, two wait, and the waiters start as slots free."""
    queue = KeyedQueue(width=2)
    blocker = Blocker()
    tasks = [asyncio.create_task(queue.run(name, blocker, name)) for name in "abcd"]
    await settle()
    assert blocker.started == ["a", "b"]
    stats = queue.statistics()
    assert (stats.running, stats.queued, stats.keys) == (2, 2, 4)
    blocker.release("a")
    await settle()
    assert blocker.started == ["a", "b", "c"]
    for name in "bcd":
        blocker.release(name)
    assert await asyncio.gather(*tasks) == list("abcd")
    assert blocker.peak == 2


@pytest.mark.anyio
async def test_pause_holds_until_resume() -> None:
    """`pause` accepts new work but starts none of it; `resume` starts it."""
    queue = KeyedQueue()
    queue.pause()
    task = asyncio.create_task(queue.run("k", _ok, 1))
    await settle()
    assert not task.done()
    assert queue.statistics().queued == 1
    assert queue.statistics().paused
    queue.resume()
    assert await task == 1


@pytest.mark.anyio
async def test_pause_key_holds_that_key() -> None:
    """A paused key keeps its queue; other keys run; the running task of the key finishes."""
    queue = KeyedQueue()
    blocker = Blocker()
    running = asyncio.create_task(queue.run("a", blocker, "a1"))
    await settle()
    queue.pause_key("a")
    held = asyncio.create_task(queue.run("a", blocker, "a2"))
    other = asyncio.create_task(queue.run("b", blocker, "b1"))
    await settle()
    assert blocker.started == ["a1", "b1"]
    assert queue.statistics().paused_keys == ("a",)
    blocker.release("a1")
    blocker.release("b1")
    await settle()
    assert running.done()
    assert other.done()
    assert not held.done()
    queue.resume_key("a")
    blocker.release("a2")
    assert await held == "a2"
    assert queue.statistics().paused_keys == ()


@pytest.mark.anyio
async def test_paused_key_skips_free_slot() -> None:
    """A paused key keeps waiting when a slot frees up, even with nothing else queued."""
    queue = KeyedQueue(width=1)
    blocker = Blocker()
    first = asyncio.create_task(queue.run("a", blocker, "a1"))
    held = asyncio.create_task(queue.run("b", blocker, "b1"))
    await settle()
    queue.pause_key("b")
    blocker.release("a1")
    await settle()
    assert await first == "a1"
    assert blocker.started == ["a1"]
    assert (queue.statistics().running, queue.statistics().queued) == (0, 1)
    queue.resume_key("b")
    blocker.release("b1")
    assert await held == "b1"


@pytest.mark.anyio
async def test_key_pause_resume_no_overlap() -> None:
    """Pausing and resuming a waiting key cannot hand it a second slot while it runs."""
    queue = KeyedQueue(width=2)
    blocker = Blocker()
    tasks = [asyncio.create_task(queue.run(k[0], blocker, k)) for k in ("x1", "y1", "b1", "b2")]
    await settle()
    queue.pause_key("b")
    queue.resume_key("b")
    blocker.release("x1")
    await settle()
    assert blocker.started == ["x1", "y1", "b1"]
    blocker.release("y1")
    await settle()
    assert blocker.started == ["x1", "y1", "b1"]  # b2 waits for b1, though a slot is free
    blocker.release("b1")
    blocker.release("b2")
    assert list(await asyncio.gather(*tasks)) == ["x1", "y1", "b1", "b2"]
    assert blocker.peak == 2


@pytest.mark.anyio
async def test_stop_key_refuses_new_work() -> None:
    """`stop_key` refuses new submissions for one key only; already queued ones still run."""
    queue = KeyedQueue()
    blocker = Blocker()
    first = asyncio.create_task(queue.run("a", blocker, "a1"))
    second = asyncio.create_task(queue.run("a", blocker, "a2"))
    await settle()
    queue.stop_key("a")
    with pytest.raises(QueueKeyStoppedError) as refused:
        await queue.run("a", _ok, 1)
    assert refused.value.key == "a"
    assert refused.value.code == "QUEUE_KEY_STOPPED"
    assert await queue.run("b", _ok, 2) == 2
    blocker.release("a1")
    blocker.release("a2")
    assert list(await asyncio.gather(first, second)) == ["a1", "a2"]
    assert queue.statistics().stopped_keys == ("a",)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("stop", "pause_intake", "stop_key", "expected"),
    [
        (True, True, True, QueueStoppedError),
        (True, False, True, QueueStoppedError),
        (True, True, False, QueueStoppedError),
        (False, True, True, QueueIntakePausedError),
        (False, True, False, QueueIntakePausedError),
        (False, False, True, QueueKeyStoppedError),
    ],
)
async def test_refusal_precedence(
    stop: bool, pause_intake: bool, stop_key: bool, expected: type[Exception]
) -> None:
    """Stopped wins over intake paused, which wins over a stopped key."""
    queue = KeyedQueue()
    if stop_key:
        queue.stop_key("k")
    if pause_intake:
        queue.pause_intake()
    if stop:
        queue.stop()
    with pytest.raises(expected):
        await queue.run("k", _ok, 1)
    assert queue.statistics().completed == 0


@pytest.mark.anyio
async def test_refusal_leaves_nothing() -> None:
    """A refusal raises at the await; no task is created and nothing warns at collection."""
    queue = KeyedQueue()
    queue.pause_intake()
    tasks_before = len(asyncio.all_tasks())
    for _ in range(50):
        with pytest.raises(QueueIntakePausedError):
            await queue.run("k", _ok, 1)
    queue.stop()
    with pytest.raises(QueueStoppedError):
        await queue.run("k", _ok, 1)
    assert len(asyncio.all_tasks()) == tasks_before
    gc.collect()
    await settle()
    stats = queue.statistics()
    assert (stats.queued, stats.keys, stats.completed, stats.failed) == (0, 0, 0, 0)


@pytest.mark.anyio
async def test_intake_pause_is_reversible() -> None:
    """While intake is paused accepted work finishes, wait_idle returns, and resume reopens."""
    queue = KeyedQueue()
    blocker = Blocker()
    accepted = [asyncio.create_task(queue.run("a", blocker, n)) for n in ("a1", "a2")]
    await settle()
    queue.pause_intake()
    assert queue.statistics().intake_paused
    with pytest.raises(QueueIntakePausedError) as refused:
        await queue.run("b", _ok, 1)
    assert refused.value.code == "QUEUE_INTAKE_PAUSED"
    idle = asyncio.create_task(queue.wait_idle())
    await settle()
    assert not idle.done()
    blocker.release("a1")
    blocker.release("a2")
    await idle
    assert [t.result() for t in accepted] == ["a1", "a2"]
    assert queue.in_flight() == 0
    queue.resume_intake()
    assert not queue.statistics().intake_paused
    assert await queue.run("b", _ok, 3) == 3


@pytest.mark.anyio
async def test_resume_after_stop_refuses() -> None:
    """Stop is final: resuming intake afterwards keeps refusing with QueueStoppedError."""
    queue = KeyedQueue()
    queue.pause_intake()
    queue.stop()
    queue.resume_intake()
    assert queue.statistics().intake_paused
    with pytest.raises(QueueStoppedError):
        await queue.run("k", _ok, 1)


@pytest.mark.anyio
async def test_wait_idle_on_idle_queue() -> None:
    """An idle queue has nothing to wait for."""
    waiting = asyncio.ensure_future(KeyedQueue().wait_idle())
    await asyncio.sleep(0)  # one turn of the loop, no more
    assert waiting.done()
    await waiting


@pytest.mark.anyio
async def test_abort_cancels_queued() -> None:
    """`abort` fails every queued task with TaskCancelledError and stops the queue."""
    queue = KeyedQueue(width=1)
    blocker = Blocker()
    running = asyncio.create_task(queue.run("a", blocker, "a1"))
    queued = [asyncio.create_task(queue.run(k, blocker, k)) for k in ("a", "b")]
    await settle()
    assert queue.abort() == 2
    for task in queued:
        with pytest.raises(TaskCancelledError) as cancelled:
            await task
        assert cancelled.value.code == "QUEUE_TASK_CANCELLED"
    with pytest.raises(QueueStoppedError):
        await queue.run("c", _ok, 1)
    blocker.release("a1")
    assert await running == "a1"
    await queue.wait_idle()
    assert blocker.started == ["a1"]


@pytest.mark.anyio
async def test_drain_reports_outcomes() -> None:
    """At the deadline, drain cancels queued work and reports what finished and what runs on."""
    clock = ManualClock()
    queue = KeyedQueue(width=1, clock=clock)
    blocker = Blocker()
    done = asyncio.create_task(queue.run("a", blocker, "a1"))
    waiting = asyncio.create_task(queue.run("a", blocker, "a2"))
    stuck = asyncio.create_task(queue.run("b", blocker, "b1"))
    await settle()
    drain = asyncio.create_task(queue.drain(5.0))
    await settle()
    blocker.release("a1")  # the freed slot goes to key b (round robin), a2 keeps waiting
    await clock.advance(5.0)
    report = await drain
    assert report == QueueDrainReport(completed=1, cancelled=1, running=1)
    assert await done == "a1"
    with pytest.raises(TaskCancelledError):
        await waiting
    blocker.release("b1")
    assert await stuck == "b1"


@pytest.mark.anyio
async def test_drain_in_time_cancels_none() -> None:
    """A drain whose work finishes before the deadline reports it all completed."""
    clock = ManualClock()
    queue = KeyedQueue(clock=clock)
    blocker = Blocker()
    tasks = [asyncio.create_task(queue.run(k, blocker, k)) for k in ("a", "b")]
    await settle()
    drain = asyncio.create_task(queue.drain(5.0))
    await settle()
    blocker.release("a")
    blocker.release("b")
    report = await drain
    assert report == QueueDrainReport(completed=2, cancelled=0, running=0)
    await asyncio.gather(*tasks)
    assert clock.sleepers == 0


@pytest.mark.anyio
async def test_cancelled_waiter_leaves() -> None:
    """Cancelling a queued caller removes its task; the key's later tasks still run in order."""
    queue = KeyedQueue()
    blocker = Blocker()
    first = asyncio.create_task(queue.run("a", blocker, "a1"))
    second = asyncio.create_task(queue.run("a", blocker, "a2"))
    third = asyncio.create_task(queue.run("a", blocker, "a3"))
    await settle()
    second.cancel()
    await settle()
    assert queue.statistics().queued == 1
    blocker.release("a1")
    blocker.release("a3")
    assert list(await asyncio.gather(first, third)) == ["a1", "a3"]
    assert blocker.started == ["a1", "a3"]
    assert second.cancelled()
    assert queue.in_flight() == 0


@pytest.mark.anyio
async def test_late_cancel_is_skipped() -> None:
    """A caller cancelled but not yet resumed when its turn comes is passed over, not run."""
    queue = KeyedQueue(width=1)
    waiting: list[asyncio.Task[str]] = []

    gate = asyncio.Event()

    async def first() -> str:
        await gate.wait()
        waiting[0].cancel()  # on return its turn comes, before it can resume
        return "a1"

    running = asyncio.create_task(queue.run("a", first))
    await settle()
    waiting.append(asyncio.create_task(queue.run("b", _ok_text, "b1")))
    other = asyncio.create_task(queue.run("c", _ok_text, "c1"))
    await settle()
    gate.set()
    assert await running == "a1"
    assert await other == "c1"
    await settle()
    assert waiting[0].cancelled()
    stats = queue.statistics()
    assert (stats.running, stats.queued, stats.keys, stats.completed) == (0, 0, 0, 2)


@pytest.mark.anyio
async def test_cancelled_key_disappears() -> None:
    """A key whose last queued caller is cancelled disappears from the snapshot."""
    queue = KeyedQueue(width=1)
    blocker = Blocker()
    running = asyncio.create_task(queue.run("a", blocker, "a1"))
    waiting = asyncio.create_task(queue.run("b", blocker, "b1"))
    await settle()
    assert queue.statistics().keys == 2
    waiting.cancel()
    await settle()
    assert (queue.statistics().keys, queue.statistics().queued) == (1, 0)
    blocker.release("a1")
    assert await running == "a1"
    await queue.wait_idle()


@pytest.mark.anyio
async def test_granted_cancel_frees_key() -> None:
    """A turn granted to a caller that is cancelled before it runs passes to the next task."""
    queue = KeyedQueue()
    blocker = Blocker()
    second: asyncio.Task[str] | None = None

    async def first_then_cancel_second() -> str:
        result = await queue.run("a", blocker, "a1")
        assert second is not None
        second.cancel()  # the turn was just handed to `second`, which has not resumed yet
        return result

    first = asyncio.create_task(first_then_cancel_second())
    await settle()
    second = asyncio.create_task(queue.run("a", blocker, "a2"))
    third = asyncio.create_task(queue.run("a", blocker, "a3"))
    await settle()
    blocker.release("a1")
    blocker.release("a3")
    assert await first == "a1"
    assert await third == "a3"
    assert second.cancelled()
    assert blocker.started == ["a1", "a3"]
    assert queue.in_flight() == 0


@pytest.mark.anyio
async def test_running_cancel_is_failure() -> None:
    """A handler cancelled with its caller is counted failed, and the key moves on."""
    queue = KeyedQueue()
    blocker = Blocker()
    first = asyncio.create_task(queue.run("a", blocker, "a1"))
    second = asyncio.create_task(queue.run("a", blocker, "a2"))
    await settle()
    first.cancel()
    blocker.release("a2")
    assert await second == "a2"
    assert first.cancelled()
    stats = queue.statistics()
    assert (stats.completed, stats.failed, stats.running) == (1, 1, 0)


@pytest.mark.anyio
async def test_snapshot_is_frozen_copy() -> None:
    """The snapshot carries width, counters and flags, and serialises to snake_case."""
    queue = KeyedQueue(width=3)
    queue.pause()
    queue.pause_key("p")
    queue.stop_key("s")
    task = asyncio.create_task(queue.run("a", _ok, 1))
    await settle()
    stats = queue.statistics()
    assert stats == QueueStatistics(
        width=3,
        running=0,
        queued=1,
        keys=1,
        paused=True,
        intake_paused=False,
        paused_keys=("p",),
        stopped_keys=("s",),
        completed=0,
        failed=0,
    )
    assert stats.to_dict()["paused_keys"] == ["p"]
    assert queue.width == 3
    with pytest.raises(AttributeError):
        stats.running = 5  # deliberately writing to a frozen snapshot
    queue.resume()
    assert await task == 1


@pytest.mark.parametrize("width", [0, -1, True, 1.5])
def test_width_positive_int(width: object) -> None:
    """A queue that could never run anything is refused at construction."""
    with pytest.raises(ConfigurationError):
        KeyedQueue(width=width)  # deliberately the wrong type: the test is about refusing it


@pytest.mark.anyio
async def test_participant_reversible() -> None:
    """The queue participant reports kind jobs, counts running + queued, and drains to idle."""
    clock = ManualClock()
    queue = KeyedQueue(width=1, clock=clock)
    participant = queue.participant()
    assert isinstance(participant, WorkParticipant)
    assert participant.kind == "jobs"
    blocker = Blocker()
    tasks = [asyncio.create_task(queue.run(k, blocker, k)) for k in ("a", "b")]
    await settle()
    assert participant.in_flight() == 2
    participant.pause_intake()
    with pytest.raises(QueueIntakePausedError):
        await queue.run("c", _ok, 1)
    drain = asyncio.create_task(participant.finish(10.0))
    await settle()
    blocker.release("a")
    blocker.release("b")
    await drain
    assert participant.in_flight() == 0
    await asyncio.gather(*tasks)
    await participant.finish(10.0)  # already idle: returns at once
    participant.resume_intake()
    assert await queue.run("c", _ok, 4) == 4


@pytest.mark.anyio
async def test_participant_never_cancels() -> None:
    """Memory work cannot be handed over: the drain waits past its timeout and never cancels."""
    clock = ManualClock()
    queue = KeyedQueue(width=1, clock=clock)
    participant = queue.participant()
    blocker = Blocker()
    tasks = [asyncio.create_task(queue.run(k, blocker, k)) for k in ("a", "b")]
    await settle()
    drain = asyncio.create_task(participant.finish(3.0))
    await settle()
    await clock.advance(3.0)
    assert not drain.done()
    assert participant.in_flight() == 2
    blocker.release("a")
    blocker.release("b")
    assert await asyncio.gather(*tasks) == ["a", "b"]
    await drain
