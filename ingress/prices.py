"""Model prices and what a request spent.

A price is per million prompt (input) tokens and per million completion (output) tokens,
in the operator's currency (otela does not convert). It is set for a model on one
provider, or for a model on any provider (``provider`` ''), and a provider's own price
wins: a university's GPUs and a cloud's can charge differently for the same model.

A request's spend is fixed when its usage row is made, at the prices the ingress holds
then (``Access`` re-reads the table every refresh, about once a second), and stored in the
row: a later price change does not rewrite history. A model with no price spends nothing
and its rows say so (``spend`` NULL, counted as ``unpriced`` in reports), so an operator
sees that a price is missing instead of a zero that looks like a free model.

``PriceList`` is pure; the functions below it read and write the ``prices`` table.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ingress.database import Database

ANY_PROVIDER = ""
MAX_PRICE = 1e9  # per million tokens: far above any real price, far below float trouble
MAX_NAME = 256


@dataclass(frozen=True)
class Price:
    model: str
    provider: str  # '' (ANY_PROVIDER): every provider without a price of its own
    input_per_mtok: float
    output_per_mtok: float
    updated_at: float = 0.0

    def spend(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.input_per_mtok
                + completion_tokens * self.output_per_mtok) / 1e6

    def to_dict(self) -> dict[str, object]:
        return {"object": "price", "model": self.model,
                "provider": self.provider or None,
                "input_per_mtok": self.input_per_mtok,
                "output_per_mtok": self.output_per_mtok, "updated_at": self.updated_at}


class PriceList:
    """The prices an ingress holds, looked up per usage row (a dict lookup or two)."""

    def __init__(self, prices: list[Price] | None = None) -> None:
        self._by_key = {(p.model, p.provider): p for p in prices or []}
        # A model's highest prices on any provider: what a request under a money budget
        # reserves, before it is known who will serve it.
        self._highest: dict[str, Price] = {}
        for price in prices or []:
            top = self._highest.get(price.model)
            self._highest[price.model] = Price(
                price.model, ANY_PROVIDER,
                max(price.input_per_mtok, top.input_per_mtok if top else 0.0),
                max(price.output_per_mtok, top.output_per_mtok if top else 0.0))

    def __len__(self) -> int:
        return len(self._by_key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PriceList) and other._by_key == self._by_key

    __hash__ = None  # type: ignore[assignment]

    def price_of(self, model: str, provider: str) -> Price | None:
        """The provider's own price for ``model``, else the model's price for any."""
        by_key = self._by_key
        if not by_key:
            return None
        return by_key.get((model, provider)) or by_key.get((model, ANY_PROVIDER))

    def highest(self, model: str) -> Price | None:
        """``model``'s highest input and output prices over its providers; None: none."""
        return self._highest.get(model)

    def spend(self, model: str, provider: str, prompt_tokens: int,
              completion_tokens: int) -> float | None:
        """What a request spent; None when ``model`` has no price (for ``provider``)."""
        price = self.price_of(model, provider)
        if price is None:
            return None
        return round(price.spend(prompt_tokens, completion_tokens), 9)


def checked(model: object, provider: object, input_per_mtok: object,
            output_per_mtok: object) -> Price:
    """A price from operator input; ``ValueError`` saying what is wrong."""
    if not isinstance(model, str) or not model.strip() or len(model) > MAX_NAME:
        raise ValueError(f"'model' must be a model id of 1 to {MAX_NAME} characters")
    if provider is None:
        provider = ANY_PROVIDER
    if not isinstance(provider, str) or len(provider) > MAX_NAME:
        raise ValueError(f"'provider' must be a provider id of at most {MAX_NAME} "
                         "characters, or null for every provider")
    rates = []
    for name, value in (("input_per_mtok", input_per_mtok),
                        ("output_per_mtok", output_per_mtok)):
        if isinstance(value, bool) or not isinstance(value, int | float) or \
                not math.isfinite(value) or not 0 <= value <= MAX_PRICE:
            raise ValueError(f"'{name}' must be a number from 0 to {MAX_PRICE:g} (the price "
                             "per million tokens)")
        rates.append(float(value))
    return Price(model.strip(), provider.strip(), rates[0], rates[1])


# -- the prices table --------------------------------------------------------------------

def all_prices(db: Database) -> list[Price]:
    rows = db.query_sync("SELECT model, provider, input_per_mtok, output_per_mtok, "
                         "updated_at FROM prices ORDER BY model, provider")
    return [Price(str(r[0]), str(r[1]), float(r[2]), float(r[3]), float(r[4]))
            for r in rows]


def price_list(db: Database) -> PriceList:
    return PriceList(all_prices(db))


def set_price(db: Database, price: Price) -> Price:
    """Create or replace the price of ``price.model`` for ``price.provider``."""
    stamped = Price(price.model, price.provider, price.input_per_mtok,
                    price.output_per_mtok, time.time())
    db.run_sync(
        "INSERT INTO prices (model, provider, input_per_mtok, output_per_mtok, updated_at) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (model, provider) DO UPDATE SET "
        "input_per_mtok = excluded.input_per_mtok, "
        "output_per_mtok = excluded.output_per_mtok, updated_at = excluded.updated_at",
        (stamped.model, stamped.provider, stamped.input_per_mtok, stamped.output_per_mtok,
         stamped.updated_at))
    return stamped


def remove_price(db: Database, model: str, provider: str | None) -> bool:
    """Remove a price; whether there was one."""
    return db.run_sync("DELETE FROM prices WHERE model = ? AND provider = ?",
                       (model, provider or ANY_PROVIDER)) > 0
