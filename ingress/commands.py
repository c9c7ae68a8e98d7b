"""The ingress service's ``otela`` subcommands (``otela.commands`` entry points), in a
module of their own: loading one must not import the service's HTTP API and the node
(``ingress.plugin``), which made every ``otela keys`` call take ~2 s."""

from __future__ import annotations

from typing import Any

from otela.services import as_command


def keys_command() -> Any:
    from ingress.cli import keys_app

    return as_command(keys_app, "keys")


def usage_command() -> Any:
    from ingress.cli import usage_command as usage

    return as_command(usage, "usage")


def requests_command() -> Any:
    from ingress.cli import requests_command as requests

    return as_command(requests, "requests")


def prices_command() -> Any:
    from ingress.cli import prices_app

    return as_command(prices_app, "prices")
