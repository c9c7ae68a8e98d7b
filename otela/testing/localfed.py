"""Launch and observe a federation of otela nodes on this machine, as separate OS processes.

Used by ``otela demo`` and by the integration tests: both need to start nodes (each
with its own home, ports picked by the OS, optionally wrapping an echo engine), wait
for conditions the nodes report over HTTP, and stop everything, even on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

T = TypeVar("T")


class FederationError(RuntimeError):
    """A node failed to start or a condition was not met in time."""


def free_port() -> int:
    """A TCP port free right now (for engines, whose command line must name a port).

    Drawn below the kernel's ephemeral range: nodes bind port 0, which the kernel fills from
    that range, and a port picked there could be taken by a node starting beside us between
    this pick and the engine's bind (an engine once failed to start because a node got its
    port as its HTTP port, and the node's health check then reached the other node)."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(10000, low) if low > 10000 else 0
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    with socket.socket() as sock:  # nothing free below the range: let the kernel choose
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux default 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def echo_engine_command(port: int, models: list[str], *extra: str) -> str:
    args = [sys.executable, "-m", "otela.engine.demo.echo", "--port", str(port)]
    for model in models:
        args += ["--model", model]
    return shlex.join([*args, *extra])


# The vLLM CPU build lives in its own virtual environment (scripts/setup-vllm).
PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the checkout (otela/testing/ is two down)
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}


@functools.cache
def http_client() -> httpx.Client:
    """One client for every LocalNode request. ``httpx.get`` builds a client, and with it
    an SSL context (loading the CA bundle), on every call: 25-60 ms of CPU against 0.4 ms
    on a shared client. A benchmark asking 128 nodes one question each burned seconds of
    CPU that way, on the 2 cores the federation shares. No keep-alive: nodes stop and
    restart under tests, and a fresh connection on 127.0.0.1 costs nothing next to that."""
    return httpx.Client(trust_env=False, limits=httpx.Limits(max_keepalive_connections=0))


def vllm_python(explicit: Path | None = None) -> Path:
    """The interpreter that has vLLM: ``explicit``, ``$OTELA_VLLM_PYTHON`` or .venv-vllm."""
    candidate = explicit or Path(
        os.environ.get("OTELA_VLLM_PYTHON") or PROJECT_ROOT / ".venv-vllm" / "bin" / "python"
    )
    if not candidate.exists():
        raise FederationError(
            f"no vLLM interpreter at {candidate}: run scripts/setup-vllm (or set OTELA_VLLM_PYTHON)"
        )
    return candidate


def build_tiny_model(python: Path, target: Path, *extra: str) -> Path:
    """Build the tiny random-weight Llama (``otela.engine.demo.tiny_model``, ``extra``: its
    options) with ``python``."""
    result = subprocess.run(
        [str(python), "-m", "otela.engine.demo.tiny_model", str(target), *extra],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
    )
    if result.returncode != 0:
        raise FederationError(f"building the tiny model failed:\n{result.stderr[-2000:]}")
    return target


def vllm_engine_command(python: Path, model_dir: Path, name: str, port: int,
                        *extra: str) -> str:
    """The real vLLM OpenAI server, sized for a CPU (see docs/engines.md).

    ``--enforce-eager``: on CPU vLLM otherwise compiles the model with TorchInductor at
    start (C++ kernels through the system compiler), ~35 s of a ~95 s start on 2 cores for
    a tiny model that then runs no faster (20-token chat: ~230 ms compiled, ~175 ms eager).
    """
    return shlex.join(
        [
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--served-model-name",
            name,
            "--port",
            str(port),
            "--dtype",
            "bfloat16",
            "--max-model-len",
            "512",
            "--gpu-memory-utilization",
            "0.3",
            "--enforce-eager",
            *extra,
        ]
    )


