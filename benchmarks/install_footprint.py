"""What a serving node costs to install and to run: ``pip install otela`` against
``pip install 'otela[all]'`` (what every node installed before the extras existed).

Prints, for the lean install and the full one: the installed size of the dependency
closure, the time to import what ``otela start`` imports (median of several fresh
interpreters), and the resident memory of an idle node (an ingress, no engine) once it
listens. The lean venv is ``otela.testing.lean_install``'s (the project's .venv, filtered
to the core closure).

    .venv/bin/python benchmarks/install_footprint.py [--runs 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from otela.testing import lean_install
from otela.testing.localfed import LocalFederation

# What `otela start` imports before it runs anything: the CLI module and the daemon. The
# full install's "before" also loaded the optional commands (sim, plan, trace) at import,
# as otela.cli did until the lazy command group.
START_IMPORTS = "import otela.cli, otela.daemon"
EAGER_IMPORTS = START_IMPORTS + ", simulator.cli, simulator.placer.cli, traces.cli"


def closure_size(requirements: list[str]) -> tuple[int, int]:
    """(distributions, bytes) of the installed closure of ``requirements``."""
    dists = lean_install.closure(requirements)
    total = 0
    for dist in dists:
        for file in dist.files or []:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                total += path.stat().st_size
    return len(dists), total


def all_requirements() -> list[str]:
    project = tomllib.loads((lean_install.ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = [r for name in ("pg", "sim", "plan", "traces", "demo") for r in extras[name]
              if not r.startswith("otela")]
    return [*project["dependencies"], *wanted]


def import_time(python: str, statement: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([python, "-c", statement], check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def idle_rss(python: str, root: Path, eager: bool = False) -> int:
    """VmRSS (KiB) of an idle ingress node five seconds after it listens; ``eager``: with
    the optional commands imported first, as every node did before."""
    fed = LocalFederation(root, python=python)
    launcher = [python, "-c", f"{EAGER_IMPORTS}; from otela.cli import main; main()"]
    try:
        node = fed.start_node("idle", ingress=True, launcher=launcher if eager else None)
        time.sleep(5.0)
        status = Path(f"/proc/{node.process.pid}/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines()
                        if line.startswith("VmRSS:")))
    finally:
        fed.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="fresh interpreters per figure")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="otela-footprint-") as tmp:
        lean = str(lean_install.build(Path(tmp) / "venv"))
        full = sys.executable
        core_n, core_bytes = closure_size(lean_install.core_requirements())
        all_n, all_bytes = closure_size(all_requirements())
        print(f"{'install':<34}{'distributions':>14}{'size MiB':>10}")
        print(f"{'pip install otela':<34}{core_n:>14}{core_bytes / 2**20:>10.0f}")
        print(f"{'pip install otela[all]':<34}{all_n:>14}{all_bytes / 2**20:>10.0f}")
        print()
        print(f"{'otela start imports (median s)':<44}{'time':>8}")
        rows = [("lean install", lean, START_IMPORTS),
                ("full install", full, START_IMPORTS),
                ("full install, optional commands eager", full, EAGER_IMPORTS)]
        for label, python, statement in rows:
            print(f"{label:<44}{import_time(python, statement, args.runs):>8.2f}")
        print()
        print(f"{'idle ingress node RSS':<44}{'MiB':>8}")
        for i, (label, python, eager) in enumerate(rows_rss(lean, full)):
            rss = idle_rss(python, Path(tmp) / f"fed-{i}", eager)
            print(f"{label:<44}{rss / 1024:>8.0f}")


def rows_rss(lean: str, full: str) -> list[tuple[str, str, bool]]:
    return [("lean install", lean, False), ("full install", full, False),
            ("full install, optional commands eager", full, True)]


if __name__ == "__main__":
    main()
