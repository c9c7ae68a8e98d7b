"""The sbatch script of one replica: ``otela start`` around the deployment's engine,
tagged so that Slurm and the registry both say which fleet, deployment and spec it is.

The tag goes in the job's comment (``otela-fleet fleet=F deployment=D spec=H
cluster=C``: what a restarted controller reads back with ``squeue``) and in
``OTELA_FLEET_TAG`` (what the node puts in its registry record). The node drains itself
``drain_margin`` before the wall time (the hard margin; the controller usually drains it
earlier, once a successor serves). Pure.
"""

from __future__ import annotations

import shlex

from otela.fleet.identity import Shape
from otela.fleet.spec import Cluster, Deployment, Fleet, format_time_limit

COMMENT_PREFIX = "otela-fleet"


def comment(fleet: str, deployment: str, spec: str, cluster: str,
            marks: tuple[str, ...] = (), size: int = 1) -> str:
    """The job comment that identifies a replica (``n=K``: a job of K replicas; with
    ``marks``, what the controller decided about it: ``drain``, ``failed``)."""
    return " ".join([COMMENT_PREFIX, f"fleet={fleet}", f"deployment={deployment}",
                     f"spec={spec}", f"cluster={cluster}",
                     *([f"n={size}"] if size > 1 else []), *marks])


def parse_comment(text: str) -> tuple[dict[str, str], frozenset[str]] | None:
    """The fields and marks of a fleet job's comment; ``None`` for any other job."""
    words = text.split()
    if not words or words[0] != COMMENT_PREFIX:
        return None
    fields = dict(w.split("=", 1) for w in words[1:] if "=" in w)
    if not {"fleet", "deployment", "spec", "cluster"} <= fields.keys():
        return None
    return fields, frozenset(w for w in words[1:] if "=" not in w)


def job_name(fleet: str, deployment: str) -> str:
    return f"otela-{fleet}-{deployment}"


def engine_command(deployment: Deployment, shape: Shape, cluster: Cluster) -> str:
    """The engine command as a bash expression: placeholders filled, ``{port}`` left to
    the job's ``$port``, wrapped in the cluster's container template."""
    text = deployment.command
    if cluster.container:
        text = cluster.container.replace("{command}", text)
    text = (text.replace("{model}", deployment.model).replace("{gpus}", str(shape.gpus))
            .replace("{tp}", str(max(shape.gpus, 1))))
    parts = text.split("{port}")
    return '"$port"'.join(shlex.quote(p) if p else "" for p in parts) or "''"


