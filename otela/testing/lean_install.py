"""A virtual environment holding what ``pip install otela`` installs, and nothing more.

The distributions are the closure of ``pyproject.toml``'s ``dependencies`` (with the extras
each names, e.g. ``hypercorn[trio]``), taken from the project's own ``.venv`` where they are
installed already: their files are linked into a fresh ``--without-pip`` venv, so building
it takes a second and no network, and every package of an extra (numpy, OR-Tools, psycopg,
openai...) is really absent from it.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]  # the project (a source checkout)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def core_requirements() -> list[str]:
    """``pip install otela``'s requirements, from pyproject.toml (the installed metadata
    of an editable install may predate the last change to it)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"])


def closure(requirements: list[str]) -> list[metadata.Distribution]:
    """Every installed distribution ``requirements`` pull in, extras of dependencies
    followed, markers evaluated for this interpreter."""
    todo = [Requirement(r) for r in requirements]
    seen: dict[str, set[str]] = {}
    found: dict[str, metadata.Distribution] = {}
    while todo:
        req = todo.pop()
        if req.marker and not req.marker.evaluate({"extra": ""}):
            continue
        name = _canonical(req.name)
        extras = set(req.extras)
        if name in seen and extras <= seen[name]:
            continue
        seen.setdefault(name, set()).update(extras)
        dist = found.setdefault(name, metadata.distribution(req.name))
        for spec in dist.requires or []:
            sub = Requirement(spec)
            wanted = ["", *sorted(seen[name])]
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in wanted):
                sub.marker = None
                todo.append(sub)
    return list(found.values())


def top_level_entries(dists: list[metadata.Distribution]) -> set[Path]:
    """The site-packages entries (packages, modules, .dist-info, .libs) the distributions
    installed."""
    entries: set[Path] = set()
    for dist in dists:
        base = Path(str(dist.locate_file("")))
        for file in dist.files or []:
            parts = Path(file).parts
            if parts and parts[0] != ".." and not parts[0].endswith(".pth"):
                entries.add(base / parts[0])
    return entries


def build(target: Path) -> Path:
    """A venv at ``target`` with otela's core installation; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
    python = target / "bin" / "python"
    site = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    for entry in top_level_entries(closure(core_requirements())):
        link = site / entry.name
        if entry.exists() and not link.exists():
            link.symlink_to(entry)
    # otela's own packages (one distribution: otela, ingress, simulator, traces), and its
    # metadata: the entry points through which the ingress service and the plugged-in
    # commands are found (otela.services)
    (site / "otela-source.pth").write_text(f"{ROOT}\n")
    own = Path(str(metadata.distribution("otela").locate_file(""))) / (
        f"otela-{metadata.version('otela')}.dist-info")
    if own.is_dir():
        (site / own.name).symlink_to(own)
    return python


def run(python: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(python), *args], capture_output=True, text=True,
                          timeout=timeout, env={**env, "COLUMNS": "100"}, cwd=ROOT)
