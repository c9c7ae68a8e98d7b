"""What goes to Slurm (the sbatch script, SSH argv) and what comes back (squeue lines)."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from otela.fleet.identity import Shape
from otela.fleet.script import comment, engine_command, parse_comment, render
from otela.fleet.slurmctl import SQUEUE_FORMAT, SlurmClient, parse_squeue
from otela.fleet.spec import parse
from otela.fleet.state import JobState
from otela.slurm import fleet_tag_from_env

FLEET = """\
[fleet]
name = "lab"
bootstrap = ["/ip4/127.0.0.1/tcp/1/p2p/a", "/ip4/127.0.0.1/tcp/2/p2p/b"]
ingress = ["http://127.0.0.1:8092"]
provider_id = "cscs"

[clusters.alps]
ssh = "me@login"
ssh_options = ["-p", "2222"]
partition = "normal"
account = "a-lab"
qos = "high"
time_limit = 90
gpu_type = "gh200"
gpus_per_node = 4
cpus_per_job = 16
memory = "64G"
modules = ["cuda/12.4", "nccl"]
container = "apptainer exec --nv /img/vllm.sif {command}"
env = { HF_HOME = "/scratch/hf" }
sbatch_args = ["--constraint=gpu"]
drain_margin = "3m"

[[deployments]]
name = "qwen"
model = "Qwen/Qwen3-8B"
command = "vllm serve {model} --port {port} --tensor-parallel-size {tp} --name 'q 8b'"
gpus = 2
gpu_types = ["gh200"]
replicas = 1
env = { VLLM_LOGGING_LEVEL = "INFO" }
[deployments.otela]
drain_grace = 20
"""


def test_the_script_carries_the_cluster_preset_and_the_tag(tmp_path: Path):
    fleet = parse(FLEET)
    cluster, deployment = fleet.clusters["alps"], fleet.deployments[0]
    script = render(fleet, cluster, deployment, "abc123", Shape(2, "gh200"))
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    directives = [line[len("#SBATCH "):] for line in lines if line.startswith("#SBATCH ")]
    assert directives == [
        "--job-name=otela-lab-qwen",
        '--comment="otela-fleet fleet=lab deployment=qwen spec=abc123 cluster=alps"',
        "--nodes=1", "--ntasks=1", "--time=0-01:30:00", "--cpus-per-task=16",
        "--partition=normal", "--account=a-lab", "--qos=high", "--mem=64G",
        "--gres=gpu:gh200:2", "--constraint=gpu"]
    assert "module load cuda/12.4" in lines and "module load nccl" in lines
    assert "export OTELA_FLEET_TAG=fleet=lab,deployment=qwen,spec=abc123,cluster=alps" in lines
    assert "export OTELA_SLURM_DRAIN_MARGIN=180" in lines
    assert "export OTELA_DRAIN_GRACE=20" in lines  # the deployment's otela option wins
    assert "export OTELA_PROVIDER_ID=cscs" in lines
    assert "export HF_HOME=/scratch/hf" in lines
    assert ("export OTELA_BOOTSTRAP=/ip4/127.0.0.1/tcp/1/p2p/a,/ip4/127.0.0.1/tcp/2/p2p/b"
            in lines)
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)

    # the engine command as otela receives it: the port filled in, quoting intact
    expression = engine_command(deployment, Shape(2, "gh200"), cluster)
    out = subprocess.run(["bash", "-c", f"port=20007; ENGINE={expression}; printf %s \"$ENGINE\""],
                         capture_output=True, text=True, check=True).stdout
    assert shlex.split(out) == [
        "apptainer", "exec", "--nv", "/img/vllm.sif", "vllm", "serve", "Qwen/Qwen3-8B",
        "--port", "20007", "--tensor-parallel-size", "2", "--name", "q 8b"]


def test_comments_round_trip_and_foreign_jobs_are_ignored():
    text = comment("lab", "qwen", "abc", "alps", ("drain",))
    fields, marks = parse_comment(text) or ({}, frozenset())
    assert fields == {"fleet": "lab", "deployment": "qwen", "spec": "abc", "cluster": "alps"}
    assert marks == {"drain"}
    assert parse_comment("someone else's job") is None
    assert parse_comment("otela-fleet fleet=lab") is None


def test_squeue_lines_become_jobs_on_the_controllers_clock():
    assert SQUEUE_FORMAT.count("|") == 8
    # The cluster's clock is 100 s behind ours and in UTC+2.
    there = 1_800_000_000
    text = "\n".join([
        f"{there} +0200",
        "11|RUNNING|2027-01-15T10:00:00|2027-01-15T10:00:30|N/A|1:00:00|normal|None|"
        + comment("lab", "qwen", "s1", "alps"),
        "12|PENDING|2027-01-15T10:05:00|N/A|N/A|1:30:00|normal|Priority|"
        + comment("lab", "qwen", "s1", "alps"),
        "13|FAILED|2027-01-15T09:00:00|2027-01-15T09:00:10|2027-01-15T09:00:40|0:00|normal|"
        "NonZeroExitCode|" + comment("lab", "qwen", "s0", "alps", ("failed",)),
        "14|RUNNING|2027-01-15T10:00:00|2027-01-15T10:00:30|N/A|1:00:00|normal|None|"
        + comment("other", "qwen", "s1", "alps"),  # another fleet
        "15|RUNNING|2027-01-15T10:00:00|2027-01-15T10:00:30|N/A|1:00:00|normal|None|"
        + comment("lab", "qwen", "s1", "lab"),  # another cluster's (same Slurm)
        "16|RUNNING|x|y|z|1:00|normal|None|a plain job",
    ])
    now = there + 100.0
    jobs = parse_squeue(text, "lab", "alps", now)
    assert [j.job_id for j in jobs] == ["11", "12", "13"]
    running, pending, failed = jobs
    assert running.state is JobState.RUNNING and running.ends_at == now + 3600
    from datetime import datetime, timedelta, timezone
    start = datetime(2027, 1, 15, 10, 0, 30, tzinfo=timezone(timedelta(hours=2))).timestamp()
    assert running.started_at == start + 100.0
    assert running.started_at - running.submitted_at == 30
    assert pending.state is JobState.PENDING and pending.reason == "Priority"
    assert pending.started_at is None and pending.ends_at is None
    assert failed.state is JobState.FAILED and failed.marks == {"failed"}
    assert failed.ended_at is not None and failed.spec == "s0"


def test_ssh_argv_never_asks_for_a_password():
    fleet = parse(FLEET)
    argv = SlurmClient(fleet.clusters["alps"]).argv("squeue --me")
    assert argv[:3] == ["ssh", "-o", "BatchMode=yes"]
    assert argv[-3:-1] == ["me@login", "--"] and "-p" in argv
    assert shlex.split(argv[-1]) == ["sh", "-c", "squeue --me"]


def test_the_node_reads_its_fleet_tag_from_the_job_environment():
    env = {"OTELA_FLEET_TAG": "fleet=lab,deployment=qwen,spec=abc,cluster=alps",
           "SLURM_JOB_ID": "42"}
    tag = fleet_tag_from_env(env)
    assert tag is not None and (tag.deployment, tag.job_id, tag.cluster) == ("qwen", "42",
                                                                             "alps")
    assert fleet_tag_from_env({"SLURM_JOB_ID": "42"}) is None
    assert fleet_tag_from_env({**env, "OTELA_FLEET_TAG": "fleet=lab"}) is None
    assert fleet_tag_from_env({k: v for k, v in env.items() if k != "SLURM_JOB_ID"}) is None


PACKED = FLEET.replace('memory = "64G"', 'memory = "64G"\nwhole_nodes = true').replace(
    "gpus = 2", "gpus = 1")
FAKE_OTELA = """#!/bin/bash
# stands in for `otela start`: records what it got, exits as told, drains on TERM
slot=${OTELA_HOME##*-}
trap 'echo "$slot TERM" >> "$LOG/signals"; exit 0' TERM
echo "$slot $CUDA_VISIBLE_DEVICES $3" >> "$LOG/started"
if [ "$slot" = "$FAIL_SLOT" ]; then sleep 0.5; exit 3; fi
while :; do sleep 0.05; done
"""


def run_packed(tmp_path: Path, fail_slot: str = "") -> tuple[subprocess.Popen[str], Path]:
    import os
    fake = tmp_path / "fake-otela"
    fake.write_text(FAKE_OTELA)
    fake.chmod(0o755)
    fleet = parse(PACKED.replace('provider_id = "cscs"', f'otela = "{fake}"'))
    cluster, deployment = fleet.clusters["alps"], fleet.deployments[0]
    script = render(fleet, cluster, deployment, "abc", Shape(1, "gh200"), size=4)
    assert "--gres=gpu:gh200:4" in script and "--exclusive" in script
    assert 'comment="otela-fleet fleet=lab deployment=qwen spec=abc cluster=alps n=4"' in script
    (tmp_path / "job.sh").write_text(script.replace("module load", ": module load"))
    env = {**os.environ, "SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "4,5,6,7",
           "LOG": str(tmp_path), "FAIL_SLOT": fail_slot}
    process = subprocess.Popen(["bash", str(tmp_path / "job.sh")], cwd=tmp_path, env=env,
                               text=True, start_new_session=True)
    return process, tmp_path


@contextmanager
def packed_job(tmp_path: Path, fail_slot: str = "") -> Iterator[subprocess.Popen[str]]:
    """The packed script running; whatever the test does, its processes are gone after."""
    import os
    import signal as signals
    process, _ = run_packed(tmp_path, fail_slot)
    try:
        yield process
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signals.SIGKILL)
        process.wait(10)


def wait_lines(path: Path, count: int) -> list[str]:
    from otela.testing.localfed import wait_for
    wait_for(lambda: path.exists() and len(path.read_text().splitlines()) >= count, 10,
             f"{count} lines in {path.name}", interval=0.02)
    return sorted(path.read_text().splitlines())


def test_a_packed_job_runs_one_node_per_gpu_and_passes_a_drain_on_once(tmp_path: Path):
    import signal as signals
    with packed_job(tmp_path) as process:
        started = wait_lines(tmp_path / "started", 4)
        assert [line.split()[:2] for line in started] == [["0", "4"], ["1", "5"],
                                                           ["2", "6"], ["3", "7"]]
        ports = {line.split("--port ")[1].split()[0] for line in started}
        assert len(ports) == 4  # each engine its own port
        process.send_signal(signals.SIGTERM)
        assert process.wait(10) == 0  # drained: the job ends COMPLETED
        assert wait_lines(tmp_path / "signals", 4) == ["0 TERM", "1 TERM", "2 TERM",
                                                       "3 TERM"]


def test_a_packed_job_fails_as_a_whole_when_one_replica_fails(tmp_path: Path):
    with packed_job(tmp_path, fail_slot="2") as process:
        assert process.wait(10) == 3  # the job FAILED: the controller replaces all of it
        assert wait_lines(tmp_path / "signals", 3) == ["0 TERM", "1 TERM", "3 TERM"]
