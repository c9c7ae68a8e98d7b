"""Network namespaces for tests: a private LAN of "hosts" on one machine, and partitions.

Everything is created by the test and removed afterwards (also on failure): the
namespaces, their veth pairs, the bridge, and any iptables rules (which live inside the
namespaces and vanish with them). Addresses come from 10.213.0.0/24, used only here.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable

SUBNET = "10.213.0"
BRIDGE = "otpbr0"


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)


def ensure_iptables() -> None:
    """The partition tests need iptables; install it from Debian if a fresh machine lacks it."""
    if shutil.which("iptables"):
        return
    subprocess.run(["apt-get", "update", "-q"], check=True, capture_output=True, timeout=300)
    subprocess.run(["apt-get", "install", "-y", "-q", "iptables"], check=True,
                   capture_output=True, timeout=300)


class Lan:
    """``n`` namespaces ``otp-h<i>`` at ``10.213.0.<10+i>`` on a bridge, reachable from here."""

    def __init__(self, n: int) -> None:
        self.hosts = [(f"otp-h{i}", f"{SUBNET}.{10 + i}") for i in range(n)]
        self._created: list[str] = []

    def __enter__(self) -> Lan:
        try:
            self.cleanup_stale()
            sh("ip", "link", "add", BRIDGE, "type", "bridge")
            self._created.append("bridge")
            sh("ip", "addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE)
            sh("ip", "link", "set", BRIDGE, "up")
            for i, (ns, ip) in enumerate(self.hosts):
                sh("ip", "netns", "add", ns)
                self._created.append(ns)
                sh("ip", "link", "add", f"otpv{i}", "type", "veth", "peer", "name", "eth0",
                   "netns", ns)
                sh("ip", "link", "set", f"otpv{i}", "master", BRIDGE, "up")
                sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
                sh("ip", "-n", ns, "link", "set", "eth0", "up")
                sh("ip", "-n", ns, "link", "set", "lo", "up")
        except Exception:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        """Remove what we created. Stop the processes inside first: a namespace (and its
        veth) outlives ``ip netns del`` while a process still runs in it."""
        for name in reversed(self._created):
            if name == "bridge":
                cmd = ["ip", "link", "del", BRIDGE]
            else:
                cmd = ["ip", "netns", "del", name]
            subprocess.run(cmd, capture_output=True, timeout=30)
        self._created.clear()

    def cleanup_stale(self) -> None:
        """Remove leftovers of an earlier run that was killed before its own cleanup."""
        for i, (ns, _) in enumerate(self.hosts):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
            subprocess.run(["ip", "link", "del", f"otpv{i}"], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, timeout=30)

    def partition(self, side_a: Iterable[int], side_b: Iterable[int]) -> None:
        """Drop every packet between the two sides (both directions), as a cut link would."""
        a, b = list(side_a), list(side_b)
        for mine, theirs in ((a, b), (b, a)):
            for i in mine:
                ns = self.hosts[i][0]
                for j in theirs:
                    other = self.hosts[j][1]
                    sh("ip", "netns", "exec", ns, "iptables", "-A", "INPUT", "-s", other,
                       "-j", "DROP")
                    sh("ip", "netns", "exec", ns, "iptables", "-A", "OUTPUT", "-d", other,
                       "-j", "DROP")

    def heal(self) -> None:
        for ns, _ in self.hosts:
            sh("ip", "netns", "exec", ns, "iptables", "-F")
