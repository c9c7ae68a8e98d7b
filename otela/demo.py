"""``otela demo``: a whole federation on this machine, driven by the official openai client.

One ingress/bootstrap node and three serving nodes, each a separate OS process wrapping
the echo engine (two serve the same model, from different providers). The ingress runs the
public ingress service on a SQLite file: the demo creates an API key through the admin
API, every request carries it, and the usage the ingress counted is printed at the end.
Requests go through the ingress only; the response headers say which node served each one.
"""

from __future__ import annotations

import secrets
import signal
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
from openai import OpenAI
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from otela.console import make_console
from otela.testing.localfed import (
    FederationError,
    LocalFederation,
    LocalNode,
    echo_engine_command,
    free_port,
    wait_for,
)

SERVING_NODES = [  # (name, provider, model)
    ("node-a", "lab-alpha", "echo-small"),
    ("node-b", "lab-beta", "echo-small"),
    ("node-c", "lab-gamma", "echo-large"),
]


def run_demo(requests_per_model: int = 6, timeout: float = 60.0) -> int:
    console = make_console()
    # Entered, the federation turns a SIGTERM (``timeout``, ``kill``, a job scheduler) into
    # SystemExit, so the ``finally`` below stops the nodes instead of leaving them running.
    with tempfile.TemporaryDirectory(prefix="otela-demo-") as tmp, \
            LocalFederation(Path(tmp)) as federation:
        try:
            _run(console, federation, requests_per_model, timeout)
            return 0
        except KeyboardInterrupt:
            console.print("[yellow]interrupted: shutting the federation down[/]")
            return 130
        except SystemExit:
            console.print("[yellow]terminated: shutting the federation down[/]")
            raise
        except FederationError as exc:
            console.print(f"[red]demo failed:[/] {exc}")
            for node in federation.nodes:
                console.print(f"[dim]--- {node.name} log ---\n{node.log_tail(15)}[/]")
            return 1
        finally:
            with _ignoring_sigint():  # a second Ctrl-C must not cut the clean shutdown short
                codes = _shutdown(console, federation)
            if codes and any(code != 0 for code in codes.values()):
                console.print(f"[red]unclean exits:[/] {codes}")


def _run(console: Console, federation: LocalFederation, n_requests: int, timeout: float) -> None:
    admin_token = secrets.token_urlsafe(24)
    with console.status("starting the ingress node"):
        ingress = federation.start_node(
            "ingress", ingress=True, provider_id="demo-ingress",
            extra_args=["--ingress-db", str(federation.root / "ingress.db")],
            extra_env={"OTELA_ADMIN_TOKEN": admin_token})
    console.print(f"ingress  [bold]{ingress.http_url}[/]  {ingress.multiaddr}")
    console.print(f"dashboard [bold]{ingress.http_url}/ui[/]  (admin token for this run: "
                  f"{admin_token})")
    nodes: dict[str, LocalNode] = {}
    with console.status("starting serving nodes (each wraps an echo engine)"), \
            federation.together():
        for name, provider, model in SERVING_NODES:
            command = echo_engine_command(free_port(), [model], "--token-delay", "0.05")
            nodes[name] = federation.start_node(
                name, bootstrap=[ingress], process=command, provider_id=provider
            )
    with console.status("waiting until the ingress sees every node SERVING"):
        started = time.monotonic()
        wait_for(lambda: _all_serving(ingress, list(nodes.values())), timeout, "all nodes SERVING")
    console.print(f"federation converged in {time.monotonic() - started:.1f}s")
    _print_registry(console, ingress)

    names = {node.session_id: name for name, node in nodes.items()}
    admin = httpx.Client(base_url=f"{ingress.http_url}/v1/admin", trust_env=False, timeout=10,
                         headers={"authorization": f"Bearer {admin_token}"})
    key = admin.post("/keys", json={"owner": "demo", "name": "otela demo", "rpm": 600}).json()
    console.print(f"API key {key['id']} created for 'demo' (secret shown once: "
                  f"{key['key'][:12]}...)")
    client = OpenAI(base_url=f"{ingress.http_url}/v1", api_key=key["key"], max_retries=0)
    console.print(f"models via the ingress: {[m.id for m in client.models.list().data]}")
    served: Counter[str] = Counter()
    for i in range(n_requests):
        for model in ("echo-small", "echo-large"):
            raw = client.chat.completions.with_raw_response.create(
                model=model, messages=[{"role": "user", "content": f"hello federation #{i}"}]
            )
            reply = raw.parse()
            who = names.get(raw.headers.get("x-otela-session-id", ""), "?")
            served[who] += 1
            console.print(
                f"  {model:<11} -> {who} ({raw.headers.get('x-otela-provider-id')}): "
                f"{reply.choices[0].message.content!r}"
            )

    console.print("streaming through the ingress:")
    raw_stream = client.chat.completions.with_raw_response.create(
        model="echo-small",
        stream=True,
        messages=[{"role": "user", "content": "tokens arrive one by one over SSE"}],
    )
    who = names.get(raw_stream.headers.get("x-otela-session-id", ""), "?")
    console.print(f"  echo-small  -> {who}: ", end="")
    chunks = 0
    for chunk in raw_stream.parse():
        if chunk.choices and chunk.choices[0].delta.content:
            chunks += 1
            console.print(chunk.choices[0].delta.content, end="")
    console.print(f"  [dim]({chunks} chunks)[/]")
    served[who] += 1

    table = Table(title="requests served per node")
    table.add_column("node")
    table.add_column("provider")
    table.add_column("model")
    table.add_column("requests", justify="right")
    for name, provider, model in SERVING_NODES:
        table.add_row(name, provider, model, str(served[name]))
    console.print(table)
    peers = {node.status["peer_id"]: name for name, node in nodes.items()}
    _print_usage(console, admin, sum(served.values()), peers)


