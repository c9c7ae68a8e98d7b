"""``otela sim`` and ``otela plan``, plugged into the ``otela`` command through the
``otela.commands`` entry points (``otela.services``)."""

from __future__ import annotations

from typing import Any

from otela.services import as_command


def sim() -> Any:
    from simulator.cli import app

    return as_command(app, "sim", "Roofline serving simulator: analyze and run.")


def plan() -> Any:
    from simulator.placer.cli import HELP, plan_command

    return as_command(plan_command, "plan", HELP, no_args_is_help=True)
