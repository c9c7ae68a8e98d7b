"""Fuzz one live node's HTTP routes for longer than the test suite does (docs/security.md).

    .venv/bin/python -m benchmarks.fuzz [--examples 5000] [--workers N] [--only inference]

Starts one ``otela start`` node (``tests/integration/http_fuzz.start_node``: an ingress
serving an echo model itself, with the ingress service, an API key and an admin token,
opted in to assignments from a planner key this script holds), runs every fuzzer of
``tests/integration/http_fuzz.py`` with ``--examples`` Hypothesis examples each, and
prints JSON: requests per fuzzer and their status counts, seconds, the node's resident
memory before and after, whether it still serves, and any traceback in its or its
engine's log. Exits 1 on a failure (a 5xx of the node's own making, an error that is not
an OpenAI body, a dead node or a traceback), printing the failing request.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from otela.testing.http_fuzz import FUZZERS, start_node, traceback_in
from otela.testing.localfed import LocalFederation, LocalNode

MODEL = "echo-fuzz"


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def tracebacks(node: LocalNode) -> list[str]:
    logs = (node.log_path, node.home / "logs" / "engine.log")
    return [f"{log.name}: {traceback_in(log)}" for log in logs if traceback_in(log)]


def serves(node: LocalNode) -> bool:
    import httpx

    body = {"model": MODEL, "messages": [{"role": "user", "content": "still here?"}]}
    response = httpx.post(f"{node.http_url}/v1/chat/completions", json=body, timeout=30,
                          trust_env=False)
    return response.status_code == 200


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=5000, help="examples per fuzzer")
    parser.add_argument("--workers", type=int, default=0, help="the node's --workers")
    parser.add_argument("--only", choices=sorted(FUZZERS), action="append",
                        help="run only these fuzzers (repeatable)")
    args = parser.parse_args()
    result: dict[str, Any] = {"examples_per_fuzzer": args.examples, "workers": args.workers,
                              "fuzzers": {}}
    failed = False
    with tempfile.TemporaryDirectory(prefix="otela-fuzz-") as tmp:
        root = Path(tmp)
        extra = ["--workers", str(args.workers)] if args.workers else []
        with LocalFederation(root / "fed") as federation:
            node, target = start_node(federation, root, MODEL, extra)
            result["rss_mib_before"] = rss_mib(node.process.pid)
            for name in args.only or sorted(FUZZERS):
                target.seen = {}
                started = time.monotonic()
                entry: dict[str, Any] = {}
                try:
                    FUZZERS[name](target, args.examples)
                except Exception as exc:  # report every fuzzer, then fail
                    failed = True
                    subs = getattr(exc, "exceptions", None) or [exc]
                    entry["failures"] = [str(e)[:2000] for e in subs]
                entry["seconds"] = round(time.monotonic() - started, 1)
                entry["requests"] = sum(target.seen.values())
                entry["statuses"] = {str(k): v for k, v in sorted(target.seen.items())}
                result["fuzzers"][name] = entry
                print(f"{name}: {entry}", file=sys.stderr, flush=True)
            result["rss_mib_after"] = rss_mib(node.process.pid)
            result["alive"] = node.process.poll() is None
            result["still_serves"] = result["alive"] and serves(node)
            result["tracebacks"] = tracebacks(node)
            target.client.close()
    failed = failed or not result["still_serves"] or bool(result["tracebacks"])
    result["ok"] = not failed
    print(json.dumps(result, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
