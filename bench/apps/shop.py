"""The typed shop state of the handoff benchmark (``bench.canonical.build_state`` as pydantic
models), shared by the app of both generations and by the benchmark's own baseline."""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel

from bench.canonical import build_state

#: Room left for the envelope's own fields (protocol, revisions, cursor, digest).
ENVELOPE_ROOM = 512


class Item(BaseModel):
    sku: str
    title: str
    quantity: int
    price: float
    discount: float
    tags: list[str]


class Customer(BaseModel):
    name: str
    city: str
    vip: bool


class Cart(BaseModel):
    id: str
    userId: int
    customer: Customer
    items: list[Item]
    total: float
    open: bool
    coupon: str | None
    updatedAt: int


class Config(BaseModel):
    currency: str
    taxRate: float
    maxItems: int
    beta: bool


class ShopState(BaseModel):
    """The handoff value: typed, versioned, nothing secret."""

    service: str
    generation: int
    exportedAt: str
    config: Config
    counters: dict[str, int]
    carts: list[Cart]


def sized_state(size: int) -> ShopState:
    """The largest state of ``build_state`` whose JSON fits ``size`` bytes (the header at least)."""
    budget = size - ENVELOPE_ROOM if size > 8 * ENVELOPE_ROOM else size
    data: dict[str, Any] = build_state(budget)
    carts: list[Any] = data["carts"]
    while carts and len(orjson.dumps(data)) > budget:
        carts.pop()
    return ShopState.model_validate(data)
