"""The errors ``otela fleet`` reports to the operator as one line, never a traceback."""

from __future__ import annotations

from pathlib import Path


class FleetError(Exception):
    """Something the operator must fix; the CLI prints it and exits 2."""


class FleetFileError(FleetError):
    """A fleet file that cannot be used: names the file, the line and the field, so the
    operator goes straight to it. Nothing is submitted while the file has one."""

    def __init__(self, path: Path | str, line: int | None, field: str, message: str) -> None:
        self.path, self.line, self.field, self.message = str(path), line, field, message
        where = f"{path}:{line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {field}: {message}" if field else f"{where}: {message}")


class ClusterUnreachable(FleetError):
    """A cluster's Slurm commands could not be run (SSH down, login node gone, squeue
    failing): its jobs are unknown until it answers again."""