def _print_usage(console: Console, admin: httpx.Client, requests: int,
                 names: dict[str, str]) -> None:
    """What the ingress service counted for the demo's key, per serving node."""
    wait_for(lambda: sum(r["requests"] for r in admin.get("/usage", params={"by": "key"})
                         .json()["data"]) >= requests, 10, "the usage rows")
    rows = admin.get("/usage", params={"by": "node"}).json()["data"]
    table = Table(title="usage counted by the ingress service (otela usage --by node)")
    for column in ("node", "requests", "prompt tokens", "completion tokens", "mean latency"):
        table.add_column(column, justify="left" if column == "node" else "right")
    for row in rows:
        table.add_row(names.get(row["group"], row["group"] or "-"), str(row["requests"]),
                      str(row["prompt_tokens"]), str(row["completion_tokens"]),
                      f"{row['mean_latency_ms']:.1f} ms")
    console.print(table)


def _all_serving(ingress: LocalNode, nodes: list[LocalNode]) -> bool:
    states = ingress.states()
    return all(states.get(node.session_id) == "SERVING" for node in nodes)


def _print_registry(console: Console, ingress: LocalNode) -> None:
    table = Table(title=f"registry replica on the ingress ({ingress.http_url}/v1/registry/nodes)")
    for column in ("session", "provider", "state", "version", "models", "http"):
        table.add_column(column)
    for node in ingress.nodes():
        table.add_row(
            node["session_id"][:8],
            escape(node["provider_id"]),  # what members say about themselves: as written
            node.get("display_state", node["state"]),
            str(node["version"]),
            escape(", ".join(m["id"] for m in node["models"]) or "-"),
            escape(node["http_url"]),
        )
    console.print(table)


def _shutdown(console: Console, federation: LocalFederation) -> dict[str, int]:
    if not federation.nodes:
        return {}
    with console.status("stopping nodes (each announces LEFT)"):
        codes = {node.name: federation.stop_node(node) for node in reversed(federation.nodes)}
    console.print(f"stopped {len(codes)} nodes: exit codes {codes}")
    return codes


class _ignoring_sigint:
    def __enter__(self) -> None:
        self._previous = signal.signal(signal.SIGINT, signal.SIG_IGN)

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)
