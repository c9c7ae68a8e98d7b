"""Proxy benchmark: what otela's request path adds on top of an engine that costs nothing.

Layout on a 2-core machine (``taskset``): the mock engine (``mock_engine.py``, answers in
microseconds) and the load generator on core 1, every otela process on core 0. Paths:

- ``direct``: the load generator talks to the mock engine (the baseline);
- ``one-hop``: one node, ``otela start --ingress --engine-url <mock>``;
- ``two-hop``: an ingress node and a serving node fronting the mock engine (the
  federation's normal path: ingress -> node's engine hop -> engine), both on core 0;
- ``nginx`` and ``sglang-router``: references on the same core (when installed).

Every row shows its req/s at the highest concurrency as a share of direct's ("of direct"):
a router cannot pass more than the engine behind it answers, so a row near 100 % measures
the engine, not the router. ``--engine nginx`` puts a mock engine behind them that is
faster than anything measured through it (fixed answers at ~20 us of CPU each).

For each path: latency p50/p99 and req/s at c=1/16/64 (wrk, keep-alive, non-streaming chat
completions), otela's CPU time per request (from /proc, all otela processes), p99 at a
steady 50 req/s (an open-loop generator), and streaming time to first event at c=1 and
c=16. ``--idle-peers N`` also starts N idle nodes that join the ingress (a federation
gossiping around it). ``--keys none,sqlite,postgresql`` runs each otela path once per
mode: with a database the ingress runs the public ingress service (``--ingress-db``:
every request carries an API key with request and token limits, every answer is a usage
row). Prints a table; figures and the machine go in docs/performance.md.

``--prompt-bytes 200000`` measures every path with a 200 KB prompt instead of "hello"
(long prompts: what a proxy pays to read, parse or copy the body).

Run: ``python benchmarks/proxy.py [--duration 10] [--paths direct,one-hop,two-hop]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httptools
import trio

from otela.testing.localfed import LocalFederation, free_port, wait_for

HERE = Path(__file__).resolve().parent
MODEL = "mock"
BODY = b""  # the request every path is measured with (set_prompt)
STREAM_BODY = b""


def set_prompt(size: int) -> None:
    """The chat request's prompt: "hello", or ``size`` bytes of words (``--prompt-bytes``:
    long prompts, where a proxy that parses or copies the whole body pays for it)."""
    global BODY, STREAM_BODY
    prompt = "hello" if size <= 0 else ("hello world " * (size // 12 + 1))[:size]
    messages = [{"role": "user", "content": prompt}]
    BODY = json.dumps({"model": MODEL, "messages": messages}).encode()
    STREAM_BODY = json.dumps({"model": MODEL, "stream": True, "messages": messages}).encode()


set_prompt(0)
ROUTER_CORE, LOAD_CORE = "0", "1"
ADMIN_TOKEN = "proxy-benchmark-admin-token"
AUTH: dict[str, str] = {}  # the API key header every request carries (--keys)
QUIET = ["--log-level", "WARNING"]


def pinned(core: str, argv: list[str]) -> list[str]:
    return ["taskset", "-c", core, *argv] if shutil.which("taskset") else argv


# -- a minimal HTTP/1.1 client for the open-loop and streaming measurements --------------


class Exchange:
    """httptools callbacks for one response: when its first body byte came, and when done."""

    def __init__(self) -> None:
        self.first_body: float | None = None
        self.done = False
        self.head_of_body = b""

    def on_body(self, body: bytes) -> None:
        if self.first_body is None:
            self.first_body = time.perf_counter()
            self.head_of_body = body[:300]

    def on_message_complete(self) -> None:
        self.done = True


class Connection:
    def __init__(self, stream: trio.SocketStream, host: str) -> None:
        self.stream = stream
        self.host = host
        self.url = ""

    @classmethod
    async def open(cls, url: str) -> Connection:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        conn = cls(await trio.open_tcp_stream(host, int(port)), host)
        conn.url = url
        return conn

    async def post(self, path: str, body: bytes) -> tuple[float, float]:
        """``_post``, on a fresh connection if the server had closed this idle one."""
        try:
            return await self._post(path, body)
        except (ConnectionError, trio.BrokenResourceError):
            fresh = await Connection.open(self.url)
            self.stream, self.host = fresh.stream, fresh.host
            return await self._post(path, body)

    async def _post(self, path: str, body: bytes) -> tuple[float, float]:
        """Send one request; (seconds to the first body byte, seconds to the end)."""
        auth = "".join(f"{k}: {v}\r\n" for k, v in AUTH.items())
        head = (f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json"
                f"\r\n{auth}content-length: {len(body)}\r\n\r\n").encode()
        exchange = Exchange()
        parser = httptools.HttpResponseParser(exchange)
        start = time.perf_counter()
        await self.stream.send_all(head + body)
        while not exchange.done:
            data = await self.stream.receive_some(65536)
            if not data:
                raise ConnectionError("server closed the connection")
            parser.feed_data(data)
        if parser.get_status_code() != 200:
            raise RuntimeError(f"status {parser.get_status_code()}: {exchange.head_of_body!r}")
        end = time.perf_counter()
        return (exchange.first_body or end) - start, end - start


async def _steady(url: str, rate: float, seconds: float) -> list[float]:
    """Open loop: a request every 1/rate s whatever the answers do; latencies in seconds."""
    latencies: list[float] = []
    idle: list[Connection] = [await Connection.open(url) for _ in range(4)]

    async def one() -> None:
        conn = idle.pop() if idle else await Connection.open(url)
        _, total = await conn.post("/v1/chat/completions", BODY)
        latencies.append(total)
        idle.append(conn)

    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        for i in range(int(rate * seconds)):
            await trio.sleep_until(start + i / rate)
            nursery.start_soon(one)
    return latencies


async def _ttft(url: str, concurrency: int, seconds: float) -> list[float]:
    firsts: list[float] = []
    deadline = trio.current_time() + seconds

    async def worker() -> None:
        conn = await Connection.open(url)
        while trio.current_time() < deadline:
            first, _ = await conn.post("/v1/chat/completions", STREAM_BODY)
            firsts.append(first)

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    return firsts


# -- wrk ----------------------------------------------------------------------------------

def wrk_script(headers: dict[str, str]) -> str:
    return ('wrk.method = "POST"\n'
            'wrk.headers["Content-Type"] = "application/json"\n'
            + "".join(f'wrk.headers["{k}"] = "{v}"\n' for k, v in headers.items())
            + f"wrk.body = '{BODY.decode()}'\n")


@contextlib.contextmanager
def _database(keys: str, workdir: Path, name: str) -> Iterator[str | None]:
    """The ingress database for ``--keys`` mode ``keys`` (``None``: no ingress service)."""
    if keys == "none":
        yield None
    elif keys == "sqlite":
        yield str(workdir / f"{name}.db")
    elif keys == "postgresql":
        from otela.testing.localpg import create_database, local_postgres
        with local_postgres() as server:
            yield create_database(server, name.replace("-", "_"))
    else:
        raise SystemExit(f"--keys: unknown mode {keys!r} (none, sqlite, postgresql)")


def _api_key(url: str) -> str:
    """A key with limits far above what the benchmark sends (so the checks run, never
    refuse)."""
    import httpx
    made = httpx.post(f"{url}/v1/admin/keys", trust_env=False, timeout=10,
                      headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
                      json={"owner": "benchmark", "rpm": 10**9, "tpm": 10**12,
                            "max_concurrent": 10_000, "budget_tokens": 10**15})
    made.raise_for_status()
    return str(made.json()["key"])


@dataclass
class WrkResult:
    rps: float
    requests: int
    p50_ms: float
    p99_ms: float


def _ms(text: str) -> float:
    match = re.match(r"([\d.]+)(us|ms|s|m)$", text)
    if match is None:
        raise ValueError(f"unexpected wrk latency {text!r}")
    value, unit = match.groups()
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}[unit]


def _field(pattern: str, text: str) -> str:
    match = re.search(pattern, text)
    if match is None:
        raise ValueError(pattern)
    return match.group(1)


def wrk(url: str, connections: int, seconds: float, script: Path) -> WrkResult:
    out = subprocess.run(
        pinned(LOAD_CORE, ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s",
                           "--latency", "-s", str(script), f"{url}/v1/chat/completions"]),
        capture_output=True, text=True, check=True).stdout
    try:
        rps = float(_field(r"Requests/sec:\s+([\d.]+)", out))
        requests = int(_field(r"(\d+) requests in", out))
        # Anchored: "75.99%" in the thread stats must not pass for the 99th percentile.
        p50 = _ms(_field(r"(?m)^\s+50%\s+(\S+)", out))
        p99 = _ms(_field(r"(?m)^\s+99%\s+(\S+)", out))
    except ValueError:
        raise RuntimeError(f"could not read wrk's output:\n{out}") from None
    if "Non-2xx" in out or "Socket errors" in out:
        print(f"  wrk reported errors against {url}:\n{out}", file=sys.stderr)
    return WrkResult(rps, requests, p50, p99)


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
    return total / os.sysconf("SC_CLK_TCK")


@dataclass
class PathResult:
    name: str
    by_concurrency: dict[int, WrkResult] = field(default_factory=dict)
    cpu_us: float | None = None
    steady_p99_ms: float = 0.0
    ttft_ms: dict[int, float] = field(default_factory=dict)


def measure(name: str, url: str, pids: list[int], args: argparse.Namespace,
            script: Path) -> PathResult:
    result = PathResult(name)
    wrk(url, 8, 2, script)  # warm up: connections, caches
    for concurrency in args.concurrency:
        before = cpu_seconds(pids) if pids else 0.0
        run = wrk(url, concurrency, args.duration, script)
        if pids and concurrency == max(args.concurrency):
            result.cpu_us = (cpu_seconds(pids) - before) / run.requests * 1e6
        result.by_concurrency[concurrency] = run
        print(f"  {name} c={concurrency}: {run.rps:,.0f} req/s, p50 {run.p50_ms:.3f} ms, "
              f"p99 {run.p99_ms:.3f} ms", file=sys.stderr)
    steady = trio.run(_steady, url, 50.0, args.steady_seconds)
    result.steady_p99_ms = statistics.quantiles(steady, n=100)[98] * 1e3
    for concurrency in (1, 16):
        firsts = trio.run(_ttft, url, concurrency, args.duration / 2)
        result.ttft_ms[concurrency] = statistics.median(firsts) * 1e3
    print(f"  {name}: steady 50 req/s p99 {result.steady_p99_ms:.2f} ms, TTFT p50 "
          f"{result.ttft_ms[1]:.3f} ms (c=1), {result.ttft_ms[16]:.3f} ms (c=16)",
          file=sys.stderr)
    return result


def report(results: list[PathResult], concurrency: list[int]) -> None:
    direct = next((r for r in results if r.name == "direct"), None)
    top = max(concurrency)
    print(f"\n{'path':<10} {'added p50 c=1':>14} " + " ".join(
        f"{'req/s c=' + str(c):>12}" for c in concurrency)
        + f" {'of direct':>9} {'CPU/req':>9} {'p99@50/s':>9} {'TTFT c=1':>9} {'TTFT c=16':>10}")
    for r in results:
        base = direct.by_concurrency[1].p50_ms if direct and 1 in r.by_concurrency else 0.0
        added = r.by_concurrency[1].p50_ms - base if 1 in r.by_concurrency else float("nan")
        cpu = f"{r.cpu_us:.0f} us" if r.cpu_us is not None else "-"
        # direct's ceiling beside every row: a router's req/s is bounded by the engine's
        share = (f"{r.by_concurrency[top].rps / direct.by_concurrency[top].rps:>9.0%}"
                 if direct is not None and top in direct.by_concurrency else f"{'-':>9}")
        print(f"{r.name:<10} {added:>11.3f} ms " + " ".join(
            f"{r.by_concurrency[c].rps:>12,.0f}" for c in concurrency)
            + f" {share} {cpu:>9} {r.steady_p99_ms:>6.2f} ms {r.ttft_ms[1]:>6.3f} ms"
            f" {r.ttft_ms[16]:>7.3f} ms")


def _catalog(url: str) -> list[dict[str, object]]:
    """``/v1/models`` as anyone sees it (no credential: an older otela, run with
    ``--otela-src``, took the admin token for a wrong API key there)."""
    answer = subprocess.run(["curl", "-sf", f"{url}/v1/models"], capture_output=True,
                            text=True)
    if answer.returncode != 0:
        return []
    data: list[dict[str, object]] = json.loads(answer.stdout).get("data", [])
    return data


def _with_children(pids: list[int]) -> list[int]:
    """The processes and their direct children (data-path workers; not engines here)."""
    out = list(pids)
    for pid in pids:
        with contextlib.suppress(OSError):
            out += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return out


MODELS_JSON = json.dumps({"object": "list", "data": [
    {"id": MODEL, "object": "model", "owned_by": "mock", "max_model_len": 4096}]})
ANSWER_JSON = json.dumps({"id": "chatcmpl-mock", "object": "chat.completion", "model": MODEL,
                          "choices": [{"index": 0, "finish_reason": "stop", "message": {
                              "role": "assistant", "content": "mock answer"}}]})
NGINX_ENGINE_CONF = """worker_processes 1;
pid {dir}/engine.pid;
error_log stderr warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    default_type application/json;
    server {{
        listen 127.0.0.1:{port};
        location = /v1/models {{ return 200 '{models}'; }}
        location / {{ return 200 '{answer}'; }}
    }}
}}
"""
NGINX_CONF = """worker_processes 1;
pid {dir}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    upstream engine {{ server 127.0.0.1:{upstream}; keepalive 128; }}
    # bodies up to 1 MiB stay in memory (the default, 16 KiB, sends a long prompt through
    # a temporary file: +7 ms at 200 KB, not what a tuned proxy pays)
    client_body_buffer_size 1m;
    client_max_body_size 64m;
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""


