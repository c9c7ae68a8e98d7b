"""The ``otela`` command line."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import typer

from otela import __version__
from otela.config import (
    DEFAULT_HTTP_PORT,
    DEFAULT_P2P_PORT,
    NodeConfig,
    parse_duration,
    split_addresses,
)
from otela.paths import default_home

app = typer.Typer(
    name="otela",
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


@app.command()
def start(
    process: str | None = typer.Option(
        None,
        "--process",
        envvar="OTELA_PROCESS",
        help='Engine command to launch and supervise, e.g. "vllm serve Qwen/Qwen3-8B --port 8000". '
        "Without it the node joins as idle capacity.",
    ),
    engine_url: str | None = typer.Option(
        None,
        "--engine-url",
        envvar="OTELA_ENGINE_URL",
        help="Engine base URL, when it cannot be read from the command's --port/--host.",
    ),
    bootstrap: list[str] = typer.Option(
        [],
        "--bootstrap",
        "-b",
        envvar="OTELA_BOOTSTRAP",
        help="Multiaddr of a peer to join through (repeatable; the env var takes a comma or "
        "space separated list).",
    ),
    provider_id: str | None = typer.Option(
        None,
        "--provider-id",
        envvar="OTELA_PROVIDER_ID",
        help="Who contributes this node; users allowlist providers. Default: derived from the key.",
    ),
    ingress: bool = typer.Option(
        False,
        "--ingress",
        envvar="OTELA_INGRESS",
        help="Mark this node as an ingress (public entry point). Every node routes requests.",
    ),
    home: Path = typer.Option(
        None,
        "--home",
        envvar="OTELA_HOME",
        help="Node home: identity key and logs. Default: $XDG_CONFIG_HOME/otela/node.",
    ),
    host: str = typer.Option(
        "0.0.0.0", "--host", envvar="OTELA_HOST", help="Address to listen on (HTTP and libp2p)."
    ),
    public_host: str | None = typer.Option(
        None,
        "--public-host",
        envvar="OTELA_PUBLIC_HOST",
        help="Address other nodes reach us at. Default: --host, or this host's address.",
    ),
    http_port: int = typer.Option(
        DEFAULT_HTTP_PORT, "--http-port", envvar="OTELA_HTTP_PORT", help="HTTP API port (0: any)."
    ),
    p2p_port: int = typer.Option(
        DEFAULT_P2P_PORT, "--p2p-port", envvar="OTELA_P2P_PORT", help="libp2p TCP port (0: any)."
    ),
    ready_timeout: float = typer.Option(
        1800.0,
        "--ready-timeout",
        envvar="OTELA_READY_TIMEOUT",
        help="Seconds to wait for the engine to answer before giving up "
        "(large models load slowly).",
    ),
    status_file: Path | None = typer.Option(
        None,
        "--status-file",
        envvar="OTELA_STATUS_FILE",
        help="Write this node's peer id, addresses and HTTP URL as JSON here once listening "
        "(handy for Slurm scripts that bootstrap other jobs from it).",
    ),
    authority: str | None = typer.Option(
        None, "--authority", envvar="OTELA_AUTHORITY",
        help="Membership authority (the string `otela membership init` prints, or a file "
        "holding it). With it, only nodes holding a valid certificate join. Without: open.",
    ),
    certificate: Path | None = typer.Option(
        None, "--certificate", envvar="OTELA_CERTIFICATE",
        help="This node's membership certificate. Default: <home>/certificate.cert.",
    ),
    registry_retention: str = typer.Option(
        "24h", "--registry-retention", envvar="OTELA_REGISTRY_RETENTION",
        help="How long LEFT nodes stay visible in the registry views.",
    ),
    registry_horizon: str = typer.Option(
        "48h", "--registry-horizon", envvar="OTELA_REGISTRY_HORIZON",
        help="How long after its last signed update an entry is compacted away "
        "(live nodes re-sign every horizon/8). Must be at least the retention.",
    ),
    probe_interval: str = typer.Option(
        "1s", "--probe-interval", envvar="OTELA_PROBE_INTERVAL",
        help="Failure detector: how often this node probes one other member.",
    ),
    suspicion_timeout: str = typer.Option(
        "6s", "--suspicion-timeout", envvar="OTELA_SUSPICION_TIMEOUT",
        help="Failure detector: how long a suspected node has to refute before it is "
        "evicted (LEFT). Suspected nodes get no traffic meanwhile.",
    ),
    log_level: str = typer.Option("INFO", "--log-level", envvar="OTELA_LOG_LEVEL"),
) -> None:
    """Run a node: join the mesh, replicate the registry, route requests, and optionally
    launch and supervise an engine, announcing it once healthy.

    Exits 0 after SIGTERM/SIGINT (announcing LEFT), 3 if the engine fails (announcing DOWN).
    """
    import trio

    from otela.daemon import Node
    from otela.engine.command import EngineCommandError
    from otela.mesh.bootstrap import BootstrapAddressError

    _setup_logging(log_level)
    try:
        retention, horizon = parse_duration(registry_retention), parse_duration(registry_horizon)
        probe_s, suspicion_s = parse_duration(probe_interval), parse_duration(suspicion_timeout)
    except ValueError as exc:
        typer.echo(f"otela: {exc}", err=True)
        raise typer.Exit(2) from None
    config = NodeConfig(
        home=home or default_home(),
        listen_host=host,
        public_host=public_host,
        http_port=http_port,
        p2p_port=p2p_port,
        bootstrap=split_addresses(bootstrap),
        provider_id=provider_id,
        process=process,
        engine_url=engine_url,
        ingress=ingress,
        ready_timeout=ready_timeout,
        status_file=status_file,
        authority=authority,
        certificate=certificate,
        registry_retention=retention,
        registry_horizon=horizon,
        probe_interval=probe_s,
        suspicion_timeout=suspicion_s,
    )
    try:
        node = Node(config)
    except (EngineCommandError, BootstrapAddressError, ValueError) as exc:
        typer.echo(f"otela: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        code = trio.run(node.run)
    except KeyboardInterrupt:
        code = 130
    except OSError as exc:
        typer.echo(f"otela: {exc}", err=True)
        code = 1
    raise typer.Exit(code)


@app.command()
def demo(
    requests: int = typer.Option(6, "--requests", help="Chat requests to send per model."),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds to wait for the federation."),
) -> None:
    """Start a local federation (ingress + three echo-engine nodes as separate processes),
    send chat requests through the ingress with the openai client, show who served each,
    and shut everything down."""
    from otela.demo import run_demo

    raise typer.Exit(run_demo(requests_per_model=requests, timeout=timeout))


@app.command()
def version() -> None:
    """Print otela's version."""
    typer.echo(__version__)


def _mount_optional_apps() -> None:
    from otela.membership.cli import app as membership_app

    app.add_typer(
        membership_app, name="membership",
        help="Membership authority: create it, sign and revoke node certificates.",
    )
    try:
        from simulator.cli import app as sim_app  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return
    app.add_typer(sim_app, name="sim", help="Roofline serving simulator: analyze and run.")


_mount_optional_apps()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
