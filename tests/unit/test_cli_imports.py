"""``otela keys``, ``usage``, ``requests`` and ``prices`` start in about half a second:
they must not import the node (libp2p, ~1.2 s), the async runtime or HTTP stacks they do
not use. Checked by what a real run imported, not by timing it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("libp2p", "trio", "httpx", "fastapi", "hypercorn", "numpy")
PROBE = """
import sys
sys.argv = ["otela", *sys.argv[1:]]
from otela.cli import main
try:
    main()
except SystemExit:
    pass
print("IMPORTED", sorted(m for m in {heavy!r} if m in sys.modules))
"""


@pytest.mark.parametrize("command", [["keys", "list"], ["usage", "--by", "team"],
                                     ["requests", "--limit", "1"], ["prices", "list"]])
def test_the_ingress_commands_import_nothing_heavy(tmp_path: Path, command: list[str]) -> None:
    db = tmp_path / "ingress.db"
    made = subprocess.run([sys.executable, "-m", "otela", "keys", "create", "--owner", "a",
                           "--db", str(db)], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    run = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), *command,
                          "--db", str(db)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "IMPORTED []", run.stdout[-500:]
