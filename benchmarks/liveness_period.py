"""What the liveness table costs a node per probe period, by federation size.

Each period the probe loop asks the table whether the brake is on, when the next grace
runs out, which suspicions expired, which evictions are due and who is suspected. This
times those calls on a table of N healthy members (the common case).

Run:  .venv/bin/python benchmarks/liveness_period.py [--table-from OLD_TABLE_PY]
      (``git show REV:otela/liveness/table.py > /tmp/t.py`` gives an older table)
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import timeit
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def load(path: str | None) -> ModuleType:
    if path is None:
        from otela.liveness import table
        return table
    spec = importlib.util.spec_from_file_location("table_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--table-from", default=None)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    args = parser.parse_args()
    module = load(args.table_from)
    for n in args.sizes:
        table = module.LivenessTable("me", 6.0)
        table.sync_members({f"p{i}" for i in range(n)}, 0.0)

        def period(t=table) -> None:  # type: ignore[no-untyped-def]
            t.braking()
            t.next_deadline(1.0)
            t.expired_suspicions(1.0)
            t.due_evictions(1.0)
            t.suspected()

        runs = 20
        seconds = timeit.timeit(period, number=runs) / runs
        print(f"{n:>7} members: {seconds * 1e3:.3f} ms per probe period")


if __name__ == "__main__":
    main()
