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


SSH_SCRIPT = SCRIPT.parent / "ssh-login-node"


class LoginNode:
    """A real sshd on a loopback port (scripts/ssh-login-node): a second cluster's login
    node, in front of the same Slurm. ``stop()`` and ``start()`` make it unreachable and
    reachable again."""

    def __init__(self, directory: Path, port: int) -> None:
        self.directory, self.port = directory, port
        self.options: list[str] = []

    def start(self) -> None:
        result = subprocess.run([str(SSH_SCRIPT), "start", str(self.directory), str(self.port)],
                                capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            pytest.fail(f"could not start sshd ({SSH_SCRIPT} start):\n{result.stderr[-3000:]}")
        self.options = result.stdout.split()

    def stop(self) -> None:
        subprocess.run([str(SSH_SCRIPT), "stop", str(self.directory)], timeout=60, check=True)

    @property
    def target(self) -> str:
        import getpass

        return f"{getpass.getuser()}@127.0.0.1"


@pytest.fixture()
def login_node(tmp_path: Path) -> Iterator[LoginNode]:
    from otela.testing.localfed import free_port

    node = LoginNode(tmp_path / "sshd", free_port())
    node.start()
    try:
        yield node
    finally:
        node.stop()
