"""What other packages plug into a node and into the ``otela`` command, through entry points.

otela's core imports none of ``ingress/``, ``simulator/`` or ``traces/`` (the layers in
docs/architecture.md, checked by import-linter): they sit above it and are found here, by
the entry points their distribution declares (``pyproject.toml``):

- ``otela.ingress``, name ``service``: an ``IngressPlugin`` (the public ingress service:
  API keys, limits, usage, the admin API and the dashboard);
- ``otela.commands``: one entry point per ``otela`` subcommand, a callable returning its
  click command (``keys``, ``usage``, ``sim``, ``plan``, ``trace``).

A node without the plugin installed still runs; asking it for the ingress service says so.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol

from otela.api.keygate import KeyGate

if TYPE_CHECKING:
    from fastapi import FastAPI

    from otela.api.observe import Observer
    from otela.config import NodeConfig
    from otela.metrics import Registry

INGRESS_GROUP = "otela.ingress"
COMMANDS_GROUP = "otela.commands"


class ServiceError(Exception):
    """A plugged-in service cannot start (its database unreachable, a wrong URL...): a
    setting to fix, reported as such by ``otela start`` (exit status 2)."""


class IngressService(KeyGate, Protocol):
    """The public ingress service as the node runs it: the request path's key gate, what
    observes the path for it, its background tasks and its health report."""

    def observers(self, metrics: Registry) -> Sequence[Observer]: ...

    async def run(self, *, task_status: Any = ...) -> None: ...

    def serving_at(self, url: str) -> None:
        """The node's HTTP port is open at ``url`` (loopback) and served by this process:
        the service may send requests through it (the batch runner). Never called in a
        data-path worker."""
        ...

    def report(self) -> dict[str, Any]: ...

    async def refresh_keys(self) -> None:
        """Read the keys and teams again now (a data-path worker, told by its control
        process that its admin API changed them)."""
        ...

    def tell_others_with(self, tell: Callable[[], Awaitable[object]]) -> None:
        """Keys or teams changed through this process: ``tell`` the node's other processes
        holding a copy (its data-path workers), and wait for them, before answering."""
        ...


class IngressPlugin(Protocol):
    def open(self, config: NodeConfig, ingress_id: str) -> IngressService:
        """Connect to ``config.ingress_db``; ``ServiceError`` says why it cannot."""
        ...

    def install(self, api: FastAPI, service: IngressService | None) -> None:
        """Add the dashboard (``/ui``) and, with a service, its admin API to ``api``."""
        ...


@functools.cache
def ingress_plugin() -> IngressPlugin | None:
    """The installed ingress service, or None."""
    found = entry_points(group=INGRESS_GROUP, name="service")
    return next(iter(found)).load() if found else None


def require_ingress_plugin() -> IngressPlugin:
    plugin = ingress_plugin()
    if plugin is None:
        raise ServiceError("--ingress-db needs the ingress service, which is not installed "
                           "here (otela's distribution provides it: reinstall otela)")
    return plugin


def commands() -> dict[str, Callable[[], Any]]:
    """``otela``'s plugged-in subcommands: name -> a loader of its click command."""
    return {point.name: point.load for point in entry_points(group=COMMANDS_GROUP)}


def as_command(target: Any, name: str, help_text: str | None = None,
               **options: Any) -> Any:
    """``target`` (a typer app, or a function typer makes a command of) as the click
    command ``otela <name>``: what an ``otela.commands`` entry point returns."""
    import typer
    import typer.main

    holder = typer.Typer()
    if isinstance(target, typer.Typer):
        holder.add_typer(target, name=name, help=help_text or target.info.help)
        return typer.main.get_command(holder).get_command(None, name)  # type: ignore[attr-defined]
    holder.command(name, help=help_text, **options)(target)
    return typer.main.get_command(holder)
