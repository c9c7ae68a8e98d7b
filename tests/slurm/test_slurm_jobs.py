"""The slurm/ templates on a real single-node Slurm cluster, with the echo engine.

Each job runs a real ``otela start`` under slurmd; the federation's ingress runs outside
Slurm. Covers: the job's node joins with its allocation in the record and serves;
``scancel`` drains (DOWN, in-flight requests complete, LEFT); a job with a 2-minute limit
leaves before it; an idle-capacity job.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time

import httpx
import pytest

from otela.testing.localfed import echo_engine_command, free_port, wait_for

from .helpers import (
    StateWatcher,
    chat,
    job_env,
    job_output,
    job_state,
    serving_node,
    submit,
    wait_job_node,
    wait_state,
)

# One worker runs every Slurm test (the cluster is the machine's; see scripts/test).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("slurm_cluster"),
              pytest.mark.xdist_group("engines-and-slurm")]

JOIN_S = 60.0
WORDS = " ".join(f"w{i}" for i in range(12))  # 13 echoed tokens


def test_scancel_drains_the_job_node_while_in_flight_requests_complete(federation, tmp_path):
    ingress = federation.start_node("ingress", ingress=True)
    engine = echo_engine_command(free_port(), ["slurm-echo"], "--token-delay", "0.25")
    env = job_env(ingress, tmp_path, ENGINE_COMMAND=engine, OTELA_PROVIDER_ID="hpc-lab")
    job = submit("vllm.sbatch", env, tmp_path)
    node = wait_job_node(ingress, job, "SERVING", JOIN_S, tmp_path)

    slurm = node["slurm"]
    assert slurm["partition"] == "debug"
    assert slurm["node_list"] == socket.gethostname().split(".")[0]
    assert slurm["cpus"] >= 1
    assert node["provider_id"] == "hpc-lab" and node["engine"] == "echo"
    response = chat(ingress, "slurm-echo", "hi")
    assert response.status_code == 200
    assert response.headers["x-otela-session-id"] == node["session_id"]

    results: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda: results.append(chat(ingress, "slurm-echo", WORDS)))
               for _ in range(3)]
    for thread in threads:
        thread.start()
    wait_for(lambda: httpx.get(f"{node['http_url']}/v1/health", trust_env=False)
             .json()["in_flight"] == 3, 10, "3 requests in flight on the job's node")
    with StateWatcher(ingress, node["session_id"]) as watcher:
        cancelled = time.monotonic()
        subprocess.run(["scancel", job], check=True, timeout=30)
        wait_for(lambda: watcher.seen[-1:] == ["LEFT"], 20, "the job's node to be LEFT")
        left_after = time.monotonic() - cancelled
        for thread in threads:
            thread.join(30)
    assert watcher.seen[-2:] == ["DOWN", "LEFT"], watcher.seen
    print(f"scancel -> LEFT at the ingress after {left_after:.1f}s")
    assert left_after < 15
    assert [r.status_code for r in results] == [200, 200, 200]
    assert all(r.json()["choices"][0]["message"]["content"] == "echo: " + WORDS for r in results)
    wait_for(lambda: job_state(job) in ("CANCELLED", "COMPLETED"), 60, "the job to end")


def test_job_drains_before_its_time_limit_and_no_request_fails(federation, tmp_path):
    ingress = federation.start_node("ingress", ingress=True)
    # A second replica outside Slurm takes the traffic once the job's node leaves.
    backup = serving_node(federation, "backup", ingress, "limited", "--token-delay", "0.05")
    wait_state(ingress, backup, "SERVING")
    engine = echo_engine_command(free_port(), ["limited"], "--token-delay", "0.05")
    # --time=2 (minutes) with a 100 s margin: the node must drain ~20 s into the job.
    env = job_env(ingress, tmp_path, ENGINE_COMMAND=engine, OTELA_SLURM_DRAIN_MARGIN="100")
    started, submitted_at = time.monotonic(), time.time()
    job = submit("vllm.sbatch", env, tmp_path, "--time=2")
    node = wait_job_node(ingress, job, "SERVING", JOIN_S, tmp_path)
    assert abs(node["slurm"]["end_time"] - (submitted_at + 120)) < 15  # from squeue %L

    failures: list[str] = []
    served_by: set[str] = set()
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            response = chat(ingress, "limited", "keep going please")
            if response.status_code != 200:
                failures.append(f"{response.status_code} {response.text[:200]}")
            served_by.add(response.headers.get("x-otela-session-id", ""))

    workers = [threading.Thread(target=load) for _ in range(2)]
    for worker in workers:
        worker.start()
    try:
        with StateWatcher(ingress, node["session_id"]) as watcher:
            wait_for(lambda: watcher.seen[-1:] == ["LEFT"], 110, "the job's node to leave")
        drained_after = time.monotonic() - started
        print(f"job node LEFT {drained_after:.1f}s after sbatch (limit 120 s, margin 100 s)")
        wait_for(lambda: job_state(job) == "COMPLETED", 60, "the job to complete")
    finally:
        stop.set()
        for worker in workers:
            worker.join(30)
    output = job_output(tmp_path, job)
    assert "draining" in output, output[-2000:]
    assert watcher.seen[-2:] == ["DOWN", "LEFT"]
    assert drained_after < 60  # well before the 120 s limit
    assert job_state(job) == "COMPLETED"  # otela left on its own: not TIMEOUT, not killed
    assert failures == []
    assert node["session_id"] in served_by and backup.session_id in served_by


def test_idle_template_advertises_the_allocation(federation, tmp_path):
    ingress = federation.start_node("ingress", ingress=True)
    job = submit("idle.sbatch", job_env(ingress, tmp_path), tmp_path, "--cpus-per-task=2")
    node = wait_job_node(ingress, job, "JOIN", JOIN_S, tmp_path)
    assert node["idle"] is True and node["engine"] is None
    assert node["slurm"]["cpus"] == 2
    with StateWatcher(ingress, node["session_id"]) as watcher:
        subprocess.run(["scancel", job], check=True, timeout=30)
        wait_for(lambda: watcher.seen[-1:] == ["LEFT"], 20, "the idle node to leave")


@pytest.mark.parametrize("template", ["sglang.sbatch", "vllm-tensor-parallel.sbatch"])
def test_other_serving_templates_join_serve_and_leave(federation, tmp_path, template):
    ingress = federation.start_node("ingress", ingress=True)
    engine = echo_engine_command(free_port(), ["tpl-model"])
    # The test node has 8 CPUs; the TP template asks for 32 by default.
    job = submit(template, job_env(ingress, tmp_path, ENGINE_COMMAND=engine), tmp_path,
                 "--cpus-per-task=2")
    node = wait_job_node(ingress, job, "SERVING", JOIN_S, tmp_path)
    assert node["slurm"]["job_id"] == job
    assert chat(ingress, "tpl-model", "hi").json()["choices"][0]["message"]["content"] == "echo: hi"
    with StateWatcher(ingress, node["session_id"]) as watcher:
        subprocess.run(["scancel", "--batch", "--signal=TERM", job], check=True, timeout=30)
        wait_for(lambda: watcher.seen[-1:] == ["LEFT"], 20, "the job's node to leave")
    wait_for(lambda: job_state(job) == "COMPLETED", 60, "the job to complete")
