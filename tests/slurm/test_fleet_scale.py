"""Autoscaling and scale to zero with ``otela fleet run`` on the real Slurm cluster.

The ingress holds requests for ``cold-*`` models while nothing serves them
(``--hold-models``); the controller sees them in the ingress's metrics, starts a replica,
and the held request is answered when it serves. Load above one replica's target adds a
second; once idle the deployment goes back to zero, and the next request starts it again.
"""

from __future__ import annotations

import time

import httpx
import pytest
import trio

from otela.testing.localfed import wait_for
from otela.testing.steady_load import SteadyLoad

from .fleet_helpers import (
    FleetCli,
    active,
    cancel_fleet_jobs,
    cluster_picture,
    cluster_toml,
    deployment_toml,
    fleet_jobs,
    fleet_name,
    fleet_toml,
    serving_count,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("slurm_cluster"),
              pytest.mark.xdist_group("engines-and-slurm")]

AUTOSCALE = """min = 0
max = 2
[deployments.autoscale]
target_rps = 4
up_cooldown = "5s"
down_window = "10s"
down_cooldown = "10s"
idle_timeout = "20s"
"""


def ask(url: str, model: str, content: str = "wake up") -> tuple[httpx.Response, float]:
    started = time.monotonic()
    body = {"model": model, "messages": [{"role": "user", "content": content}]}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120,
                          trust_env=False)
    return response, time.monotonic() - started


@pytest.mark.timeout(500)
def test_scale_to_zero_holds_the_first_request_scales_with_load_and_back_to_zero(
        federation, tmp_path):
    ingress = federation.start_node("ingress", ingress=True, extra_args=[
        "--hold-models", "cold-*", "--hold-timeout", "90"])
    name = fleet_name()
    file = tmp_path / "fleet.toml"
    file.write_text(fleet_toml(name, ingress, interval="5s") + cluster_toml("local", tmp_path)
                    + deployment_toml("cold", "cold-echo", replicas=None, extra=AUTOSCALE))
    cli = FleetCli(file, tmp_path / "state", tmp_path)
    with cancel_fleet_jobs(name):
        try:
            cli.start_run()
            wait_for(lambda: (cli.state / "metrics.prom").exists(), 30, "a first pass")
            assert fleet_jobs(name) == []  # min = 0 and no request: nothing runs

            response, waited = ask(ingress.http_url, "cold-echo")
            assert response.status_code == 200, response.text
            assert response.json()["choices"][0]["message"]["content"] == "echo: wake up"
            print(f"first request for the cold model answered after {waited:.1f}s")
            assert len(fleet_jobs(name)) == 1
            metrics = httpx.get(f"{ingress.http_url}/metrics", trust_env=False).text
            assert 'otela_held_requests_total{model="cold-echo",outcome="served"} 1' in metrics
            assert 'otela_held_requests{model="cold-echo"} 0' in metrics

            # 8 req/s, open loop (a fixed rate however slow answers get on a busy
            # machine): two replicas' worth of a 4 req/s target
            load = SteadyLoad(ingress.http_url, "cold-echo", rate=8.0, stream_share=0.0)

            # The bound covers two controller passes of 5 s and the up cooldown, then a
            # Slurm job's start, a node's join and an engine's start: ~40-70 s alone,
            # and in full-suite runs on 2 busy cores it passed 90 s twice (printed below).
            async def under_load() -> None:
                stop = trio.Event()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(load.run, stop)
                    try:
                        await trio.to_thread.run_sync(lambda: wait_for(
                            lambda: serving_count(ingress, name) == 2, 180,
                            "a second replica under load", interval=0.5))
                    finally:
                        stop.set()

            loaded = time.monotonic()
            try:
                trio.run(under_load)
            except BaseException:
                # what the controller saw and did, for whoever reads this failure (it has
                # happened in full-suite runs on a 2-core VM only, never alone)
                print("fleet events:", *cli.events()[-30:], sep="\n  ")
                print("jobs:", *fleet_jobs(name), sep="\n  ")
                print("cluster:", cluster_picture(), sep="\n")
                print("ingress metrics:", *[line for line in httpx.get(
                    f"{ingress.http_url}/metrics", trust_env=False).text.splitlines()
                    if "cold-echo" in line and not line.startswith("#")][:20], sep="\n  ")
                raise
            print(f"a second replica served {time.monotonic() - loaded:.1f}s into the load")
            errors = [f"{o.result}" for o in load.errors()] + list(load.messages)
            assert errors == []

            # idle: back to zero, each replica drained
            wait_for(lambda: not active(fleet_jobs(name)), 120, "scale to zero", interval=1)
            assert {j.state for j in fleet_jobs(name)} == {"COMPLETED"}

            response, waited = ask(ingress.http_url, "cold-echo", "again")
            assert response.status_code == 200, response.text
            print(f"a request after scale to zero answered after {waited:.1f}s")
        finally:
            cli.stop_runs()
        scales = [e["message"] for e in cli.events() if e["kind"] == "scale"]
        print("\n".join(scales))
        assert scales[0].startswith("up 0 -> 1: a request is waiting for a first replica")
        assert any(m.startswith("up 1 -> 2") for m in scales)
        assert any(m.startswith("down 1 -> 0") or m.startswith("down 2 -> 0")
                   for m in scales)
