"""How saturated this host's CPUs are, from the kernel (Linux pressure stall information).

A failure detector on a saturated host sees every peer as slow: probes and acks queue
behind other work in every process. An event loop's own lag does not show it (the
scheduler wakes sleepers promptly; the queueing happens after they wake), while the
kernel's CPU pressure does: the share of recent time in which some runnable task waited
for a core. otela reports it next to each suspicion and in ``/v1/health``, so that an
operator (or a later rule) can tell a peer that stopped answering from a host that stopped
keeping up. Reading it costs one small /proc read; kernels without PSI (before 4.20, or
containers that hide it) give None.
"""

from __future__ import annotations

from pathlib import Path

PSI_CPU = Path("/proc/pressure/cpu")


def parse_cpu_pressure(text: str) -> float | None:
    """``some avg10`` of a /proc/pressure/cpu text, in percent, or None if absent."""
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind != "some":
            continue
        for field in rest.split():
            name, _, value = field.partition("=")
            if name == "avg10":
                try:
                    return float(value)
                except ValueError:
                    return None
    return None


def cpu_pressure(path: Path = PSI_CPU) -> float | None:
    """Percent of the last 10 s in which some runnable task on this host waited for a CPU."""
    try:
        return parse_cpu_pressure(path.read_text())
    except OSError:
        return None
