"""A real single-node Slurm cluster for these tests, set up by scripts/slurm-cluster.

Never skipped: where Slurm cannot be installed or started (not root, no apt), the tests
fail with the script's reason.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm-cluster"


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[None]:
    result = subprocess.run([str(SCRIPT), "start"], capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        pytest.fail(f"could not set up the Slurm test cluster ({SCRIPT} start):\n"
                    f"{result.stderr[-3000:]}")
    yield
    subprocess.run([str(SCRIPT), "stop"], capture_output=True, text=True, timeout=120)
