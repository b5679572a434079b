"""Canonical JSON + SHA-256 of a realistic 1 MiB state, side by side with orjson.

Run ``python -m bench.canonical [--quick]``. The state is a shop's open carts: records with
nested objects and lists, ASCII and non-ASCII strings, ints, prices and discounts as floats
(some integral, such as 0.0), booleans and nulls. The baseline is what any digest of it costs at
least: ``orjson.dumps(value, option=OPT_SORT_KEYS)`` then ``hashlib.sha256``. The two sides run
interleaved in one process, so machine noise hits both alike; the ratio is the median of the
per-round ratios (ours / baseline in the same round), printed with their spread, and the target
is that median within 3x.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import statistics
import sys
import time
from collections.abc import Callable

import orjson

from bench._report import paired
from forgezero_lifecycle._canonical import canonical_json, state_digest

STATE_BYTES = 1 << 20
TARGET_RATIO = 3.0
ROUNDS = 31
QUICK_ROUNDS = 5
OURS = "state_digest"
BASELINE = "orjson_sorted_sha256"
_FIRST = ("Ada", "Jürgen", "Zoë", "Ming", "Olúwásẹ́gun", "Ana", "Søren", "Priya", "José", "Eli")
_LAST = ("Lovelace", "Müller", "Åberg", "Chen", "Adébáyọ̀", "García", "Kowalski", "Nakamura")
_WORDS = ("gift", "express", "fragile", "bulk", "promo", "eco", "café", "größe", "東京", "return")
_CITIES = ("Berlin", "Kraków", "São Paulo", "Zürich", "Lyon", "Osaka", "Reykjavík", "Austin")


def build_state(size: int = STATE_BYTES, seed: int = 20240229) -> dict[str, object]:
    """A deterministic state of about ``size`` canonical bytes: carts of a shop service."""
    rng = random.Random(seed)
    carts: list[object] = []
    state: dict[str, object] = {
        "service": "demo.carts",
        "generation": 7,
        "exportedAt": "2024-02-29T12:00:00.000Z",
        "config": {"currency": "EUR", "taxRate": 0.19, "maxItems": 50, "beta": False},
        "counters": {f"shard-{n:02d}": rng.randrange(10**9) for n in range(32)},
        "carts": carts,
    }
    used = len(orjson.dumps(state))
    while used < size:
        cart = _cart(rng, len(carts))
        used += len(orjson.dumps(cart)) + 1
        carts.append(cart)
    return state


def _cart(rng: random.Random, index: int) -> dict[str, object]:
    lines = [
        (round(rng.uniform(0.5, 250), 2), rng.randrange(1, 6)) for _ in range(rng.randrange(1, 5))
    ]
    items = [
        {
            "sku": f"SKU-{rng.randrange(10**6):06d}",
            "title": " ".join(rng.choices(_WORDS, k=rng.randrange(1, 4))),
            "quantity": quantity,
            "price": price,
            "discount": rng.choice((0.0, 0.05, 0.1, 0.25)),
            "tags": rng.sample(_WORDS, rng.randrange(0, 3)),
        }
        for price, quantity in lines
    ]
    return {
        "id": f"cart-{index:06d}",
        "userId": rng.randrange(10**7),
        "customer": {
            "name": f"{rng.choice(_FIRST)} {rng.choice(_LAST)}",
            "city": rng.choice(_CITIES),
            "vip": rng.random() < 0.1,
        },
        "items": items,
        "total": sum(price * quantity for price, quantity in lines),
        "open": rng.random() < 0.7,
        "coupon": None if rng.random() < 0.8 else f"SAVE{rng.randrange(5, 30)}",
        "updatedAt": 1709208000 + rng.randrange(86400 * 30),
    }


def _orjson_digest(value: object) -> str:
    return "sha256:" + hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _measure(
    sides: dict[str, Callable[[object], object]], value: object, rounds: int
) -> dict[str, list[float]]:
    """Milliseconds per call, the sides interleaved round by round after one warm-up call each."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    for function in sides.values():
        function(value)
    for _ in range(rounds):
        for name, function in sides.items():
            started = time.perf_counter()
            function(value)
            times[name].append((time.perf_counter() - started) * 1000)
    return times


def run(quick: bool) -> list[dict[str, object]]:
    """Rows for state_digest and its baseline: ms per call, and MB/s of canonical JSON."""
    state = build_state()
    megabytes = len(canonical_json(state)) / 1e6
    rounds = QUICK_ROUNDS if quick else ROUNDS
    times = _measure({OURS: state_digest, BASELINE: _orjson_digest}, state, rounds)
    baseline = statistics.median(times[BASELINE])
    ratios = paired(times[OURS], times[BASELINE])
    rows: list[dict[str, object]] = []
    for name, samples in times.items():
        rates = [megabytes * 1000 / sample for sample in samples]
        for metric, unit, values, reference in (
            ("time per 1 MiB state", "ms", samples, baseline),
            ("throughput", "MB/s", rates, megabytes * 1000 / baseline),
        ):
            rows.append(
                {
                    "benchmark": f"canonical.{name}",
                    "metric": metric,
                    "unit": unit,
                    "min": round(min(values), 2),
                    "median": round(statistics.median(values), 2),
                    "max": round(max(values), 2),
                    "baseline_median": round(reference, 2),
                    "ratio": round(statistics.median(paired(samples, times[BASELINE])), 2),
                    "target": f"<= {TARGET_RATIO:g}x {BASELINE}" if name == OURS else "baseline",
                    "command": "python -m bench.canonical" + (" --quick" if quick else ""),
                }
            )
            if name == OURS:
                rows[-1]["note"] = (
                    f"{rounds} interleaved rounds; ratio = median of per-round ratios, which ran"
                    f" {min(ratios):.2f}x to {max(ratios):.2f}x"
                )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="state_digest against orjson + sha256, 1 MiB")
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK_ROUNDS} rounds instead of {ROUNDS}"
    )
    rows = run(parser.parse_args(argv).quick)
    print(f"{'benchmark':34} {'metric':22} {'min':>8} {'median':>8} {'max':>8}  unit")
    for row in rows:
        print(
            f"{row['benchmark']:34} {row['metric']:22} {row['min']:8.2f} {row['median']:8.2f}"
            f" {row['max']:8.2f}  {row['unit']}"
        )
    ratio = rows[0]["ratio"]
    verdict = "within" if isinstance(ratio, float) and ratio <= TARGET_RATIO else "NOT within"
    print(f"{ratio}x, {verdict} the {TARGET_RATIO:g}x target: {rows[0]['note']}")
    print(f"({rows[0]['command']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
