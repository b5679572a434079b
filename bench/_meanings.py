"""What each row of BENCHMARKS.md measures, what its ratio means, and why a known miss stands.

Tables as data, read by :func:`bench._report.markdown`: :data:`MEANINGS` per benchmark (the
first key that a row's ``benchmark`` starts with), :data:`MISSED_BECAUSE` per benchmark and
metric (both matched as prefixes) for a target the library cannot meet or that the machine
cannot show; a missed row without a reason here is listed without one, as a miss to work on.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["MEANINGS", "MISSED_BECAUSE", "meaning", "missed_because"]

#: benchmark prefix → (what was measured, what the ratio means).
MEANINGS: Final[dict[str, tuple[str, str]]] = {
    "middleware": (
        "one request through a trivial ASGI app, in-process, with a real uvicorn (or hypercorn)"
        " request's receive and send; the app bare, under InFlightMiddleware, under a bare"
        " counting middleware; figures are ns added per request (CPU time of this thread)",
        "ours / the bare app's time per request in the same round: 1.10 is 10 % more per call"
        " of the trivial app; a real app's own work makes the share smaller (the FastAPI row)",
    ),
    "server.": (
        "a real uvicorn process serving the hello app, loaded by wrk from another process;"
        " requests/s, p99 latency, and the server process's own CPU time per response",
        "ours / bare in the same round (median of per-round ratios): requests/s 0.97 is 3 %"
        " fewer answers per second; CPU per request 1.03 is 3 % more work per answer",
    ),
    "instructions.": (
        "instructions the whole uvicorn process executes per request, counted by valgrind"
        " (callgrind), start-up and shutdown cancelled out; no other load changes it",
        "ours / bare: 1.025 is 2.5 % more instructions per request, which a CPU-bound server"
        " pays as about 2.4 % fewer requests/s",
    ),
    "drain_latency": (
        "from the last admitted request's release to the drain reporting drained, in-process",
        "ours / a 100 ms polling loop on the in-flight count (uvicorn's own shutdown wait):"
        " 0.01 is a hundred times sooner",
    ),
    "canonical": (
        "canonical JSON and SHA-256 digest of a 1 MiB state, in-process",
        "ours / orjson with sorted keys plus SHA-256 (not the canonical form): 2.7 is 2.7"
        " times that floor's time",
    ),
    "handoff": (
        "begin → acknowledged of a state handoff between two real uvicorn generations: export"
        " (dump, canonical JSON, digest; the URL says importCheck=importer, as serve's and the"
        " CLI's do, so the importer's validation is the value's one check), loopback fetch,"
        " checks and import",
        "ours / an httpx GET of the same value bytes, orjson.loads and model_validate: what the"
        " handoff's checks add over a bare typed transfer",
    ),
    "handover": (
        "requests lost and refused while a server replaces its workers twice (SIGHUP) and then"
        " stops (SIGTERM), under the user-load matrix's HTTP clients (40 keep-alive, 10 slow, 10"
        " on fresh connections; tests/reliability/_user_load.py)",
        "a count, not a ratio: 0 is the target",
    ),
    "recycling": (
        "requests/s of a server that recycles its workers every 1,000 requests, 2 workers,"
        " against the same server recycling nothing, side by side; failed requests counted",
        "recycling / no recycling requests/s: 0.9 is 10 % fewer answers for the recycling",
    ),
    "scaling": (
        "requests/s of serve --workers 2 against --workers 1 on ~1 ms CPU requests",
        "workers-2 / workers-1 requests/s: 2.0 would be perfect on two free cores",
    ),
    "jobs_peer": (
        "durable jobs burned down by our worker and by procrastinate on the same PostgreSQL",
        "ours / the peer's throughput: above 1 is faster than the peer",
    ),
    "jobs.": (
        "durable job operations against a store, with durability settings of the baseline",
        "ours / a plain SQL loop doing the same rows: 0.7 is 70 % of the plain SQL's rate",
    ),
    "memory.": (
        "resident memory of a uvicorn process serving the app, idle and after 10,000 requests",
        "ours / bare RSS; the target is on the difference in MiB, not on the ratio",
    ),
    "queue": (
        "tasks run through the keyed queue, 1 key (serial) and 1,000 keys (parallel)",
        "ours / a semaphore-bounded asyncio.gather of the same coroutines: 0.5 is half its rate",
    ),
}

#: (benchmark prefix, metric prefix) → why the target is missed.
MISSED_BECAUSE: Final[dict[tuple[str, str], str]] = {
    ("middleware", "InFlightMiddleware added"): (
        "a bare counting middleware (one frame around the app's call, the least any in-flight"
        " counter does) adds about 300 ns by itself here (its row); beyond it the runtime gives"
        " every admitted request the drain notice in its scope (a dict of its own: the notice is"
        " public API) and tells uvicorn's request apart so that it runs unwrapped. Less would"
        " take the frame away, and with it what runs when the app returns during a drain (a cut"
        " response aborted, a disconnect the notice told undone, the drain's own error kept out"
        " of the log)"
    ),
    ("instructions.raw ASGI hello", "instructions per request"): (
        "a bare counting middleware adds 1.8 % (instructions.raw ASGI hello +counting: one"
        " frame around the app's call, the least any in-flight counter does); the rest is the"
        " drain notice in every admitted request's scope (a dict of its own: the notice is"
        " public API) and telling uvicorn's request apart so that it runs unwrapped. 2.5 % needs the request path without a frame of the middleware's, which"
        " what runs when the app returns during a drain needs (a cut response aborted, a"
        " disconnect the notice told undone, the drain's own error kept out of the log)"
    ),
    ("server.", "p99 latency"): (
        "one pause of the shared machine moves a run's p99 several times over (the row's max"
        " against its median), more than the 5 % looked for; the server CPU per request and"
        " instructions rows measure the overhead without it"
    ),
    ("middleware", "FastAPI + runtime"): (
        "FastAPI's own call varies by ±30 % between blocks of the same run (its allocations and"
        " the collector's passes), more than the 1 % looked for; instructions.FastAPI hello"
        " counts the same overhead without that noise"
    ),
    ("server.", "requests/s"): (
        "wrk and the server share two cores with other work: per-round ratios run from 0.7 to"
        " 1.2, so a median within 3 % of bare cannot be told from noise; the server CPU per"
        " request and instructions rows measure the same overhead without it"
    ),
    ("handoff 1 MiB", "begin"): (
        "with the collector left alone it scans the typed value the import builds again and"
        " again while it grows; Runtime(handoff_pauses_collector=True) is what buys the rest"
    ),
    ("recycling.", "requests/s"): (
        "one recycle runs at a time, and at this rate they run back to back (a worker passes"
        " 1,000 requests in about a tenth of a second, 7 or 8 recycles a second): each costs"
        " about 37 ms of CPU with --preload (a forked worker's whole life 29.5 ms, the"
        " supervisor 4.5 ms, the preload process's fork 3 ms; measured one recycle at a time),"
        " against some 0.12 s of CPU for the 1,000 hello requests it serves, so the ratio sits"
        " within a few per cent of 0.9 and a noisy round falls below it; an app whose requests"
        " do more work pays proportionally less. Without --preload each recycle starts a Python"
        " worker, 0.5 to 0.8 s of CPU"
    ),
    ("jobs.sqlite enqueue", "throughput"): (
        "each operation hops to the store's statement thread and back (SQLite I/O stays off"
        " the event loop); that hop alone is 0.80 of the baseline (the row's note)"
    ),
    ("memory.Starlette example", "RSS over bare"): (
        "the figure is the example's own imports and work: pydantic (and httpx with a handoff"
        " token), a SQLite job store and worker, a queue and a scheduler, none of which the bare"
        " app loads; the runtime alone (memory.runtime alone) is the library's share, 3 MiB"
    ),
    ("memory.FastAPI example", "RSS over bare"): (
        "the figure is the example's own work beyond the runtime: a SQLite job store and worker,"
        " a queue and a scheduler (and httpx with a handoff token), which the bare app does not"
        " load; the runtime alone (memory.runtime alone) is the library's share, 3 MiB"
    ),
}


def meaning(benchmark: str) -> tuple[str, str] | None:
    """What a row of ``benchmark`` measures and what its ratio means, if listed."""
    return next((text for key, text in MEANINGS.items() if benchmark.startswith(key)), None)


def missed_because(result: dict[str, Any]) -> str | None:
    """Why a missed row's target is not met, if the reason is known."""
    benchmark, metric = str(result["benchmark"]), str(result["metric"])
    return next(
        (
            reason
            for (prefix, name), reason in MISSED_BECAUSE.items()
            if benchmark.startswith(prefix) and metric.startswith(name)
        ),
        None,
    )