@dataclass
class LocalNode:
    name: str
    home: Path
    process: subprocess.Popen[bytes]
    status: dict[str, Any] = field(default_factory=dict)
    # Sent with the inspection calls below: a node running the ingress service shows its
    # registry, network and full health to key holders and the admin only
    # (docs/security.md); ``start_node`` sets the admin token it gave the node.
    authorization: str | None = None

    def _headers(self) -> dict[str, str]:
        return {} if self.authorization is None else {"authorization": self.authorization}

    @property
    def http_url(self) -> str:
        return str(self._started()["http_url"])

    @property
    def multiaddr(self) -> str:
        return str(self._started()["addrs"][0])

    @property
    def session_id(self) -> str:
        return str(self._started()["session_id"])

    def _started(self) -> dict[str, Any]:
        if not self.status:
            raise FederationError(f"node {self.name} has not been seen listening yet (started "
                                  "with wait=False, or inside the same together() block)")
        return self.status

    @property
    def log_path(self) -> Path:
        return self.home / "node.log"

    def get(self, path: str, timeout: float = 5.0) -> Any:
        response = http_client().get(f"{self.http_url}{path}", timeout=timeout,
                                     headers=self._headers())
        response.raise_for_status()
        return response.json()

    def nodes(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Every entry of this node's registry replica (``/v1/registry/nodes``, page by
        page)."""
        return registry_nodes(self.http_url, timeout, self.authorization)

    def states(self) -> dict[str, str]:
        """session id -> lifecycle state, as this node's registry replica says."""
        return {n["session_id"]: n["state"] for n in self.nodes()}

    def entry(self, session_id: str, timeout: float = 5.0) -> dict[str, Any] | None:
        """One session's registry entry as this node's replica holds it, or None if it
        does not know the session (yet): cheaper to poll than the whole listing."""
        response = http_client().get(f"{self.http_url}/v1/registry/nodes/{session_id}",
                                     timeout=timeout, headers=self._headers())
        if response.status_code == 404:
            return None
        response.raise_for_status()
        entry: dict[str, Any] = response.json()
        return entry

    def engine_pids(self) -> list[int]:
        """PIDs of this node's engine process group (its direct children)."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        try:
            return [int(p) for p in children.read_text().split()]
        except OSError:
            return []

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def registry_nodes(base_url: str, timeout: float = 5.0, authorization: str | None = None
                   ) -> list[dict[str, Any]]:
    """Every entry of the registry replica at ``base_url``, following
    ``/v1/registry/nodes``' pages (sending ``authorization``, where given)."""
    headers = {} if authorization is None else {"authorization": authorization}
    nodes: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        params: dict[str, str | int] = {"limit": 1000}
        if after:
            params["after"] = after
        response = http_client().get(f"{base_url.rstrip('/')}/v1/registry/nodes",
                                     timeout=timeout, params=params, headers=headers)
        response.raise_for_status()
        page = response.json()
        nodes += page["nodes"]
        after = page.get("next_after")
        if not after:
            return nodes


