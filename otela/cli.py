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
    SETTINGS_BY_KEY,
    ConfigError,
    resolve,
)

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


def _env_help(key: str, text: str) -> str:
    return f"{text} [env: {SETTINGS_BY_KEY[key].env}]"


@app.command()
def start(
    process: str | None = typer.Option(
        None,
        "--process",
        help=_env_help(
            "process",
            'Engine command to launch and supervise, e.g. "vllm serve Qwen/Qwen3-8B --port 8000" '
            "(vLLM, SGLang, llama.cpp's llama-server or any OpenAI-compatible server). Without it "
            "(and without --engine-url) the node joins as idle capacity.",
        ),
    ),
    engine_url: str | None = typer.Option(
        None,
        "--engine-url",
        help=_env_help(
            "engine_url",
            "Engine base URL, when it cannot be read from the command's --port/--host; without "
            "--process: an already running server to front (it must be reachable).",
        ),
    ),
    model_meta: list[str] = typer.Option(
        [],
        "--model-meta",
        help=_env_help(
            "model_meta",
            "key=value metadata for the served models, overriding what the engine and its "
            "command line say (repeatable; dtype, quantization, tensor_parallel, max_context or "
            "any key), e.g. --model-meta quantization=awq-4bit. Env: comma separated.",
        ),
    ),
    bootstrap: list[str] = typer.Option(
        [],
        "--bootstrap",
        "-b",
        help=_env_help(
            "bootstrap",
            "Multiaddr of a peer to join through (repeatable; env: comma or space separated).",
        ),
    ),
    provider_id: str | None = typer.Option(
        None,
        "--provider-id",
        help=_env_help(
            "provider_id",
            "Who contributes this node; users allowlist providers. Default: derived from the key.",
        ),
    ),
    ingress: bool | None = typer.Option(
        None,
        "--ingress/--no-ingress",
        help=_env_help("ingress", "Mark this node as an ingress (public entry point)."),
        show_default=False,
    ),
    home: Path | None = typer.Option(
        None,
        "--home",
        help=_env_help(
            "home", "Node home: identity key and logs. Default: $XDG_CONFIG_HOME/otela/node."
        ),
    ),
    host: str | None = typer.Option(
        None,
        "--host",
        help=_env_help("host", "Address to listen on (HTTP and libp2p) [default: 0.0.0.0]."),
    ),
    public_host: str | None = typer.Option(
        None,
        "--public-host",
        help=_env_help(
            "public_host",
            "Address other nodes reach us at. Default: --host, or this host's address.",
        ),
    ),
    http_port: int | None = typer.Option(
        None,
        "--http-port",
        help=_env_help("http_port", f"HTTP API port, 0: any [default: {DEFAULT_HTTP_PORT}]."),
    ),
    p2p_port: int | None = typer.Option(
        None,
        "--p2p-port",
        help=_env_help("p2p_port", f"libp2p TCP port, 0: any [default: {DEFAULT_P2P_PORT}]."),
    ),
    ready_timeout: float | None = typer.Option(
        None,
        "--ready-timeout",
        help=_env_help(
            "ready_timeout",
            "Seconds to wait for the engine to answer before giving "
            "up; large models load slowly [default: 1800].",
        ),
    ),
    health_interval: float | None = typer.Option(
        None,
        "--health-interval",
        help=_env_help("health_interval", "Seconds between engine health checks [default: 5]."),
    ),
    health_failures: int | None = typer.Option(
        None,
        "--health-failures",
        help=_env_help(
            "health_failures", "Failed health checks in a row that mean fail-stop [default: 3]."
        ),
    ),
    fatal_pattern: list[str] = typer.Option(
        [],
        "--fatal-pattern",
        help=_env_help(
            "fatal_patterns",
            "Regex: an engine log line matching it means fail-stop. "
            "Repeatable; replaces the defaults (NCCL timeouts, CUDA out of memory...; "
            "see `otela config show`).",
        ),
    ),
    log_sink: Path | None = typer.Option(
        None,
        "--log-sink",
        help=_env_help("log_sink", "Directory to copy engine logs to when the engine fails."),
    ),
    drain_grace: float | None = typer.Option(
        None,
        "--drain-grace",
        help=_env_help(
            "drain_grace",
            "On SIGTERM, seconds in-flight requests get to finish; "
            "keep drain grace + engine stop grace below Slurm's KillWait "
            "[default: 15].",
        ),
    ),
    engine_stop_grace: float | None = typer.Option(
        None,
        "--engine-stop-grace",
        help=_env_help(
            "engine_stop_grace", "Seconds between SIGTERM and SIGKILL for the engine [default: 10]."
        ),
    ),
    slurm_drain_margin: float | None = typer.Option(
        None,
        "--slurm-drain-margin",
        help=_env_help(
            "slurm_drain_margin",
            "Inside a Slurm job: start draining this many "
            "seconds before the wall time [default: 300].",
        ),
    ),
    cpus: int | None = typer.Option(
        None, "--cpus", help=_env_help("cpus", "Advertise this many CPU cores (override).")
    ),
    memory_gb: float | None = typer.Option(
        None, "--memory-gb", help=_env_help("memory_gb", "Advertise this much memory (override).")
    ),
    gpus: str | None = typer.Option(
        None,
        "--gpus",
        help=_env_help(
            "gpus",
            "Advertise these GPUs instead of what nvidia-smi/rocm-smi "
            'report, e.g. "4xA100-SXM4-80GB:80,L40S:48" (memory in GB).',
        ),
    ),
    status_file: Path | None = typer.Option(
        None,
        "--status-file",
        help=_env_help(
            "status_file",
            "Write this node's peer id, addresses and HTTP URL as JSON "
            "here once listening (for Slurm scripts that bootstrap other jobs).",
        ),
    ),
    authority: str | None = typer.Option(
        None,
        "--authority",
        help=_env_help(
            "authority",
            "Membership authority (the string `otela membership init` prints, or a file "
            "holding it). With it, only nodes holding a valid certificate join. Without: open.",
        ),
    ),
    certificate: Path | None = typer.Option(
        None,
        "--certificate",
        help=_env_help(
            "certificate", "This node's membership certificate [default: <home>/certificate.cert]."
        ),
    ),
    registry_retention: str | None = typer.Option(
        None,
        "--registry-retention",
        help=_env_help("retention", "How long LEFT nodes stay visible [default: 24h]."),
    ),
    registry_horizon: str | None = typer.Option(
        None,
        "--registry-horizon",
        help=_env_help(
            "horizon",
            "Entries are compacted this long after their last signed update; live nodes "
            "re-sign every horizon/8 [default: 48h; at least the retention].",
        ),
    ),
    probe_interval: str | None = typer.Option(
        None,
        "--probe-interval",
        help=_env_help("probe_interval", "Failure detector probe period [default: 1s]."),
    ),
    suspicion_timeout: str | None = typer.Option(
        None,
        "--suspicion-timeout",
        help=_env_help(
            "suspicion_timeout",
            "How long a suspected node (no traffic meanwhile) has to refute before it is "
            "evicted [default: 6s].",
        ),
    ),
    relay: bool | None = typer.Option(
        None,
        "--relay/--no-relay",
        help=_env_help(
            "relay",
            "Offer circuit-relay reservations, so nodes behind NAT become reachable through "
            "this one. Run it on a host with a public address (see docs/nat.md).",
        ),
        show_default=False,
    ),
    relay_reservations: int | None = typer.Option(
        None,
        "--relay-reservations",
        help=_env_help(
            "relay_reservations",
            "When this node is behind NAT: how many relays to hold a reservation on "
            "[default: 2].",
        ),
    ),
    hole_punch: bool | None = typer.Option(
        None,
        "--hole-punch/--no-hole-punch",
        help=_env_help(
            "hole_punch",
            "Try to upgrade relayed connections to direct ones (DCUtR) [default: on]. "
            "Turn off to keep traffic on relays, e.g. to measure or debug them.",
        ),
        show_default=False,
    ),
    log_level: str | None = typer.Option(
        None, "--log-level", help=_env_help("log_level", "Daemon log level [default: INFO].")
    ),
    config_file: Path | None = typer.Option(
        None,
        "--config",
        help="Config file [env: OTELA_CONFIG; default: "
        "$XDG_CONFIG_HOME/otela/config.toml]; see `otela init`.",
    ),
) -> None:
    """Run a node: join the mesh, replicate the registry, route requests, and optionally
    launch and supervise an engine, announcing it once healthy.

    Settings come from flags > OTELA_* environment > config file > defaults.

    Exits 0 after SIGTERM/SIGINT (drains, then announces LEFT), 2 on bad configuration, 3 if
    the engine fails (announces DOWN, copies its logs to the log sink).
    """
    import trio

    from otela.daemon import Node
    from otela.engine.command import EngineCommandError
    from otela.engine.health import check_reachable
    from otela.mesh.bootstrap import BootstrapAddressError

    given = {
        "process": process,
        "engine_url": engine_url,
        "model_meta": model_meta or None,
        "bootstrap": bootstrap or None,
        "provider_id": provider_id,
        "ingress": ingress,
        "home": str(home) if home is not None else None,
        "listen_host": host,
        "public_host": public_host,
        "http_port": http_port,
        "p2p_port": p2p_port,
        "ready_timeout": ready_timeout,
        "health_interval": health_interval,
        "health_failures": health_failures,
        "fatal_patterns": fatal_pattern or None,
        "log_sink": str(log_sink) if log_sink is not None else None,
        "drain_grace": drain_grace,
        "engine_stop_grace": engine_stop_grace,
        "slurm_drain_margin": slurm_drain_margin,
        "hw_cpus": cpus,
        "hw_memory_gb": memory_gb,
        "hw_gpus": gpus,
        "status_file": str(status_file) if status_file is not None else None,
        "log_level": log_level,
        "authority": authority,
        "certificate": str(certificate) if certificate is not None else None,
        "registry_retention": registry_retention,
        "registry_horizon": registry_horizon,
        "probe_interval": probe_interval,
        "suspicion_timeout": suspicion_timeout,
        "relay": relay,
        "relay_reservations": relay_reservations,
        "hole_punch": hole_punch,
    }
    try:
        flags = {k: v for k, v in given.items() if v is not None}
        config = resolve(flags, None, config_file).config
        _setup_logging(config.log_level)
        node = Node(config)
        if config.engine_url and not config.process:
            check_reachable(config.engine_url)
    except (ConfigError, EngineCommandError, BootstrapAddressError, ValueError) as exc:
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
def init(
    path: Path | None = typer.Option(
        None, "--path", help="Where to write [default: $XDG_CONFIG_HOME/otela/config.toml]."
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
def config_show(
    config_file: Path | None = typer.Option(
        None, "--config", help="Config file [env: OTELA_CONFIG]."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Print the effective configuration (file, OTELA_* environment and defaults; flags
    given to `otela start` come on top) and where each value came from."""
    import json

    from rich.console import Console
    from rich.table import Table

    from otela.config import SETTINGS, render_value

    try:
        resolved = resolve({}, None, config_file)
    except ConfigError as exc:
        typer.echo(f"otela: {exc}", err=True)
        raise typer.Exit(2) from None
    rows = [
        (s.section, s.key, getattr(resolved.config, s.attr), resolved.sources[s.attr], s.env)
        for s in SETTINGS
    ]
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "file": str(resolved.file),
                    "settings": {
                        f"{sec}.{key}": {"value": render_value(v), "source": src, "env": env}
                        for sec, key, v, src, env in rows
                    },
                },
                indent=2,
            )
        )
        return
    table = Table(title=f"effective configuration (file: {resolved.file})")
    for column in ("setting", "value", "source", "env"):
        table.add_column(column)
    for sec, key, value, source, env in rows:
        table.add_row(f"{sec}.{key}", render_value(value), source, env)
    Console(width=200).print(table)


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
    if engine == "echo":
        from otela.demo import run_demo

        raise typer.Exit(run_demo(requests_per_model=requests, timeout=timeout))
    if engine == "vllm":
        from otela.demo_vllm import run_vllm_demo

        raise typer.Exit(run_vllm_demo(vllm_python, requests=requests))
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


def _mount_optional_apps() -> None:
    from otela.membership.cli import app as membership_app

    app.add_typer(
        membership_app,
        name="membership",
        help="Membership authority: create it, sign and revoke node certificates.",
    )
    try:
        from simulator.cli import app as sim_app  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return
    app.add_typer(sim_app, name="sim", help="Roofline serving simulator: analyze and run.")
    from traces.cli import app as trace_app  # type: ignore[import-not-found,unused-ignore]

    app.add_typer(trace_app, name="trace", help="Request traces: gen, replay, analyze, compare.")


_mount_optional_apps()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