def render(fleet: Fleet, cluster: Cluster, deployment: Deployment, spec: str,
           shape: Shape, size: int = 1) -> str:
    """The whole script, for ``sbatch`` on its standard input. ``size`` replicas share the
    job (a whole-node partition): one ``otela start`` each, on its own slice of the job's
    GPUs."""
    sbatch = [
        f"--job-name={job_name(fleet.name, deployment.name)}",
        f'--comment="{comment(fleet.name, deployment.name, spec, cluster.name, (), size)}"',
        "--nodes=1",
        "--ntasks=1",
        f"--time={format_time_limit(cluster.time_limit)}",
        f"--cpus-per-task={cluster.cpus_per_job}",
    ]
    for flag, value in (("partition", cluster.partition), ("account", cluster.account),
                        ("qos", cluster.qos), ("mem", cluster.memory)):
        if value:
            sbatch.append(f"--{flag}={value}")
    if shape.gpus:
        kind = f"{shape.gpu_type}:" if shape.gpu_type else ""
        sbatch.append(f"--gres=gpu:{kind}{shape.gpus * size}")
    if cluster.whole_nodes:
        sbatch.append("--exclusive")
    sbatch += cluster.sbatch_args
    otela = cluster.otela or fleet.otela
    env = {
        "OTELA_BOOTSTRAP": ",".join(fleet.bootstrap),
        "OTELA_FLEET_TAG": f"fleet={fleet.name},deployment={deployment.name},spec={spec},"
                           f"cluster={cluster.name}",
        "OTELA_SLURM_DRAIN_MARGIN": f"{cluster.drain_margin:g}",
        "OTELA_DRAIN_GRACE": "15",
        "OTELA_ENGINE_STOP_GRACE": "8",
        **({"OTELA_PROVIDER_ID": fleet.provider_id} if fleet.provider_id else {}),
        **cluster.env,
        **deployment.env,
        **deployment.otela,
    }
    lines = ["#!/bin/bash"]
    lines += [f"#SBATCH {arg}" for arg in sbatch]
    lines += [
        f"# Written by `otela fleet` (fleet {fleet.name}): {size} replica(s) of deployment "
        f"{deployment.name}, spec {spec}, model {deployment.model}.",
        "set -eo pipefail",
    ]
    lines += [f"module load {shlex.quote(m)}" for m in cluster.modules]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in env.items()]
    lines += [
        'export OTELA_LOG_SINK="${OTELA_LOG_SINK:-$PWD/engine-logs}"',
        "export OTELA_HTTP_PORT=${OTELA_HTTP_PORT:-0} OTELA_P2P_PORT=${OTELA_P2P_PORT:-0}",
        "# The engine's port: the first free one from a port derived from the job id.",
        "free_port() {",
        "    local port=$1",
        '    while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done',
        '    echo "$port"',
        "}",
    ]
    command = f"ENGINE_COMMAND={engine_command(deployment, shape, cluster)}"
    start = f'exec {otela} start --process "$ENGINE_COMMAND"'
    if size == 1:
        return "\n".join([
            *lines,
            'export OTELA_HOME="$PWD/homes/job-$SLURM_JOB_ID"',
            "port=$(free_port $((20000 + SLURM_JOB_ID % 20000)))",
            command,
            "# exec: otela is the job's main process, so `scancel --batch` signals it alone.",
            start,
        ]) + "\n"
    return "\n".join([
        *lines,
        f"# {size} replicas, each an otela node with {shape.gpus} GPU(s) of the job's.",
        'IFS=, read -ra gpus <<< "${CUDA_VISIBLE_DEVICES:-}"',
        "pids=()",
        "forwarded=0",
        "# A drain (`scancel --batch --signal=TERM`) reaches this shell alone: pass it on,",
        "# once (a second TERM tells a draining node to leave at once).",
        'forward() { [ "$forwarded" = 1 ] || { forwarded=1; kill -TERM "${pids[@]}" '
        "2>/dev/null || true; }; }",
        "trap forward TERM INT",
        f"for slot in $(seq 0 {size - 1}); do",
        "    (",
        '        export OTELA_HOME="$PWD/homes/job-$SLURM_JOB_ID-$slot"',
        f"        if [ ${{#gpus[@]}} -ge {shape.gpus * size} ] && [ {shape.gpus} -gt 0 ]; then",
        f'            export CUDA_VISIBLE_DEVICES=$(IFS=,; echo "${{gpus[*]:$((slot * '
        f'{shape.gpus})):{shape.gpus}}}")',
        "        fi",
        "        port=$(free_port $((20000 + (SLURM_JOB_ID % 200) * 100 + slot * 10)))",
        f"        {command}",
        f"        {start}",
        "    ) &",
        "    pids+=($!)",
        "done",
        "# Fail-stop: the first replica to fail ends the others and the job (exit status),",
        "# so the controller replaces the whole job; replicas that drained exit 0.",
        "# (`wait -n` returns early when a signal ran the trap: then nobody ended. A reaped",
        "# replica no longer answers kill -0; bash 4.3's `wait -n` suffices.)",
        f"status=0 last={size}",
        "while :; do",
        "    code=0",
        "    wait -n || code=$?",
        "    running=0",
        '    for pid in "${pids[@]}"; do',
        '        if kill -0 "$pid" 2>/dev/null; then running=$((running + 1)); fi',
        "    done",
        '    if [ "$running" -lt "$last" ]; then',
        '        if [ "$code" -ne 0 ] && [ "$status" = 0 ]; then status=$code; forward; fi',
        "        last=$running",
        "    fi",
        '    [ "$running" -gt 0 ] || break',
        "done",
        'exit "$status"',
    ]) + "\n"
