"""`otela plan --emit-sbatch` scripts on the real single-node Slurm cluster, echo engine.

The plan's script is submitted unchanged (only `--gres=none`: no GPUs here); the job's node
joins the federation, serves the planned model, and answers through the ingress.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from otela.cli import app

from .helpers import chat, job_env, job_output, wait_job_node

# One worker runs every Slurm test (the cluster is the machine's; see scripts/test).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("slurm_cluster"),
              pytest.mark.xdist_group("engines-and-slurm")]


def test_a_planned_replica_runs_as_a_slurm_job(federation, tmp_path: Path) -> None:
    pool = tmp_path / "pool.toml"
    pool.write_text('[[hosts]]\nname = "node"\ngpu = "a100-80g-sxm"\ngpus_per_host = 1\n')
    demand = tmp_path / "demand.toml"
    demand.write_text('[[models]]\nmodel = "llama-3.1-8b"\nname = "planned-echo"\nrate = 1\n'
                      'input = "normal:200,50"\noutput = "normal:50,10"\n')
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(app, [
        "plan", "--pool", str(pool), "--demand", str(demand), "--cache", str(tmp_path / "c"),
        "--sim-requests", "100", "--emit-sbatch", str(tmp_path / "jobs"), "--engine", "echo",
        "--out", str(out)])
    assert result.exit_code == 0, result.output
    scripts = json.loads(out.read_text())["sbatch"]
    assert len(scripts) == 1
    script = Path(scripts[0])
    subprocess.run(["bash", "-n", str(script)], check=True)

    ingress = federation.start_node("ingress", ingress=True)
    env = job_env(ingress, tmp_path, OTELA_PROVIDER_ID="planner-test")
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--gres=none", f"--output={tmp_path}/job-%j.out", str(script)],
        env=env, capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    try:
        node = wait_job_node(ingress, job, "SERVING", 60.0, tmp_path)
        assert node["engine"] == "echo"
        assert [m["id"] for m in node["models"]] == ["planned-echo"]
        response = chat(ingress, "planned-echo", "hi")
        assert response.status_code == 200, response.text
        assert response.headers["x-otela-session-id"] == node["session_id"]
    finally:
        subprocess.run(["scancel", job], timeout=30)
        print(job_output(tmp_path, job)[-1500:])
