"""What the ingress service's key gate costs a request: ``Access.admit`` then
``Access.finished`` for a key without a budget, one with a budget of its own, and one
whose team has a budget too (tokens per day and money per month, at a price), in process
on a real SQLite file. The proxy benchmark measures the whole path (~650 us of CPU per
keyed request on the 2-core VM); this isolates the gate, where budgets and teams work.

Run:  .venv/bin/python benchmarks/key_gate.py [--src CHECKOUT] [--loops N] [--repeat R]
      (``--src``: another checkout's ingress package, e.g. a worktree of an older commit;
      its ``finished`` may take only the tokens, as before budgets per provider)
"""

from __future__ import annotations

import argparse
import inspect
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--src", default=str(Path(__file__).resolve().parent.parent),
                        help="the checkout whose ingress package to time")
    parser.add_argument("--loops", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5, help="best of this many runs")
    args = parser.parse_args()
    sys.path.insert(0, args.src)
    from ingress import keystore
    from ingress.access import Access
    from ingress.database import Database, DatabaseUrl
    from ingress.keystore import KeySpec
    from ingress.migrations import migrate

    db = Database.connect(DatabaseUrl.parse(str(Path(tempfile.mkdtemp()) / "gate.db")))
    migrate(db)
    keys: dict[str, Any] = {"keyed": KeySpec(owner="plain", rpm=10**9)}
    if "budget_period" in KeySpec.__dataclass_fields__:
        from ingress import prices
        from ingress.prices import Price

        prices.set_price(db, Price("m", "", 0.1, 0.2))
        keystore.set_team(db, "bench", {"budget_tokens": 10**15, "budget_period": "day",
                                        "budget_spend": 1e9})
        keys["budgeted"] = KeySpec(owner="b", budget_tokens=10**15)
        keys["team budget"] = KeySpec(owner="t", team="bench", budget_spend=1e9,
                                      budget_period="month")
    else:
        keys["budgeted"] = KeySpec(owner="b", budget_tokens=10**15)
    made = {name: keystore.create(db, spec)[0] for name, spec in keys.items()}
    access = Access(db, "bench")
    access.load()
    detailed = "provider" in inspect.signature(access.finished).parameters
    print(f"{args.src}: admit + finished, best of {args.repeat} x {args.loops:,}")
    for name, key in made.items():
        live = access.by_id[key.id]
        best = float("inf")
        for _ in range(args.repeat):
            started = time.perf_counter()
            for _ in range(args.loops):
                grant = access.admit(live, "m", 16, 100)
                if detailed:
                    access.finished(grant, 30, 20, "prov")
                else:
                    access.finished(grant, 30)
            best = min(best, (time.perf_counter() - started) / args.loops)
        print(f"  {name:12s} {best * 1e6:6.2f} us")


if __name__ == "__main__":
    main()
