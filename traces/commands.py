"""``otela trace``, plugged into the ``otela`` command through the ``otela.commands``
entry point (``otela.services``)."""

from __future__ import annotations

from typing import Any

from otela.services import as_command


def trace() -> Any:
    from traces.cli import app

    return as_command(app, "trace", "Request traces: gen, replay, analyze, compare.")