def wait_for(
    condition: Callable[[], T | None], timeout: float, what: str, interval: float = 0.1
) -> T:
    """Poll ``condition`` until it returns something truthy; raise after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = condition()
            if result:
                return result
        except (httpx.HTTPError, OSError, ValueError, KeyError) as exc:
            last_error = exc
        time.sleep(interval)
    detail = f" (last error: {last_error})" if last_error else ""
    raise FederationError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


class LocalFederation:
    """Nodes under one temporary directory; ``close()`` stops them all."""

    def __init__(self, root: Path, python: str = sys.executable) -> None:
        self.root = root
        self.python = python
        self.nodes: list[LocalNode] = []
        self._starting: list[tuple[LocalNode, float]] | None = None  # inside together()

    @contextlib.contextmanager
    def together(self) -> Iterator[None]:
        """Start the nodes started inside the block side by side: ``start_node`` returns at
        once, and the block's end waits until every one is listening. A node's start is
        mostly interpreter and import work (~3 s of CPU here), so starting one at a time
        left the other cores idle; a node started inside cannot yet be another's
        bootstrap peer."""
        if self._starting is not None:
            raise RuntimeError("together() blocks do not nest")
        self._starting = []
        try:
            yield
            starting = self._starting
        finally:
            self._starting = None
        for node, timeout in starting:
            self.wait_started(node, node.home / "status.json", timeout)

    def __enter__(self) -> LocalFederation:
        # A SIGTERM (``timeout``, a job scheduler, ``kill``) ends Python without unwinding,
        # and every node would outlive the script: turned into SystemExit, it runs
        # ``__exit__`` and stops them. Only where nobody handles SIGTERM yet, and only from
        # the main thread (where Python runs signal handlers).
        self._previous_sigterm: Any = None
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):
            self._previous_sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        finally:
            if self._previous_sigterm is not None:
                signal.signal(signal.SIGTERM, self._previous_sigterm)

    def start_node(
        self,
        name: str,
        *,
        bootstrap: list[LocalNode] | None = None,
        process: str | None = None,
        provider_id: str | None = None,
        ingress: bool = False,
        extra_args: list[str] | None = None,
        extra_env: dict[str, str] | None = None,
        wait: bool = True,
        timeout: float = 30.0,
        host: str = "127.0.0.1",
        netns: str | None = None,
        p2p_port: int = 0,
        launcher: list[str] | None = None,
    ) -> LocalNode:
        """Start ``otela start`` as its own process (inside network namespace ``netns``,
        listening on ``host``, when given) and, with ``wait``, until it is listening.
        ``launcher`` replaces ``python -m otela`` (benchmarks wrap the CLI)."""
        home = self.root / name
        home.mkdir(parents=True, exist_ok=True)
        status_file = home / "status.json"
        status_file.unlink(missing_ok=True)
        argv = [
            *(launcher or [self.python, "-m", "otela"]),
            "start",
            "--home",
            str(home),
            "--host",
            host,
            "--http-port",
            "0",
            "--p2p-port",
            str(p2p_port),
            "--status-file",
            str(status_file),
        ]
        for peer in bootstrap or []:
            argv += ["--bootstrap", peer.multiaddr]
        if process:
            argv += ["--process", process]
        if provider_id:
            argv += ["--provider-id", provider_id]
        if ingress:
            argv.append("--ingress")
        argv += extra_args or []
        if netns is not None:  # `ip netns exec` execs in place: same pid, same signals
            argv = ["ip", "netns", "exec", netns, *argv]
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTELA_")}
        # Nodes never read the developer's own config file.
        env["XDG_CONFIG_HOME"] = str(self.root / "xdg-config")
        env.update(extra_env or {})
        with open(home / "node.log", "ab") as log:
            # A session of its own: a terminal's Ctrl-C reaches only the driver, which then
            # stops each node with exactly one SIGTERM (a second signal forces a node out).
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        admin = env.get("OTELA_ADMIN_TOKEN")
        node = LocalNode(name=name, home=home, process=proc,
                         authorization=None if not admin else f"Bearer {admin}")
        self.nodes.append(node)
        if self._starting is not None:
            self._starting.append((node, timeout))
        elif wait:
            self.wait_started(node, status_file, timeout)
        return node

    def wait_started(self, node: LocalNode, status_file: Path, timeout: float) -> None:
        def started() -> dict[str, Any] | None:
            if node.process.poll() is not None:
                raise FederationError(
                    f"node {node.name} exited with {node.process.returncode}:\n{node.log_tail()}"
                )
            return json.loads(status_file.read_text()) if status_file.exists() else None

        node.status = wait_for(started, timeout, f"node {node.name} to start")

    def stop_node(
        self,
        node: LocalNode,
        sig: int = signal.SIGTERM,
        timeout: float = 20.0,
        signal_it: bool = True,
    ) -> int:
        # Exactly one signal: a second one tells a draining node to exit at once.
        if signal_it and node.process.poll() is None:
            node.process.send_signal(sig)
        try:
            return node.process.wait(timeout)
        except subprocess.TimeoutExpired:
            node.process.kill()
            return node.process.wait()

    def close(self) -> None:
        for node in self.nodes:
            if node.process.poll() is None:
                node.process.send_signal(signal.SIGTERM)
        for node in self.nodes:
            self.stop_node(node, signal_it=False)
