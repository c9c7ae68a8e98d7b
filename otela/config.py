"""A node's settings, resolved once at start from flags and ``OTELA_*`` environment."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_HTTP_PORT = 8092
DEFAULT_P2P_PORT = 43905


@dataclass
class NodeConfig:
    home: Path
    listen_host: str = "0.0.0.0"
    public_host: str | None = None
    http_port: int = DEFAULT_HTTP_PORT
    p2p_port: int = DEFAULT_P2P_PORT
    bootstrap: list[str] = field(default_factory=list)
    provider_id: str | None = None
    process: str | None = None
    engine_url: str | None = None
    ingress: bool = False
    ready_timeout: float = 1800.0
    engine_stop_grace: float = 10.0
    leave_linger: float = 2.0
    anti_entropy_interval: float = 5.0
    status_file: Path | None = None
    authority: str | None = None
    certificate: Path | None = None
    registry_retention: float = 24 * 3600.0
    registry_horizon: float = 48 * 3600.0
    probe_interval: float = 1.0
    suspicion_timeout: float = 6.0

    def advertised_host(self) -> str:
        """The address other nodes use to reach us (never a wildcard)."""
        if self.public_host:
            return self.public_host
        if self.listen_host not in ("0.0.0.0", ""):
            return self.listen_host
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"


_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``15m``, ``24h`` or ``7d``; ``ValueError`` otherwise."""
    value = text.strip().lower()
    unit = _DURATION_UNITS.get(value[-1:]) if value else None
    number = value[:-1] if unit else value
    try:
        seconds = float(number) * (unit or 1.0)
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 15m, 24h, 7d)") from None
    if seconds <= 0:
        raise ValueError(f"duration must be positive: {text!r}")
    return seconds


def split_addresses(values: list[str]) -> list[str]:
    """Flatten repeated flags and comma/space separated env values into one list."""
    out: list[str] = []
    for value in values:
        out.extend(part for part in value.replace(",", " ").split() if part)
    return out
