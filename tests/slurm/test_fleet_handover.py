"""Wall-time handover on the real Slurm cluster: ``otela fleet run`` keeps 2 replicas of
2-minute jobs serving under steady traffic. Each replica's successor is submitted early
enough (measured queue wait + engine start) to serve before the old node drains, so the
serving count never drops below 2, no request fails, and every job ends COMPLETED (it
drained), not TIMEOUT.
"""

from __future__ import annotations

import contextlib
import threading
import time

import httpx
import pytest

from otela.testing.localfed import wait_for

from .fleet_helpers import (
    FleetCli,
    cancel_fleet_jobs,
    cluster_toml,
    deployment_toml,
    fleet_jobs,
    fleet_name,
    fleet_toml,
    serving_count,
    wait_serving,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("slurm_cluster"),
              pytest.mark.xdist_group("engines-and-slurm")]


@pytest.mark.timeout(420)
def test_replicas_are_handed_over_before_their_wall_time_with_traffic_flowing(
        federation, tmp_path):
    ingress = federation.start_node("ingress", ingress=True)
    name = fleet_name()
    file = tmp_path / "fleet.toml"
    file.write_text(fleet_toml(name, ingress, interval="5s", extra='handover_slack = "10s"')
                    + cluster_toml("local", tmp_path, time_limit="2", drain_margin="30s")
                    + deployment_toml("wall", "fleet-wall", replicas=2))
    cli = FleetCli(file, tmp_path / "state", tmp_path)
    failures: list[str] = []
    answered = [0]
    lowest: list[int] = []
    stop = threading.Event()

    def traffic() -> None:
        with httpx.Client(trust_env=False, timeout=30) as client:
            while not stop.is_set():
                body = {"model": "fleet-wall", "messages": [{"role": "user",
                                                             "content": "tick tock"}]}
                try:
                    response = client.post(f"{ingress.http_url}/v1/chat/completions",
                                           json=body)
                    if response.status_code != 200:
                        failures.append(f"{response.status_code} {response.text[:200]}")
                    else:
                        answered[0] += 1
                except httpx.HTTPError as exc:
                    failures.append(repr(exc))
                stop.wait(0.2)

    def sample() -> None:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                lowest.append(serving_count(ingress, name))
            stop.wait(0.5)

    with cancel_fleet_jobs(name):
        threads = []
        try:
            cli.start_run()
            wait_serving(ingress, name, 2, timeout=90)
            first = {j.job_id for j in fleet_jobs(name)}
            threads = [threading.Thread(target=traffic), threading.Thread(target=sample)]
            for thread in threads:
                thread.start()

            def both_handed_over() -> bool:
                jobs = {j.job_id: j.state for j in fleet_jobs(name)}
                return all(jobs.get(j) == "COMPLETED" for j in first) and \
                    serving_count(ingress, name) == 2
            started = time.monotonic()
            wait_for(both_handed_over, 200, "both first replicas to be handed over",
                     interval=1.0)
            print(f"both handed over {time.monotonic() - started:.0f}s into the traffic")
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
            cli.stop_runs()
        events = cli.events()
        handovers = [e for e in events if e["kind"] == "handover"]
        print(f"{answered[0]} requests answered, lowest serving {min(lowest)}, "
              f"{len(handovers)} handovers, serving samples {len(lowest)}")
        assert failures == []
        assert lowest and min(lowest) >= 2, lowest
        assert {e["job_id"] for e in handovers} >= first
        states = {j.job_id: j.state for j in fleet_jobs(name)}
        assert all(states[j] == "COMPLETED" for j in first), states
        assert "TIMEOUT" not in states.values()
        successors = [e for e in events if e["kind"] == "submit" and
                      e["message"].startswith("successor of")]
        assert len(successors) >= 2
        assert answered[0] > 100
