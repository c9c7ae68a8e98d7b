"""``otela fleet`` when things go wrong, on the real Slurm cluster and a real sshd: a
controller SIGKILLed and restarted (it adopts what runs, submits no duplicate), an engine
that fails (backoff, then another cluster), and a cluster whose login node stops
answering (its serving replicas are counted from the registry, a lost one is replaced on
another cluster, nothing is done to the unreachable one).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

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
    fleet_toml,
    serving_count,
    wait_serving,
)
from .helpers import chat

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("slurm_cluster"),
              pytest.mark.xdist_group("engines-and-slurm")]


def passes(cli: FleetCli) -> int:
    path = cli.state / "metrics.prom"
    if not path.exists():
        return 0
    match = re.search(r"^otela_fleet_passes_total (\d+)", path.read_text(), re.M)
    return int(match.group(1)) if match else 0


def test_a_killed_controller_is_restarted_adopts_its_jobs_and_submits_no_duplicate(
        federation, tmp_path):
    ingress = federation.start_node("ingress", ingress=True)
    name = fleet_name()
    file = tmp_path / "fleet.toml"
    file.write_text(fleet_toml(name, ingress, interval="3s") + cluster_toml("local", tmp_path)
                    + deployment_toml("adopt", "fleet-adopt", replicas=3,
                                      command=ECHO + " --startup-delay 3"))
    cli = FleetCli(file, tmp_path / "state", tmp_path)
    with cancel_fleet_jobs(name):
        try:
            first = cli.start_run()
            # Killed while its replicas are still starting: nothing in memory survives.
            wait_for(lambda: len(fleet_jobs(name)) == 3, 60, "three jobs submitted")
            first.send_signal(signal.SIGKILL)
            first.wait(10)
            second = cli.start_run()
            wait_serving(ingress, name, 3, timeout=120)
            settled = passes(cli) + 3
            wait_for(lambda: passes(cli) >= settled, 60, "three more passes")
            assert second.poll() is None, cli.run_log()
        finally:
            cli.stop_runs()
        jobs = fleet_jobs(name)
        assert len(jobs) == 3, jobs  # not one more: the second controller adopted them
        assert {j.state for j in jobs} == {"RUNNING"}
        assert [e["kind"] for e in cli.events()].count("submit") == 3
        assert chat(ingress, "fleet-adopt", "still here").status_code == 200


def test_a_failing_engine_is_retried_with_backoff_then_placed_on_another_cluster(
        federation, tmp_path):
    ingress = federation.start_node("ingress", ingress=True)
    name = fleet_name()
    # On cluster "a" the engine exits at once (as a broken module or image would); on "b"
    # the same command serves.
    command = (f"bash -c '[ -z \"$FAIL_ENGINE\" ] && exec {sys.executable} -m "
               "otela.engine.demo.echo --port \"$2\" --model fleet-flaky; exit 1' "
               "engine --port {port}")
    file = tmp_path / "fleet.toml"
    file.write_text(
        fleet_toml(name, ingress, interval="3s", extra='backoff = "8s"\nmax_failures = 2')
        + cluster_toml("a", tmp_path).replace('OTELA_LOG_LEVEL = "INFO"',
                                              'OTELA_LOG_LEVEL = "INFO", FAIL_ENGINE = "1"')
        + cluster_toml("b", tmp_path)
        + deployment_toml("flaky", "fleet-flaky", replicas=1, command=command,
                          clusters=["a", "b"]))
    cli = FleetCli(file, tmp_path / "state", tmp_path)
    with cancel_fleet_jobs(name):
        try:
            cli.start_run()
            wait_serving(ingress, name, 1, timeout=150)
        finally:
            cli.stop_runs()
        events = cli.events()
        kinds = [(e["kind"], e.get("cluster", "")) for e in events
                 if e["kind"] in ("submit", "failed", "serving", "backoff")]
        submits = [c for k, c in kinds if k == "submit"]
        assert submits == ["a", "a", "b"], kinds
        failed = [e for e in events if e["kind"] == "failed"]
        assert [e["cluster"] for e in failed] == ["a", "a"]
        assert any(k == "backoff" for k, _ in kinds), kinds
        jobs = {j.job_id: j for j in fleet_jobs(name)}
        assert [jobs[e["job_id"]].state for e in failed] == ["FAILED", "FAILED"]
        (serving,) = [j for j in jobs.values() if j.state == "RUNNING"]
        assert serving.cluster == "b"
        assert "fleet_failures_total" in (cli.state / "metrics.prom").read_text()


def test_an_unreachable_cluster_is_left_alone_and_compensated_on_another(
        federation, tmp_path, login_node):
    ingress = federation.start_node("ingress", ingress=True)
    name = fleet_name()
    file = tmp_path / "fleet.toml"
    file.write_text(
        fleet_toml(name, ingress)
        + cluster_toml("remote", tmp_path, ssh=login_node.target,
                       ssh_options=login_node.options)
        + cluster_toml("local", tmp_path)
        + deployment_toml("far", "fleet-far", replicas=2, clusters=["remote", "local"]))
    cli = FleetCli(file, tmp_path / "state", tmp_path)
    with cancel_fleet_jobs(name):
        done = json.loads(cli("apply", "--json").stdout)["actions"]
        assert len(done) == 2 and all(" on remote " in a for a in done)  # through ssh
        wait_serving(ingress, name, 2)
        remote = active(fleet_jobs(name))
        assert {j.cluster for j in remote} == {"remote"}

        login_node.stop()
        result = json.loads(cli("apply", "--json").stdout)
        assert result["actions"] == []  # its nodes serve: nothing to compensate
        status = json.loads(cli("status", "--json").stdout)
        assert "remote" in status["unreachable"]
        assert [j["presumed"] for j in status["deployments"][0]["jobs"]] == [True, True]

        # One of its jobs ends while nobody can ask its cluster.
        subprocess.run(["scancel", remote[0].job_id], check=True, timeout=30)
        wait_for(lambda: serving_count(ingress, name) == 1, 60, "the lost replica to leave")
        done = json.loads(cli("apply", "--json").stdout)["actions"]
        assert len(done) == 1 and done[0].startswith("submit far on local"), done
        wait_serving(ingress, name, 2)
        assert any(e["kind"] == "unreachable" and e.get("cluster") == "remote"
                   for e in cli.events())

        login_node.start()
        assert json.loads(cli("apply", "--json").stdout)["actions"] == []
        assert json.loads(cli("status", "--json").stdout)["unreachable"] == {}
        assert sorted(j.cluster for j in active(fleet_jobs(name))) == ["local", "remote"]


def test_a_job_pending_past_its_limit_is_tried_on_another_cluster(federation, tmp_path):
    ingress = federation.start_node("ingress", ingress=True)
    name = fleet_name()
    file = tmp_path / "fleet.toml"
    # On "busy" every job waits an hour to start (as behind a long queue).
    file.write_text(
        fleet_toml(name, ingress, interval="3s")
        + cluster_toml("busy", tmp_path, extra='sbatch_args = ["--begin=now+1hour"]\n'
                                             'pending_limit = "8s"')
        + cluster_toml("free", tmp_path)
        + deployment_toml("queued", "fleet-queued", replicas=1, clusters=["busy", "free"]))
    cli = FleetCli(file, tmp_path / "state", tmp_path)
    with cancel_fleet_jobs(name):
        try:
            cli.start_run()
            wait_serving(ingress, name, 1, timeout=90)
        finally:
            cli.stop_runs()
        events = cli.events()
        moves = [(e["kind"], e.get("cluster")) for e in events
                 if e["kind"] in ("submit", "cancel")]
        assert moves == [("submit", "busy"), ("cancel", "busy"), ("submit", "free")], moves
        cancel = next(e for e in events if e["kind"] == "cancel")
        assert "pending for" in cancel["message"] and "BeginTime" in cancel["message"]
        states = {j.cluster: j.state for j in fleet_jobs(name)}
        assert states == {"busy": "CANCELLED", "free": "RUNNING"}
