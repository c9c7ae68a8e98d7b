"""Shared by the mesh benchmarks: start a federation of real otela processes on this
machine, and measure what they send (kernel TCP counters) and when they learn things."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path

from otela.testing.localfed import LocalFederation, LocalNode, wait_for

QUIET = ["--log-level", "WARNING"]
CHURN_NODE = str(Path(__file__).with_name("churn_node.py"))

_SOCKET = re.compile(r"pid=(\d+),.*?bytes_sent:(\d+)(?:.*?bytes_received:(\d+))?", re.S)
Socket = tuple[int, str, str]  # (pid, local address, peer address)


def socket_bytes() -> dict[Socket, int]:
    """Per TCP socket: payload bytes sent + received so far (kernel counters)."""
    out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, check=True).stdout
    totals: dict[Socket, int] = {}
    for block in re.split(r"\n(?=\S)", out):
        match = _SOCKET.search(block)
        fields = block.split()
        if match and len(fields) >= 5:
            pid, sent = int(match.group(1)), int(match.group(2))
            totals[(pid, fields[3], fields[4])] = sent + int(match.group(3) or 0)
    return totals


def bytes_per_pid(before: dict[Socket, int], after: dict[Socket, int]) -> dict[int, int]:
    """Bytes each process moved between two samples: per-socket differences, with sockets
    opened in between counted from zero (sockets closed in between are missed: a lower
    bound, tight when connections are stable, as in an idle federation)."""
    moved: dict[int, int] = {}
    for key, total in after.items():
        moved[key[0]] = moved.get(key[0], 0) + total - before.get(key, 0)
    return moved


def bytes_per_second(pids: Collection[int], window: float) -> list[float]:
    """Each process's control-plane bytes per second over the next ``window`` seconds, in
    the order of ``pids``."""
    before = socket_bytes()
    time.sleep(window)
    moved = bytes_per_pid(before, socket_bytes())
    return [moved.get(pid, 0) / window for pid in pids]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def live_peers(node: LocalNode) -> set[str]:
    """Peer ids with a session that is not LEFT, as ``node``'s replica says."""
    return {e["peer_id"] for e in node.nodes(timeout=30)
            if e["state"] != "LEFT"}


def machine_busy(sample: float = 1.0) -> float:
    """Fraction of all cores' time spent busy over the next ``sample`` seconds."""

    def counters() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields) - idle, sum(fields)

    busy0, total0 = counters()
    time.sleep(sample)
    busy1, total1 = counters()
    return (busy1 - busy0) / max(1, total1 - total0)


def wait_for_headroom(max_busy: float = 0.5, timeout: float = 120.0) -> None:
    """Block until the machine is less than ``max_busy`` busy (or ``timeout`` passed)."""
    deadline = time.monotonic() + timeout
    while machine_busy() >= max_busy and time.monotonic() < deadline:
        pass


def start_federation(
    fed: LocalFederation, n: int, *, churners: int = 0, churn_every: float = 3.0,
    wave: int = 4, switchable: bool = False, ingress_boot: bool = False,
) -> list[LocalNode]:
    """``n`` nodes joined through the first one; returns once every replica lists every
    node as live. Processes start ``wave`` at a time: starting a Python daemon costs ~2 s
    of CPU, and 128 of them at once on 2 cores would measure a start-up storm, not the
    mesh; and each wave starts only once the bootstrap node lists the previous one and
    the machine has headroom again (its start-up and join gossip done), so that the
    benchmark measures a federation, not a start-up storm on a saturated machine.
    ``churners`` of them can re-register every ``churn_every`` seconds, from when
    ``set_churn(nodes, True)`` is called; with ``switchable`` every node runs the churn
    launcher (so ``set_load`` works on all of them), re-registering only where asked.
    With ``ingress_boot`` the first node is an ingress (the one that hears load reports)."""
    boot = fed.start_node("boot", ingress=ingress_boot, extra_args=QUIET)
    nodes = [boot]
    for first in range(0, n - 1, wave):
        batch = []
        for i in range(first, min(first + wave, n - 1)):
            wrapped = switchable or i < churners
            launcher = [sys.executable, CHURN_NODE, str(churn_every)] if wrapped else None
            batch.append(fed.start_node(f"m{i:03d}", bootstrap=[boot], wait=False,
                                        extra_args=QUIET, launcher=launcher))
        for node in batch:
            fed.wait_started(node, node.home / "status.json", 900.0)
        nodes += batch
        started_ids = {x.status["peer_id"] for x in nodes}
        wait_for(lambda ids=started_ids: live_peers(boot) >= ids, 900.0,
                 "the bootstrap node to list the wave", interval=0.5)
        wait_for_headroom()
    everyone = {x.status["peer_id"] for x in nodes}
    for node in nodes:
        wait_for(lambda node=node: live_peers(node) >= everyone, 900.0,
                 f"{node.name} to converge", interval=0.5)
    return nodes


def set_churn(nodes: list[LocalNode], on: bool) -> None:
    """Switch re-registration of the churn nodes on or off (see churn_node.py)."""
    _switch(nodes, "churn", on)


def set_load(nodes: list[LocalNode], on: bool) -> None:
    """Switch changing load reports on or off (see churn_node.py)."""
    _switch(nodes, "load", on)


def _switch(nodes: list[LocalNode], name: str, on: bool) -> None:
    for node in nodes:
        switch = node.home / name
        if on:
            switch.touch()
        else:
            switch.unlink(missing_ok=True)
