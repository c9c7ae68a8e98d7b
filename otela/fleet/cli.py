"""``otela fleet``: keep deployments of serving jobs alive across Slurm clusters.

Exit codes: 0 done; 1 the federation or a cluster could not be asked; 2 bad input (the
fleet file's error names its file, line and field; nothing was submitted).
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import typer

from otela.fleet.errors import FleetError

HELP = ("Keep deployments of serving jobs alive across Slurm clusters: submit, hand over "
        "before wall times, replace failures, autoscale, scale to zero (docs/fleet.md).")

app = typer.Typer(name="fleet", help=HELP, no_args_is_help=True, add_completion=False,
                  context_settings={"help_option_names": ["-h", "--help"]})


def default_file() -> Path:
    from otela.paths import config_dir

    return config_dir() / "fleet.toml"


FILE_OPTION = typer.Option(
    None, "--file", "-f", metavar="FILE", envvar="OTELA_FLEET_FILE", show_default=False,
    help="The fleet file. Default: $XDG_CONFIG_HOME/otela/fleet.toml. Env: OTELA_FLEET_FILE.")
STATE_OPTION = typer.Option(
    None, "--state", metavar="DIR", envvar="OTELA_FLEET_STATE", show_default=False,
    help="The controller's state directory (estimates, events.jsonl, metrics.prom). "
    "Default: $XDG_STATE_HOME/otela/fleet/<fleet name>. Env: OTELA_FLEET_STATE.")
JSON_OPTION = typer.Option(False, "--json", help="Print JSON instead of tables.")


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"otela fleet: {message}", err=True)
    raise typer.Exit(code)


def _controller(file: Path | None, state: Path | None, echo: bool = False) -> Any:
    from otela.fleet.controller import Controller
    from otela.fleet.spec import load

    try:
        fleet = load(file or default_file())
    except FleetError as exc:
        _fail(str(exc))
    return Controller(fleet, state, echo=echo)


def _run(coro_fn: Any, *args: Any) -> Any:
    import trio

    from otela.fleet.federation import FederationUnreachable

    try:
        return trio.run(coro_fn, *args)
    except FederationUnreachable as exc:
        _fail(f"{exc}: cannot tell which replicas serve, so nothing was changed", 1)
    except FleetError as exc:
        _fail(str(exc))


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)


@app.command()
def init(
    path: Path | None = typer.Option(
        None, "--path", metavar="FILE", show_default=False,
        help="Where to write. Default: $XDG_CONFIG_HOME/otela/fleet.toml."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
) -> None:
    """Write a commented example fleet file (two clusters, a fixed and an autoscaled
    deployment) to edit."""
    target = path or default_file()
    if target.exists() and not force:
        _fail(f"{target} already exists (use --force to overwrite)", 1)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text((Path(__file__).parent / "example.toml").read_text())
    typer.echo(f"wrote {target}")


@app.command()
def check(file: Path | None = FILE_OPTION) -> None:
    """Check the fleet file without asking any cluster (exit 2 naming the line and field
    of the first error)."""
    from otela.fleet.spec import load

    try:
        fleet = load(file or default_file())
    except FleetError as exc:
        _fail(str(exc))
    typer.echo(f"{fleet.path}: fleet {fleet.name}, {len(fleet.clusters)} cluster(s), "
               f"{len(fleet.deployments)} deployment(s): ok")


@app.command()
def diff(file: Path | None = FILE_OPTION, state: Path | None = STATE_OPTION,
         as_json: bool = JSON_OPTION) -> None:
    """What `apply` would do now: jobs to submit, drain or cancel. Nothing is submitted."""
    controller = _controller(file, state)
    result = _run(controller.reconcile_once, True)
    if as_json:
        typer.echo(json.dumps({"actions": result.done,
                               "notes": [n.message for n in result.decision.notes]}, indent=2))
        return
    _print_actions(result, "would")


@app.command()
def apply(file: Path | None = FILE_OPTION, state: Path | None = STATE_OPTION,
          as_json: bool = JSON_OPTION,
          verbose: bool = typer.Option(False, "--verbose", "-v", help="Log each event.")
          ) -> None:
    """One reconcile pass: submit, drain and cancel jobs so that each deployment moves to
    its desired state; records each decision as an event."""
    _setup_logging(verbose)
    controller = _controller(file, state, echo=verbose)
    result = _run(controller.reconcile_once)
    if as_json:
        typer.echo(json.dumps({"actions": result.done,
                               "notes": [n.message for n in result.decision.notes]}, indent=2))
    else:
        _print_actions(result, "did")
    if any("(sbatch refused" in done for done in result.done):
        raise typer.Exit(1)


@app.command()
def run(file: Path | None = FILE_OPTION, state: Path | None = STATE_OPTION,
        metrics_port: int | None = typer.Option(
            None, "--metrics-port", metavar="PORT", envvar="OTELA_FLEET_METRICS_PORT",
            help="Serve Prometheus metrics on this port (GET /metrics). "
            "Env: OTELA_FLEET_METRICS_PORT."),
        metrics_host: str = typer.Option("127.0.0.1", "--metrics-host", metavar="ADDR",
                                         help="Address the metrics port listens on."),
        passes: int | None = typer.Option(None, "--passes", metavar="N", show_default=False,
                                          help="Stop after N passes (default: until "
                                          "SIGINT/SIGTERM)."),
        ) -> None:
    """The controller loop: reconcile every interval (sooner while replicas start, at once
    when an ingress holds a request for a scaled-to-zero model), hand replicas over
    before their wall time, replace failures, autoscale. Each decision is a JSON line in
    events.jsonl and a log line; SIGINT/SIGTERM stop it (jobs keep running; a restarted
    controller adopts them)."""
    import trio

    from otela.fleet.metrics_server import serve_metrics

    _setup_logging(True)
    controller = _controller(file, state, echo=True)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            if metrics_port is not None:
                await nursery.start(serve_metrics, controller.metrics.registry,
                                    metrics_host, metrics_port)
            nursery.start_soon(_stop_on_signals, nursery.cancel_scope)
            await controller.run(passes)
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        _fail(f"cannot serve metrics on {metrics_host}:{metrics_port}: {exc.strerror or exc}")


async def _stop_on_signals(scope: Any) -> None:
    import trio

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            scope.cancel()
            return


@app.command()
def status(file: Path | None = FILE_OPTION, state: Path | None = STATE_OPTION,
           events: int = typer.Option(10, "--events", metavar="N",
                                      help="Recent events to show."),
           as_json: bool = JSON_OPTION) -> None:
    """Desired against actual per deployment: jobs pending and running (wall time left),
    their nodes (JOIN, SERVING, DOWN, LEFT), unreachable clusters, recent events."""
    from otela.fleet.status import build_status, render_status

    controller = _controller(file, state)
    report = _run(build_status, controller, events)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    render_status(report)


@app.command()
def stop(deployment: str = typer.Argument(..., help="The deployment to stop."),
         file: Path | None = FILE_OPTION, state: Path | None = STATE_OPTION) -> None:
    """Stop a deployment: its serving replicas drain, the others are cancelled, and it
    stays at zero (for `apply` and `run` too) until `otela fleet resume DEPLOYMENT`."""
    controller = _controller(file, state)
    try:
        controller.set_stopped(deployment, True)
    except KeyError:
        _fail(f"no deployment {deployment!r} in {controller.fleet.path}")
    result = _run(controller.reconcile_once)
    _print_actions(result, "did", only=deployment)


@app.command()
def resume(deployment: str = typer.Argument(..., help="The deployment to resume."),
           file: Path | None = FILE_OPTION, state: Path | None = STATE_OPTION) -> None:
    """Undo `stop`: the deployment goes back to its desired count."""
    controller = _controller(file, state)
    try:
        controller.set_stopped(deployment, False)
    except KeyError:
        _fail(f"no deployment {deployment!r} in {controller.fleet.path}")
    result = _run(controller.reconcile_once)
    _print_actions(result, "did", only=deployment)


def _print_actions(result: Any, verb: str, only: str | None = None) -> None:
    from rich.table import Table

    from otela.console import make_console

    console = make_console()
    table = Table(title=f"{'would do' if verb == 'would' else 'done'}", show_lines=False)
    for column in ("deployment", "want", "action"):
        table.add_column(column)
    wants = {w.name: w for w in result.wants}
    rows = 0
    for action, text in zip(result.decision.actions, result.done, strict=False):
        if only is not None and action.deployment != only:
            continue
        want = wants.get(action.deployment)
        table.add_row(action.deployment, str(want.count) if want else "0", text)
        rows += 1
    if rows:
        console.print(table)
    else:
        console.print("nothing to do: every deployment is as desired")
    for note in result.decision.notes:
        if only is None or note.deployment == only:
            console.print(f"[dim]{note.deployment}: {note.message}[/dim]")
    for cluster, why in result.observation.unreachable.items():
        console.print(f"[yellow]cluster {cluster} unreachable: {why}[/yellow]")

