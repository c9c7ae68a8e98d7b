"""Close the simulator loop on this machine: replay traces against the real vLLM CPU engine.

Builds the tiny random-weight Llama (no downloads), starts vLLM's OpenAI server on the CPU
(niced), and replays two DIFFERENT traces against it, open loop and streaming:

* ``calib``: Poisson whose rate cycles between 0.8 and 7.2 req/s (so the fit sees light and
  heavy load), uniform lengths — the simulator's CPU profile is fitted on it;
* ``heldout``: bursty Gamma (CV 2), log-normal/normal lengths, a higher rate — predicted
  by the fitted profile without looking at it.

Each trace is replayed ``--rounds`` times (default 2), alternating, because this machine is
shared and a slow spell should not hit one trace only. Writes ``<out>/{calib,heldout}.jsonl``
(the generated traces) and ``<out>/{calib,heldout}.replay.<round>.jsonl`` (what vLLM did).
Then
``python -m simulator.calibrate cpu <out>`` fits and reports (see docs/simulator.md).

    OTELA_VLLM_VENV=/work/main/.venv-vllm nice -n 10 .venv/bin/python benchmarks/cpu_loop.py OUT
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx

from otela.testing.localfed import (
    VLLM_ENV,
    build_tiny_model,
    free_port,
    vllm_engine_command,
    wait_for,
)
from traces.distributions import Diurnal
from traces.generate import GenSpec, generate, parse_models
from traces.io import Trace, write_trace
from traces.replay.runner import ReplayOptions, replay
from traces.stats import summarize

MODEL = "tiny-llama"
TRACES = {
    # calibration spans the operating range: a 45 s rate cycle between 0.8 and 7.2 req/s
    "calib": GenSpec(
        rate=4.0,
        duration=90,
        input="uniform:32,256",
        output="uniform:16,128",
        diurnal=Diurnal(0.8, period_s=45.0, peak_s=11.0),
        models=parse_models([MODEL]),
        seed=101,
    ),
    "heldout": GenSpec(
        rate=5.0,
        duration=60,
        cv=2.0,
        input="lognormal:160,90",
        output="normal:64,30",
        models=parse_models([MODEL]),
        seed=202,
    ),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--only", choices=sorted(TRACES), help="replay just one trace")
    ap.add_argument("--rounds", type=int, default=2, help="replays of each trace, alternating")
    args = ap.parse_args()
    venv = Path(os.environ.get("OTELA_VLLM_VENV", ".venv-vllm"))
    python = venv / "bin" / "python"
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = build_tiny_model(python, args.out / "tiny-llama")
    port = free_port()
    cmd = shlex.split(vllm_engine_command(python, model_dir, MODEL, port))
    env = {**os.environ, **VLLM_ENV}
    log = (args.out / "vllm.log").open("wb")
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise SystemExit(f"vLLM exited ({proc.returncode}); see {args.out}/vllm.log")
            try:
                return httpx.get(f"{url}/v1/models", timeout=2, trust_env=False).is_success
            except httpx.HTTPError:
                return False

        wait_for(ready, 600, "vLLM to serve", interval=1.0)
        print(f"vLLM ready after {time.monotonic() - started:.0f} s", flush=True)
        # warm-up: first requests compile/allocate; they are not part of any trace
        warm = generate(
            GenSpec(
                rate=2,
                requests=6,
                input="fixed:64",
                output="fixed:16",
                models=parse_models([MODEL]),
                seed=1,
            )
        )
        replay(warm, ReplayOptions(url=url))
        # the replayer shares the core vLLM reserves for its API server, not the engine's
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, cores[-1:])
        for rnd in range(1, args.rounds + 1):  # alternate, so slow spells hit both traces
            for name, spec in TRACES.items():
                if args.only and name != args.only:
                    continue
                trace = generate(spec)
                write_trace(args.out / f"{name}.jsonl", trace)
                load0 = os.getloadavg()[0]
                res = replay(trace, ReplayOptions(url=url))
                res.header["load_average"] = [load0, os.getloadavg()[0]]
                write_trace(args.out / f"{name}.replay.{rnd}.jsonl", res)
                _report(f"{name} #{rnd}", res)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    sys.exit(0)


def _report(name: str, res: Trace) -> None:
    s = summarize(res.records)
    print(
        f"{name}: {s['succeeded']}/{s['requests']} ok, "
        f"TTFT p50 {s['ttft_s']['p50'] * 1e3:.1f} ms, "
        f"TPOT p50 {s['tpot_s']['p50'] * 1e3:.2f} ms, "
        f"{s['output_tokens_per_s']:.0f} output tok/s, errors {s['errors']}, "
        f"load average {res.header['load_average'][0]:.2f}->"
        f"{res.header['load_average'][1]:.2f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
