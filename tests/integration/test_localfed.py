"""The local federation helper (otela.testing.localfed) that benchmarks, the demo and tests use."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = """
import sys, time
from pathlib import Path
from otela.testing.localfed import LocalFederation
with LocalFederation(Path(sys.argv[1])) as fed:
    node = fed.start_node("a")
    print(node.process.pid, flush=True)
    time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_script_ended_by_sigterm_stops_its_nodes(tmp_path: Path) -> None:
    """``timeout``, a scheduler or ``kill`` ends a benchmark with SIGTERM: its nodes must
    not outlive it (they used to, and skewed every later measurement on the machine)."""
    script = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    assert script.stdout is not None
    node_pid = int(script.stdout.readline())
    try:
        assert alive(node_pid)
        script.send_signal(signal.SIGTERM)
        assert script.wait(timeout=60) == 128 + signal.SIGTERM  # it unwound, then exited
        deadline = time.monotonic() + 10
        while alive(node_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(node_pid), "the node outlived the script that started it"
    finally:
        if alive(node_pid):
            os.kill(node_pid, signal.SIGKILL)
