"""Controller pieces that need no cluster: following edits of the fleet file, the metrics
port, the event log, and what a pass learns (estimates, failures) from observations."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import trio

from otela.fleet.controller import Controller, Observation
from otela.fleet.events import read_events
from otela.fleet.metrics_server import serve_metrics
from otela.fleet.spec import load
from otela.fleet.state import Job, JobState, Node

FILE = """\
[fleet]
name = "unit"
bootstrap = ["/ip4/127.0.0.1/tcp/1/p2p/x"]
ingress = ["http://127.0.0.1:9"]

[clusters.a]
gpus_per_node = 1
expected_queue_wait = "5s"
expected_engine_start = "20s"

[[deployments]]
name = "d"
model = "m"
command = "serve --port {port}"
replicas = 2
"""


def controller(tmp_path: Path) -> Controller:
    path = tmp_path / "fleet.toml"
    path.write_text(FILE)
    return Controller(load(path), tmp_path / "state", echo=False)


def touch_later(path: Path, text: str) -> None:
    path.write_text(text)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))


def test_run_follows_edits_of_the_fleet_file_and_keeps_the_old_one_on_an_error(tmp_path):
    c = controller(tmp_path)
    c.reload_if_changed()
    assert c.fleet.deployments[0].replicas == 2 and not c.events.recent
    touch_later(c.fleet.path, FILE.replace("replicas = 2", "replicas = 5"))
    c.reload_if_changed()
    assert c.fleet.deployments[0].replicas == 5
    assert c.events.recent[-1].kind == "reloaded"
    broken = FILE.replace("replicas = 2", "replicas = 5\nreplika = 1")
    touch_later(c.fleet.path, broken)
    c.reload_if_changed()
    assert c.fleet.deployments[0].replicas == 5  # the running version stays
    event = c.events.recent[-1]
    line = broken.splitlines().index("replika = 1") + 1
    assert event.kind == "reload_failed"
    assert f"fleet.toml:{line}: deployments[0].replika: unknown field" in event.message
    logged = read_events(c.state_dir / "events.jsonl")
    assert [e["kind"] for e in logged] == ["reloaded", "reload_failed"]


def test_a_pass_learns_queue_wait_engine_start_and_failures(tmp_path):
    c = controller(tmp_path)
    assert c.estimates()["a"].lead == 25  # the file's priors
    started = 1000.0
    job = Job("a", "7", "d", "s", JobState.RUNNING, submitted_at=990.0, started_at=started,
              ends_at=5000.0)
    c.learn(Observation(1001.0, [job], [], {}))
    assert c.estimates()["a"].queue_wait == 10.0
    node = Node("sess", "a", "7", "d", "s", "SERVING")
    c.learn(Observation(1031.0, [job], [node], {}))
    estimate = c.estimates()["a"]
    assert estimate.engine_start == 31.0 and estimate.start_samples == 1
    c.learn(Observation(1040.0, [job], [node], {}))  # seen serving already: no sample
    assert c.estimates()["a"].start_samples == 1
    failed = Job("a", "8", "d", "s", JobState.FAILED, submitted_at=990, ended_at=1020.0)
    c.learn(Observation(1041.0, [job, failed], [node], {"a": "ssh: timeout"}))
    c.learn(Observation(1046.0, [job, failed], [node], {}))
    assert [(f.job_id, f.at) for f in c.memory.failures] == [("8", 1020.0)]  # once
    kinds = [e.kind for e in c.events.recent]
    assert kinds == ["serving", "unreachable", "failed", "reachable"]
    text = c.metrics.registry.render().decode()
    assert 'otela_fleet_failures_total{deployment="d",cluster="a"} 1' in text
    assert 'otela_fleet_queue_wait_seconds{cluster="a"} 10' in text


def test_the_metrics_port_serves_prometheus_text(tmp_path):
    c = controller(tmp_path)
    c.metrics.submissions.inc("d", "a")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_metrics, c.metrics.registry, "127.0.0.1", 0)
            async with httpx.AsyncClient(trust_env=False) as client:
                ok = await client.get(f"http://127.0.0.1:{port}/metrics")
                missing = await client.get(f"http://127.0.0.1:{port}/")
            assert ok.status_code == 200
            assert 'otela_fleet_submissions_total{deployment="d",cluster="a"} 1' in ok.text
            assert missing.status_code == 404
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_memory_survives_a_restart_and_a_damaged_file_costs_only_estimates(tmp_path):
    c = controller(tmp_path)
    c.set_stopped("d", True)
    again = controller(tmp_path)
    assert again.memory.stopped == ["d"]
    (tmp_path / "state" / "memory.json").write_text("{not json")
    assert controller(tmp_path).memory.stopped == []
    json.loads((tmp_path / "state" / "events.jsonl").read_text().splitlines()[0])
