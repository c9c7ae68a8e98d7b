"""A NAT test topology in Linux network namespaces, built and torn down by the test.

    <p>-inet : the "internet": bridge 10.99.0.1/24; drops anything sent to 192.168.0.0/16,
               as the real internet does with private destinations
    <p>-R    : a public host, 10.99.0.10
    <p>-natA : NAT router, wan 10.99.0.2, lan 192.168.1.1 (MASQUERADE; unsolicited inbound
               dropped silently, like a typical home/campus firewall)
    <p>-A    : 192.168.1.2, behind natA
    <p>-natB / <p>-B : the same with 10.99.0.3 / 192.168.2.0/24

Only private addresses, only inside namespaces created here. ``down`` kills every process
left in them and deletes them; veths and iptables rules live inside and go with them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from typing import Any

PUBLIC = {"R": "10.99.0.10"}
NAT_WAN = {"A": "10.99.0.2", "B": "10.99.0.3"}
PRIVATE = {"A": "192.168.1.2", "B": "192.168.2.2"}


class NetnsError(RuntimeError):
    pass


def missing_tools() -> list[str]:
    return [t for t in ("ip", "iptables", "curl") if shutil.which(t) is None]


def _run(*cmd: str) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise NetnsError(f"{' '.join(cmd)}: {result.stderr.strip()}")


class Topology:
    def __init__(self, prefix: str | None = None) -> None:
        self.prefix = prefix or f"ot{os.getpid() % 100000}"
        self.names = [self.ns(n) for n in ("inet", "R", "natA", "A", "natB", "B")]

    def ns(self, short: str) -> str:
        return f"{self.prefix}-{short}"

    def exec_prefix(self, short: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns(short)]

    def sh(self, short: str, *cmd: str) -> None:
        _run(*self.exec_prefix(short), *cmd)

    def up(self) -> None:
        for name in self.names:
            _run("ip", "netns", "add", name)
            _run("ip", "netns", "exec", name, "ip", "link", "set", "lo", "up")
        self.sh("inet", "ip", "link", "add", "br0", "type", "bridge")
        self.sh("inet", "ip", "addr", "add", "10.99.0.1/24", "dev", "br0")
        self.sh("inet", "ip", "link", "set", "br0", "up")
        self.sh("inet", "sysctl", "-qw", "net.ipv4.ip_forward=1")
        self.sh("inet", "iptables", "-A", "FORWARD", "-d", "192.168.0.0/16", "-j", "DROP")
        wan = {"R": PUBLIC["R"], "natA": NAT_WAN["A"], "natB": NAT_WAN["B"]}
        for i, (short, ip) in enumerate(wan.items()):
            outer = f"{self.prefix[:9]}w{i}"
            _run("ip", "link", "add", outer, "type", "veth", "peer", "name", "wan",
                 "netns", self.ns(short))
            _run("ip", "link", "set", outer, "netns", self.ns("inet"))
            self.sh("inet", "ip", "link", "set", outer, "master", "br0", "up")
            self.sh(short, "ip", "addr", "add", f"{ip}/24", "dev", "wan")
            self.sh(short, "ip", "link", "set", "wan", "up")
            self.sh(short, "ip", "route", "add", "default", "via", "10.99.0.1")
        for k, host in enumerate(("A", "B"), start=1):
            nat = f"nat{host}"
            _run("ip", "link", "add", f"{self.prefix[:9]}l{k}", "type", "veth", "peer",
                 "name", "eth0", "netns", self.ns(host))
            _run("ip", "link", "set", f"{self.prefix[:9]}l{k}", "netns", self.ns(nat),
                 "name", "lan")
            self.sh(nat, "ip", "addr", "add", f"192.168.{k}.1/24", "dev", "lan")
            self.sh(nat, "ip", "link", "set", "lan", "up")
            self.sh(nat, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            self.sh(host, "ip", "addr", "add", f"{PRIVATE[host]}/24", "dev", "eth0")
            self.sh(host, "ip", "link", "set", "eth0", "up")
            self.sh(host, "ip", "route", "add", "default", "via", f"192.168.{k}.1")
            self._masquerade(nat)

    def _masquerade(self, nat: str) -> None:
        """Outbound-only NAT: MASQUERADE out, only replies back in, the rest dropped."""
        ipt = ("iptables",)
        self.sh(nat, *ipt, "-A", "INPUT", "-i", "wan", "-m", "conntrack", "--ctstate",
                "ESTABLISHED,RELATED", "-j", "ACCEPT")
        self.sh(nat, *ipt, "-A", "INPUT", "-i", "wan", "-j", "DROP")
        self.sh(nat, *ipt, "-t", "nat", "-A", "POSTROUTING", "-o", "wan", "-j", "MASQUERADE")
        self.sh(nat, *ipt, "-P", "FORWARD", "DROP")
        self.sh(nat, *ipt, "-A", "FORWARD", "-i", "lan", "-o", "wan", "-j", "ACCEPT")
        self.sh(nat, *ipt, "-A", "FORWARD", "-i", "wan", "-o", "lan", "-m", "conntrack",
                "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")

    def down(self) -> list[str]:
        """Kill what runs inside, delete every namespace; returns the ones left (should be [])."""
        for name in self.names:
            pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
            for pid in pids.stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), 9)
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        return [n for n in self.names if n in listed.split()]

    def get_json(self, short: str, url: str) -> Any:
        """GET ``url`` from inside namespace ``short`` (the driver has no route in)."""
        import json

        result = subprocess.run([*self.exec_prefix(short), "curl", "-sf", "--max-time", "10",
                                 url], capture_output=True, text=True)
        if result.returncode != 0:
            raise OSError(f"curl {url} in {short}: exit {result.returncode}")
        return json.loads(result.stdout)

    def post(self, short: str, url: str, body: str) -> tuple[dict[str, str], str]:
        """POST JSON from inside ``short``; returns (response headers, body)."""
        result = subprocess.run(
            [*self.exec_prefix(short), "curl", "-sN", "-D", "-", "--max-time", "30", "-H",
             "content-type: application/json", "-d", body, url],
            capture_output=True, text=True,
        )
        if result.returncode != 0:
            raise OSError(f"curl POST {url} in {short}: exit {result.returncode}")
        head, _, payload = result.stdout.replace("\r\n", "\n").partition("\n\n")
        headers = {}
        for line in head.splitlines()[1:]:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        headers[":status"] = head.split()[1] if head else ""
        return headers, payload