@contextlib.contextmanager
def sglang_router(binary: str, upstream: int
                  ) -> Iterator[tuple[str, Callable[[], list[int]]]]:
    """sglang-router (SGLang's Rust router, PyPI ``sglang-router``) in front of the engine,
    on the router's core: a second reference, a router built for LLM serving."""
    port = free_port()
    process = subprocess.Popen(
        pinned(ROUTER_CORE, [binary, "launch", "--host", "127.0.0.1", "--port", str(port),
                             "--worker-urls", f"http://127.0.0.1:{upstream}",
                             "--policy", "round_robin", "--log-level", "error"]),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: subprocess.run(
            ["curl", "-sf", "-X", "POST", "-H", "content-type: application/json", "-d",
             json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
             f"http://127.0.0.1:{port}/v1/chat/completions"],
            capture_output=True).returncode == 0, 30, "sglang-router")
        yield f"http://127.0.0.1:{port}", lambda: _with_children([process.pid])
    finally:
        process.terminate()
        process.wait(10)


@contextlib.contextmanager
def nginx_proxy(workdir: Path, upstream: int) -> Iterator[tuple[str, Callable[[], list[int]]]]:
    """nginx as a reverse proxy in front of the engine, on the router's core: the baseline
    for what a proxy hop costs."""
    port = free_port()
    conf = workdir / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=workdir, upstream=upstream, port=port))
    process = subprocess.Popen(pinned(ROUTER_CORE, ["nginx", "-c", str(conf), "-p",
                                                    str(workdir), "-g", "daemon off;"]))
    try:
        wait_for(lambda: subprocess.run(["curl", "-sf", f"http://127.0.0.1:{port}/health"],
                                        capture_output=True).returncode == 0, 10, "nginx")
        yield f"http://127.0.0.1:{port}", lambda: _with_children([process.pid])
    finally:
        process.terminate()
        process.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per wrk run")
    parser.add_argument("--steady-seconds", type=float, default=20.0)
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 16, 64])
    parser.add_argument("--paths", default="direct,nginx,sglang-router,one-hop,two-hop",
                        help="direct, nginx (a reverse proxy baseline, if installed), "
                        "sglang-router (SGLang's Rust router, if installed: --sglang-router), "
                        "one-hop, two-hop")
    parser.add_argument("--engine", choices=["python", "nginx"], default="python",
                        help="the mock engine: python (mock_engine.py, streams real SSE) or "
                        "nginx (fixed JSON answers at a fraction of the CPU, leaving more of "
                        "the machine to the router; TTFT then means first byte of JSON)")
    parser.add_argument("--workers", type=int, default=1,
                        help="otela --workers for the one-hop node; above 1 it may use both "
                        "cores (the load generator and engine share core 1)")
    parser.add_argument("--idle-peers", type=int, default=0,
                        help="idle nodes joined to the ingress (gossip around it)")
    parser.add_argument("--keys", default="none",
                        help="comma-separated: none, sqlite, postgresql: run the otela paths "
                        "without the ingress service and/or with it on that database")
    parser.add_argument("--prompt-bytes", type=int, default=0,
                        help="long-prompt mode: a prompt of this many bytes (e.g. 200000) "
                        "instead of 'hello'")
    parser.add_argument("--otela-src", type=Path, default=None,
                        help="run the otela nodes from this source tree (e.g. a worktree of "
                        "an older commit, to compare)")
    parser.add_argument("--sglang-router", default=os.environ.get(
                            "OTELA_BENCH_SGLANG_ROUTER", shutil.which("sglang-router")),
                        help="the sglang-router executable (pip install sglang-router, "
                        "best in a venv of its own); default: $OTELA_BENCH_SGLANG_ROUTER or "
                        "the PATH's")
    args = parser.parse_args()
    set_prompt(args.prompt_bytes)
    if not shutil.which("wrk"):
        sys.exit("wrk is not installed (apt-get install wrk)")
    paths = args.paths.split(",")
    workdir = Path(tempfile.mkdtemp(prefix="otela-proxy-bench-"))
    script = workdir / "post.lua"
    port = free_port()
    if args.engine == "nginx":
        conf = workdir / "engine.conf"
        conf.write_text(NGINX_ENGINE_CONF.format(dir=workdir, port=port, models=MODELS_JSON,
                                                 answer=ANSWER_JSON))
        mock = subprocess.Popen(pinned(LOAD_CORE, ["nginx", "-c", str(conf), "-p",
                                                   str(workdir), "-g", "daemon off;"]))
    else:
        mock = subprocess.Popen(
            pinned(LOAD_CORE, [sys.executable, str(HERE / "mock_engine.py"), "--port",
                               str(port), "--model", MODEL]),
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    mock_url = f"http://127.0.0.1:{port}"
    launcher = pinned(ROUTER_CORE, [sys.executable, "-m", "otela"])
    if args.otela_src is not None:
        # The nodes' otela. PYTHONSAFEPATH too: ``python -m otela`` otherwise puts its
        # working directory (this checkout's root, where LocalFederation starts nodes)
        # ahead of PYTHONPATH, and every node ran this checkout's code, not OTELA_SRC's.
        os.environ["PYTHONPATH"] = str(args.otela_src.resolve())
        os.environ["PYTHONSAFEPATH"] = "1"
    results: list[PathResult] = []
    try:
        wait_for(lambda: subprocess.run(["curl", "-sf", f"{mock_url}/health"],
                                        capture_output=True).returncode == 0, 10, "mock")
        script.write_text(wrk_script({}))
        if "direct" in paths:
            results.append(measure("direct", mock_url, [], args, script))
        if "nginx" in paths and shutil.which("nginx"):
            with nginx_proxy(workdir, port) as (nginx_url, nginx_pids):
                results.append(measure("nginx", nginx_url, nginx_pids(), args, script))
        if "sglang-router" in paths and args.sglang_router:
            with sglang_router(args.sglang_router, port) as (router_url, router_pids):
                results.append(measure("sglang-rtr", router_url, router_pids(), args, script))
        for name, keys in [(n, k) for k in args.keys.split(",") for n in ("one-hop", "two-hop")]:
            if name not in paths:
                continue
            with LocalFederation(workdir / f"{name}-{keys}") as fed, \
                    _database(keys, workdir, name) as db:
                service = [] if db is None else ["--ingress-db", db]
                env = {"OTELA_ADMIN_TOKEN": ADMIN_TOKEN}
                if name == "one-hop":
                    workers = ["--workers", str(args.workers)] if args.workers > 1 else []
                    ingress = fed.start_node(
                        "ingress", ingress=True,
                        launcher=launcher if args.workers == 1 else pinned(
                            "0,1", [sys.executable, "-m", "otela"]),
                        extra_args=["--engine-url", mock_url, *workers, *service, *QUIET],
                        extra_env=env)
                    nodes = [ingress]
                else:
                    ingress = fed.start_node("ingress", ingress=True, launcher=launcher,
                                             extra_args=[*service, *QUIET], extra_env=env)
                    server = fed.start_node("server", bootstrap=[ingress], launcher=launcher,
                                            extra_args=["--engine-url", mock_url, *QUIET])
                    nodes = [ingress, server]
                for i in range(args.idle_peers):
                    fed.start_node(f"idle{i}", bootstrap=[ingress], extra_args=QUIET,
                                   launcher=pinned(LOAD_CORE, [sys.executable, "-m", "otela"]))
                wait_for(lambda ingress=ingress: any(
                    m["id"] == MODEL for m in _catalog(ingress.http_url)), 60,
                    "the model to be served")
                label = name if args.workers == 1 else f"{name} x{args.workers}"
                AUTH.clear()
                if db is not None:
                    AUTH["authorization"] = f"Bearer {_api_key(ingress.http_url)}"
                    label += f" keys/{keys}"
                script.write_text(wrk_script(AUTH))
                results.append(measure(label, ingress.http_url,
                                       _with_children([n.process.pid for n in nodes]), args,
                                       script))
                AUTH.clear()
    finally:
        mock.terminate()
        mock.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)
    report(results, args.concurrency)


if __name__ == "__main__":
    main()
