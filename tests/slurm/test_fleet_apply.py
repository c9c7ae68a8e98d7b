"""``otela fleet`` diff, apply, status and stop on the real single-node Slurm cluster, with
echo engines: from nothing to serving, no duplicates on a second apply, scaling up and
down, a roll on a changed command (new replicas serve before old ones drain), a stopped
deployment, and a bad fleet file that submits nothing.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from otela.testing.localfed import wait_for

from .fleet_helpers import (
    ECHO,
    FleetCli,
    active,
    cancel_fleet_jobs,
    cluster_toml,
    deployment_toml,
    fleet_jobs,
    fleet_name,
    fleet_nodes,
    fleet_toml,
    serving_count,
    wait_serving,
)
from .helpers import chat

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("slurm_cluster"),
              pytest.mark.xdist_group("engines-and-slurm")]


def test_apply_from_nothing_then_scale_up_and_down(federation, tmp_path):
    ingress = federation.start_node("ingress", ingress=True)
    name = fleet_name()
    file = tmp_path / "fleet.toml"

    def write(replicas: int) -> None:
        file.write_text(fleet_toml(name, ingress) + cluster_toml("local", tmp_path)
                        + deployment_toml("echo", "fleet-echo", replicas=replicas))

    write(2)
    cli = FleetCli(file, tmp_path / "state", tmp_path)
    with cancel_fleet_jobs(name):
        planned = json.loads(cli("diff", "--json").stdout)
        assert len(planned["actions"]) == 2
        assert all(a.startswith("submit echo on local") for a in planned["actions"])
        assert fleet_jobs(name) == []  # diff submits nothing

        cli("apply")
        jobs = active(fleet_jobs(name))
        assert len(jobs) == 2 and {j.deployment for j in jobs} == {"echo"}
        assert json.loads(cli("apply", "--json").stdout)["actions"] == []  # no duplicates
        wait_serving(ingress, name, 2)
        nodes = fleet_nodes(ingress, name, "SERVING")
        assert {n["fleet"]["job_id"] for n in nodes} == {j.job_id for j in jobs}
        assert {n["slurm"]["job_id"] for n in nodes} == {j.job_id for j in jobs}
        assert all(n["fleet"]["spec"] == jobs[0].spec for n in nodes)
        response = chat(ingress, "fleet-echo", "hi")
        assert response.status_code == 200, response.text

        status = json.loads(cli("status", "--json").stdout)
        (echo,) = status["deployments"]
        assert (echo["desired"], echo["serving"], echo["pending"]) == (2, 2, 0)
        assert all(j["time_left"] is not None and j["node"] == "SERVING" for j in echo["jobs"])
        assert [e["kind"] for e in status["events"]].count("submit") == 2

        write(3)
        assert json.loads(cli("apply", "--json").stdout)["actions"][0].startswith(
            "submit echo on local (scale to 3)")
        wait_serving(ingress, name, 3)

        write(1)
        done = json.loads(cli("apply", "--json").stdout)["actions"]
        assert len(done) == 2 and all(a.startswith("drain echo job") for a in done)
        wait_for(lambda: len(active(fleet_jobs(name))) == 1, 60, "two jobs to drain and end")
        assert serving_count(ingress, name) == 1
        drained = [j for j in fleet_jobs(name) if j.state != "RUNNING"]
        assert {j.state for j in drained} == {"COMPLETED"}  # drained, not killed
        assert all("drain" in j.comment.split() for j in drained)
        assert json.loads(cli("apply", "--json").stdout)["actions"] == []


def test_roll_serves_new_replicas_before_draining_old_ones_then_stop(federation, tmp_path):
    ingress = federation.start_node("ingress", ingress=True)
    name = fleet_name()
    file = tmp_path / "fleet.toml"

    def write(command: str) -> None:
        file.write_text(fleet_toml(name, ingress) + cluster_toml("local", tmp_path)
                        + deployment_toml("roll", "fleet-roll", replicas=2, command=command))

    write(ECHO)
    cli = FleetCli(file, tmp_path / "state", tmp_path)
    with cancel_fleet_jobs(name):
        cli("apply")
        wait_serving(ingress, name, 2)
        old = {j.job_id for j in active(fleet_jobs(name))}
        old_spec = active(fleet_jobs(name))[0].spec

        write(ECHO + " --token-delay 0.01")  # a new command: a new spec
        lowest = [2]
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                lowest[0] = min(lowest[0], serving_count(ingress, name))
                stop.wait(0.2)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            first = json.loads(cli("apply", "--json").stdout)["actions"]
            assert len(first) == 2 and all("roll" in a for a in first), first
            assert {j.job_id for j in active(fleet_jobs(name))} >= old  # old ones serve on

            def rolled() -> bool:
                cli("apply")
                jobs = active(fleet_jobs(name))
                return bool(jobs) and all(j.spec != old_spec for j in jobs) and \
                    serving_count(ingress, name) == 2
            wait_for(rolled, 120, "the roll to finish", interval=1.0)
        finally:
            stop.set()
            watcher.join()
        assert lowest[0] >= 2, f"serving replicas dropped to {lowest[0]} during the roll"
        assert not (old & {j.job_id for j in active(fleet_jobs(name))})

        cli("stop", "roll")
        wait_for(lambda: not active(fleet_jobs(name)), 60, "the stopped deployment to end")
        assert json.loads(cli("apply", "--json").stdout)["actions"] == []  # stays stopped
        cli("resume", "roll")
        assert len(active(fleet_jobs(name))) == 2


def test_a_bad_fleet_file_is_refused_with_its_line_and_submits_nothing(federation, tmp_path):
    ingress = federation.start_node("ingress", ingress=True)
    name = fleet_name()
    file = tmp_path / "fleet.toml"
    text = (fleet_toml(name, ingress) + cluster_toml("local", tmp_path)
            + deployment_toml("bad", "fleet-bad", replicas=1).replace("gpus = 0", "gpus = 2"))
    file.write_text(text)
    cli = FleetCli(file, tmp_path / "state", tmp_path)
    line = text.splitlines().index("gpus = 2") + 1
    for command in ("apply", "diff", "run"):
        result = cli(command, check=False)
        assert result.returncode == 2, result
        assert f"{file}:{line}: deployments[0].gpus:" in result.stderr, result.stderr
        assert "do not fit cluster 'local'" in result.stderr
    time.sleep(0)  # (nothing to wait for: the commands above are synchronous)
    assert fleet_jobs(name) == []
