"""The ``otela`` command line."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import typer
import typer.core
import typer.main

from otela import __version__
from otela.config import DEFAULT_HTTP_PORT, ConfigError, resolve
from otela.config.options import with_setting_options


class _LazyGroup(typer.core.TyperGroup):
    """otela's top-level command group, with the plugged-in commands (``otela.services``:
    ``keys``, ``usage``, ``sim``, ``plan``, ``trace``) loaded when named or listed: their
    modules import the ingress service, numpy, OR-Tools and pandas (~0.7 s and ~55 MB of a
    node's memory), never needed by ``otela start``."""

    def _load(self, name: str, loaders: dict[str, Any]) -> None:
        if name in loaders and name not in self.commands:
            self.add_command(_plugged_in(name, loaders[name]), name)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands:
            self._load(cmd_name, plugged_in_commands())
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: Any) -> list[str]:
        loaders = plugged_in_commands()
        for name in loaders:
            self._load(name, loaders)
        return super().list_commands(ctx)


app = typer.Typer(
    name="otela",
    cls=_LazyGroup,
    help="otela: federate GPU nodes (Slurm jobs, pods, workstations) into one LLM-serving "
    "platform with no central coordinator.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _setup_logging(level: str) -> None:
    from otela.mesh.host import quiet_libp2p_logs

    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    quiet_libp2p_logs()


CONFIG_OPTION = typer.Option(
    None, "--config", metavar="FILE", show_default=False,
    help="Config file (see `otela init`). Default: $XDG_CONFIG_HOME/otela/config.toml. "
    "Env: OTELA_CONFIG.",
)


@app.command()
@with_setting_options
def start(flags: dict[str, Any], config_file: Path | None = CONFIG_OPTION) -> None:
    """Run a node: join the mesh, replicate the registry, route requests, and optionally
    launch and supervise an engine, announcing it once healthy.

    Settings come from flags > OTELA_* environment > config file > defaults.

    Exit codes: 0 after SIGTERM/SIGINT (drains, then announces LEFT);
    2 on bad configuration (a port in use or an unusable home included);
    3 if the engine fails (announces DOWN, copies its logs to the log sink).
    """
    import trio

    from otela.daemon import Node
    from otela.engine.command import EngineCommandError
    from otela.engine.health import check_reachable
    from otela.failures import os_error_in
    from otela.mesh.bootstrap import BootstrapAddressError
    from otela.services import ServiceError

    try:
        config = resolve(flags, None, config_file).config
        _setup_logging(config.log_level)
        node = Node(config)
        if config.engine_url and not config.process:
            check_reachable(config.engine_url)
    except (ConfigError, EngineCommandError, BootstrapAddressError, ValueError,
            ServiceError, OSError) as exc:  # OSError: an unreadable home or key file
        typer.echo(f"otela: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        code = trio.run(node.run, instruments=[node.slow_steps] if config.trace_loop else [])
    except KeyboardInterrupt:
        code = 130
    except (OSError, BaseExceptionGroup) as exc:
        error = os_error_in(exc)
        if error is None:
            raise
        # A port in use, an address this host does not have: a setting to fix, not a crash.
        typer.echo(f"otela: {error}", err=True)
        code = 2
    raise typer.Exit(code)


@app.command()
def init(
    path: Path | None = typer.Option(
        None, "--path", metavar="FILE", show_default=False,
        help="Where to write. Default: $XDG_CONFIG_HOME/otela/config.toml.",
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
) -> None:
    """Write a commented config file listing every setting with its default."""
    from otela.config import default_config_file, render_template

    target = path or default_config_file()
    if target.exists() and not force:
        typer.echo(f"otela: {target} already exists (use --force to overwrite)", err=True)
        raise typer.Exit(1)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_template())
    typer.echo(f"wrote {target}")


config_app = typer.Typer(help="Inspect the configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.command("show")
@with_setting_options
def config_show(
    flags: dict[str, Any],
    config_file: Path | None = CONFIG_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Print the effective configuration and where each value came from: defaults, the
    config file, OTELA_* environment, and any `otela start` flags given here too (so
    `otela config show --http-port 9000` says what `otela start --http-port 9000` runs
    with)."""
    import json

    from rich.table import Table

    from otela.config import show_rows
    from otela.console import make_console

    try:
        resolved = resolve(flags, None, config_file)
    except ConfigError as exc:
        typer.echo(f"otela: {exc}", err=True)
        raise typer.Exit(2) from None
    rows = show_rows(resolved)
    if as_json:
        settings = {r["setting"]: {"value": r["value"], "source": r["source"], "env": r["env"]}
                    for r in rows}
        typer.echo(json.dumps({"file": str(resolved.file), "settings": settings}, indent=2))
        return
    table = Table(title=f"effective configuration (file: {resolved.file})")
    for column in ("setting", "value", "source", "env"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["setting"], row["value"], row["source"], row["env"])
    make_console().print(table)


@app.command()
def demo(
    requests: int = typer.Option(6, "--requests", help="Chat requests to send per model."),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds to wait for the federation."),
    engine: str = typer.Option(
        "echo",
        "--engine",
        help="echo: three nodes wrapping otela's echo engine. vllm: one node wrapping a real "
        "vLLM (CPU build, `scripts/setup-vllm`) serving a tiny random-weight model built "
        "locally; its answers are gibberish, the engine is real.",
    ),
    vllm_python: Path | None = typer.Option(
        None,
        "--vllm-python",
        envvar="OTELA_VLLM_PYTHON",
        help="Python interpreter that has vLLM [default: .venv-vllm/bin/python in the project].",
    ),
) -> None:
    """Start a local federation of otela processes, send chat requests through the ingress
    with the openai client, show who served each, and shut everything down."""
    try:
        if engine == "echo":
            from otela.demo import run_demo

            raise typer.Exit(run_demo(requests_per_model=requests, timeout=timeout))
        if engine == "vllm":
            from otela.demo_vllm import run_vllm_demo

            raise typer.Exit(run_vllm_demo(vllm_python, requests=requests))
    except ImportError as exc:
        if not missing_extra(exc):
            raise
        raise needs_extra("demo", "demo") from None
    typer.echo(f"otela: unknown engine {engine!r} (choose echo or vllm)", err=True)
    raise typer.Exit(2)


@app.command()
def doctor(
    peer_id: str | None = typer.Argument(
        None, help="A peer id to explain as well (why it is, or is not, reachable)."
    ),
    node: str = typer.Option(
        f"http://127.0.0.1:{DEFAULT_HTTP_PORT}",
        "--node",
        envvar="OTELA_NODE_URL",
        help="HTTP URL of the node to ask.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the raw /v1/network report."),
) -> None:
    """Explain connectivity: this node's addresses, reachability (public, private via relay,
    unreachable), relay reservations, bootstrap peers, and a plain-language verdict; with
    PEER_ID, the same for that peer (never seen, left, behind NAT, connected...)."""
    import json

    import httpx

    from otela.doctor import render

    params = {"peer": peer_id} if peer_id else {}
    try:
        response = httpx.get(f"{node.rstrip('/')}/v1/network", params=params, timeout=10,
                             trust_env=False)
    except httpx.HTTPError as exc:
        typer.echo(f"otela: cannot reach the node at {node}: {exc} (is it running? --node URL)",
                   err=True)
        raise typer.Exit(1) from None
    if response.status_code != 200:
        typer.echo(f"otela: {node} answered {response.status_code}: {response.text[:300]}",
                   err=True)
        raise typer.Exit(1)
    report = response.json()
    typer.echo(json.dumps(report, indent=2) if as_json else render(report, peer_id))


@app.command()
def version() -> None:
    """Print otela's version."""
    typer.echo(__version__)


# Third-party packages that come with an extra (pyproject.toml), not with ``pip install
# otela``: a command that needs one is listed anyway and says which extra to install.
EXTRA_PACKAGES = frozenset({"numpy", "matplotlib", "ortools", "pandas", "psycopg", "openai",
                            "anthropic"})


def missing_extra(exc: ImportError) -> bool:
    """Whether ``exc`` is a missing third-party package of an extra (not a bug of ours)."""
    name = (getattr(exc, "name", None) or "").split(".")[0]
    return isinstance(exc, ModuleNotFoundError) and name in EXTRA_PACKAGES


def needs_extra(command: str, extra: str) -> typer.Exit:
    """Tell the user which extra ``command`` needs; the exit to raise (status 1)."""
    typer.echo(f"otela: `otela {command}` needs the [{extra}] extra, not installed here: "
               f"pip install 'otela[{extra}]' (or 'otela[all]')", err=True)
    return typer.Exit(1)


def _placeholder(name: str, extra: str, help_text: str) -> Any:
    """``otela <name>`` without its extra: listed, and explains what to install."""
    holder = typer.Typer()

    from rich.markup import escape

    @holder.command(name, help=escape(f"{help_text} Needs otela[{extra}], not installed."),
                    context_settings={"allow_extra_args": True,
                                      "ignore_unknown_options": True,
                                      "help_option_names": []})
    def placeholder(ctx: typer.Context) -> None:
        raise needs_extra(name, extra)

    return typer.main.get_command(holder)


# Commands that come with an extra: (what the placeholder says, the extra) when it is missing.
NEEDS_EXTRA = {
    "sim": ("Roofline serving simulator: analyze and run.", "sim"),
    "plan": ("Suggest which models to deploy on which GPUs (CP-SAT).", "plan"),
    "trace": ("Request traces: gen, replay, analyze, compare.", "traces"),
}


def _membership_command() -> Any:
    from otela.membership.cli import app as membership_app
    from otela.services import as_command

    return as_command(membership_app, "membership", "Membership authority: create it, sign "
                      "and revoke node certificates.")


def _fleet_command() -> Any:
    from otela.fleet.cli import HELP
    from otela.fleet.cli import app as fleet_app
    from otela.services import as_command

    return as_command(fleet_app, "fleet", HELP)


# otela's own commands loaded like plugged-in ones, when named (loader -> command maker):
# membership imports libp2p's crypto (~1.2 s), which every ``otela keys`` call paid.
BUILTIN_LAZY: dict[str, Any] = {"membership": lambda: _membership_command,
                                "fleet": lambda: _fleet_command}


def plugged_in_commands() -> dict[str, Any]:
    """Name -> loader of each lazily loaded command: otela's own heavy ones and the
    plugged-in ones (``otela.commands`` entry points)."""
    from otela.services import commands

    return {**BUILTIN_LAZY, **commands()}


def _plugged_in(name: str, load: Any) -> Any:
    """The click command of the entry point ``name``, or, when an extra it needs is not
    installed, a placeholder that says which."""
    try:
        return load()()
    except ImportError as exc:
        if not missing_extra(exc) or name not in NEEDS_EXTRA:
            raise
        help_text, extra = NEEDS_EXTRA[name]
        return _placeholder(name, extra, help_text)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
