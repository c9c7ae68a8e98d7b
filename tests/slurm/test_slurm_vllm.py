"""The vLLM template on the real Slurm cluster, with the real vLLM CPU build.

The job's node serves a chat completion through the ingress; ``scancel --batch`` (the
signal reaches otela only, as the template ``exec``s it) makes otela drain, stop vLLM
itself and leave, so the job ends COMPLETED rather than killed.
"""

from __future__ import annotations

import subprocess

import pytest

from otela.testing.localfed import VLLM_ENV, free_port, vllm_engine_command, wait_for

from .helpers import StateWatcher, chat, job_env, job_output, job_state, submit, wait_job_node

# One worker runs every Slurm test (the cluster is the machine's; see scripts/test).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("slurm_cluster"),
              pytest.mark.xdist_group("engines-and-slurm")]

VLLM_READY_S = 400.0


def test_vllm_template_serves_and_leaves_cleanly(federation, tmp_path, vllm_python, tiny_model):
    ingress = federation.start_node("ingress", ingress=True)
    engine = vllm_engine_command(vllm_python, tiny_model, "slurm-llama", free_port())
    env = job_env(ingress, tmp_path, ENGINE_COMMAND=engine, **VLLM_ENV)
    job = submit("vllm.sbatch", env, tmp_path, "--cpus-per-task=2")
    node = wait_job_node(ingress, job, "SERVING", VLLM_READY_S, tmp_path)
    assert node["engine"] == "vllm" and node["slurm"]["cpus"] == 2
    assert node["models"][0]["max_context"] == 512

    response = chat(ingress, "slurm-llama", "hello from slurm")
    assert response.status_code == 200, response.text
    assert response.json()["system_fingerprint"].startswith("vllm-")
    assert response.headers["x-otela-session-id"] == node["session_id"]

    with StateWatcher(ingress, node["session_id"]) as watcher:
        subprocess.run(["scancel", "--batch", "--signal=TERM", job], check=True, timeout=30)
        wait_for(lambda: watcher.seen[-1:] == ["LEFT"], 60, "the vLLM job's node to leave")
    assert watcher.seen[-1] == "LEFT"
    wait_for(lambda: job_state(job) == "COMPLETED", 60,
             f"the job to complete:\n{job_output(tmp_path, job)[-2000:]}")
    # DOWN came first (the drain): as the node announced it. A poller can miss a short
    # DOWN on a busy machine (it saw SERVING then LEFT once in a full-suite run).
    output = job_output(tmp_path, job)
    assert output.index("announced DOWN") < output.index("announced LEFT"), output[-2000:]
