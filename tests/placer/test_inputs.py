"""Pools, demand files, curves, memP and sbatch rendering (pure pieces)."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from simulator.placer.curves import ConfigKey, Curve, Point, envelope_pieces, envelope_value
from simulator.placer.demand import SLO, DemandError, demand_from_mapping, precision_label
from simulator.placer.memp import memp
from simulator.placer.pool import PoolError, pool_from_mapping, pool_from_records, resolve_gpu
from simulator.placer.sbatch import ENGINES, Job, TemplateError, engine_command, write_scripts
from simulator.placer.scenarios import table1_demand, table1_pool
from simulator.roofline import Precision


@pytest.mark.parametrize("name, mem_gb, key", [
    ("NVIDIA A100-SXM4-80GB", 85.0, "a100-80g-sxm"),
    ("NVIDIA A100-SXM4-40GB", 42.5, "a100-40g-sxm"),
    ("NVIDIA A100 80GB PCIe", 85.0, "a100-80g-pcie"),
    ("NVIDIA GH200 480GB", 102.0, "gh200"),
    ("NVIDIA H100 80GB HBM3", 85.0, "h100-sxm"),
    ("NVIDIA L40S", 48.0, "l40s"),
    ("gh200", 0, "gh200"),
])
def test_gpu_names_as_nodes_report_them(name: str, mem_gb: float, key: str) -> None:
    assert resolve_gpu(name, int(mem_gb * 1e9)) == key


def test_unknown_gpu_names_ask_for_a_mapping() -> None:
    with pytest.raises(PoolError, match="--gpu-map"):
        resolve_gpu("Acme Tensor 9000")
    assert resolve_gpu("Acme Tensor 9000", aliases={"Acme Tensor 9000": "h100"}) == "h100-sxm"


def test_pool_file() -> None:
    pool = pool_from_mapping({"hosts": [
        {"name": "gh", "gpu": "gh200", "gpus_per_host": 4, "count": 2, "partition": "normal"},
        {"gpu": "a100-80g-pcie", "gpus": 2, "interconnect": "pcie4"},
    ]})
    assert [h.name for h in pool.hosts] == ["gh-0", "gh-1", "a100-80g-pcie-1"]
    assert pool.total_gpus == 10 and pool.hosts[0].partition == "normal"
    assert pool.hosts[2].variant.spec().interconnect_bw == 64e9
    assert len(pool.classes()) == 2
    for bad, msg in [({"hosts": []}, "no \\[\\[hosts"), ({"hosts": [{"gpu": "h100"}]}, "positive"),
                     ({"hosts": [{"gpu": "h100", "gpus": 1, "colour": 1}]}, "unknown keys"),
                     ({"hosts": [{"gpu": "zz9", "gpus": 1}]}, "unknown GPU"),
                     ({"hosts": [{"gpu": "h100", "gpus": 1, "interconnect": "wet"}]},
                      "interconnect")]:
        with pytest.raises(PoolError, match=msg):
            pool_from_mapping(bad)  # type: ignore[arg-type]


def test_pool_from_registry_records() -> None:
    gpu = {"name": "NVIDIA GH200 480GB", "memory_bytes": 102_000_000_000}
    nodes = [
        {"peer_id": "12D3KooWidle", "provider_id": "lab", "state": "SERVING", "idle": True,
         "http_url": "http://n1:8092", "hardware": {"gpus": [gpu] * 4},
         "slurm": {"job_id": "7", "partition": "normal"}},
        {"peer_id": "12D3KooWbusy", "provider_id": "lab", "state": "SERVING", "idle": False,
         "http_url": "http://n2:8092", "hardware": {"gpus": [gpu]}},
        {"peer_id": "12D3KooWcpu", "provider_id": "lab", "state": "JOIN", "idle": True,
         "http_url": "http://n3:8092", "hardware": {"gpus": []}},
        {"peer_id": "12D3KooWgone", "provider_id": "lab", "state": "LEFT", "idle": True,
         "hardware": {"gpus": [gpu]}},
    ]
    pool = pool_from_records(nodes)
    assert len(pool.hosts) == 1
    h = pool.hosts[0]
    assert (h.gpus, h.variant.gpu, h.peer_id, h.partition) == (4, "gh200", "12D3KooWidle",
                                                               "normal")
    assert len(pool.skipped) == 1 and "no GPUs" in pool.skipped[0]


def test_demand_file_and_errors() -> None:
    d = demand_from_mapping({"ttft": 2, "models": [
        {"model": "llama-3.1-8b", "rate": 5, "input": "normal:500,100", "output": "64",
         "e2e": 30, "tp": [1, 2]},
    ]})
    s = d.services[0]
    assert s.name == "meta-llama/Llama-3.1-8B-Instruct" and s.tp == (1, 2)
    assert s.slo == SLO(ttft_s=2.0, e2e_s=30.0)
    for bad, msg in [({"models": [{"model": "nope", "rate": 1, "input": "1", "output": "1"}]},
                      "unknown model"),
                     ({"models": [{"model": "llama-3.1-8b", "input": "1", "output": "1"}]},
                      "rate"),
                     ({"models": [{"model": "llama-3.1-8b", "rate": -1, "input": "1",
                                   "output": "1"}]}, "positive"),
                     ({"models": [{"model": "llama-3.1-8b", "rate": 1, "input": "gauss:1",
                                   "output": "1"}]}, "unknown length"),
                     ({"models": [{"model": "llama-3.1-8b", "rate": 1, "input": "1",
                                   "output": "1", "tp": [3]}]}, "tp must")]:
        with pytest.raises(DemandError, match=msg):
            demand_from_mapping(bad)  # type: ignore[arg-type]


def test_a_demand_entry_names_the_checkpoints_precision() -> None:
    """A model served from a quantized checkpoint says so with the simulator's own names
    (``weight_bits``, ``act_bits``, ``kv_bits``, ``weight_format``); BF16 by default."""
    entry = {"model": "llama-3.3-70b", "rate": 1, "input": "512", "output": "128"}
    bf16, fp8, awq = demand_from_mapping({"models": [
        {**entry, "name": "a"},
        {**entry, "name": "b", "weight_bits": 8, "act_bits": 8},
        {**entry, "name": "c", "weight_bits": 4, "kv_bits": 8, "weight_format": "int4-g128"},
    ]}).services
    assert bf16.precision == Precision() and precision_label(bf16.precision) == ""
    assert fp8.precision == Precision(8, 8, 16)
    assert precision_label(fp8.precision) == "fp8 w8a8"
    assert precision_label(awq.precision) == "int4-g128 w4a16 kv8"
    for bad, msg in [({"weight_bits": 5}, "4, 8 or 16"), ({"kv_bits": "fp8"}, "number of bits"),
                     ({"weight_format": "gguf"}, "not one of")]:
        with pytest.raises(DemandError, match=msg):
            demand_from_mapping({"models": [{**entry, **bad}]})


def test_demand_from_a_trace(tmp_path: Path) -> None:
    from otela.tracing.schema import TraceRecord, make_header
    from traces.io import Trace, write_trace

    recs = [TraceRecord(arrival=i * 0.5, model="m", input_tokens=100 + i, output_tokens=10)
            for i in range(41)]
    path = write_trace(tmp_path / "t.jsonl", Trace(make_header("test"), recs))
    d = demand_from_mapping({"models": [{"model": "llama-3.1-8b", "name": "m",
                                         "trace": path.name}]}, base=tmp_path)
    s = d.services[0]
    assert s.rate == pytest.approx(2.0)
    assert s.input.label.startswith("empirical:input(n=41")


def _curve() -> Curve:
    def pt(load: float, e2e: float, ttft: float) -> Point:
        stats = {"e2e": {"mean": e2e, "p90": e2e}, "ttft": {"mean": ttft, "p90": ttft},
                 "tpot": {"mean": 0.01, "p90": 0.01}}
        return Point(load, stats)
    return Curve(ConfigKey("m", "g", 1, "i", "o"), mu=10.0, sat_latency=5.0,
                 points=(pt(1, 1.0, 0.1), pt(5, 2.0, 0.5), pt(9, 4.0, 1.5)), gpus=1)


def test_curve_latency_fluid_overload_and_slo_capacity() -> None:
    c = _curve()
    assert c.latency(3, 300) == pytest.approx(1.5)
    assert c.latency(10, 300) == pytest.approx(5.0)  # saturated in-engine latency at mu
    assert c.latency(20, 300) == pytest.approx(5.0 + 150.0)  # H/2 * (rho/mu - 1)
    assert c.slo_capacity(SLO(ttft_s=1.0)) == pytest.approx(7.0)  # TTFT 0.5 -> 1.5 over 5..9
    assert c.slo_capacity(SLO(ttft_s=0.05)) == 0.0
    assert c.slo_capacity(SLO()) == 10.0
    pieces = c.pieces(30.0, 300)
    for x, y in c.g_points(30.0, 300):  # the envelope never exceeds the points ...
        assert envelope_value(pieces, x) <= y + 1e-9
    slopes = [b for _, b in pieces]
    assert slopes == sorted(slopes)  # ... and is convex


def test_envelope_of_convex_points_passes_through_them() -> None:
    pts = [(0.0, 0.0), (1.0, 1.0), (2.0, 3.0), (3.0, 7.0)]
    pieces = envelope_pieces(pts)
    assert [envelope_value(pieces, x) for x, _ in pts] == pytest.approx([y for _, y in pts])


def test_memp_reproduces_the_papers_table_1_row() -> None:
    got = sorted((g.service.split("/")[1], g.variant, g.tp, g.replicas * g.tp)
                 for g in memp(table1_demand().services, table1_pool()))
    assert got == [("CodeLlama-34b-hf", "a100-80g-sxm", 2, 16),
                   ("Llama-2-13b-hf", "a100-80g-sxm", 1, 4),
                   ("Llama-3.3-70B-Instruct", "a100-80g-sxm", 4, 4),
                   ("Llama-3.3-70B-Instruct", "gh200", 4, 32)]


def test_memp_sizes_a_quantized_checkpoint_at_the_bits_it_stores() -> None:
    """The paper's rule (weights at most half the smallest GPU) on an FP8 70B: half the
    bytes of BF16, so TP2 where the BF16 row has TP4."""
    services = [replace(s, precision=Precision(8, 8, 16)) if "70B" in s.name else s
                for s in table1_demand().services]
    tps = {(g.service.split("/")[1], g.tp) for g in memp(services, table1_pool())}
    assert ("Llama-3.3-70B-Instruct", 2) in tps and ("Llama-3.3-70B-Instruct", 4) not in tps
    assert ("CodeLlama-34b-hf", 2) in tps  # the BF16 models as before


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_sbatch_scripts_pass_bash_n(tmp_path: Path, engine: str) -> None:
    jobs = [Job("meta-llama/Llama-2-13b-hf", 1, "a100-80g-sxm", "a100-0", "a100", "nvlink"),
            Job("meta-llama/Llama-3.3-70B-Instruct", 4, "gh200", "gh200-1")]
    paths = write_scripts(tmp_path, jobs, engine)
    assert len(paths) == 2
    for p in paths:
        subprocess.run(["bash", "-n", str(p)], check=True)
    one, four = (p.read_text() for p in paths)
    assert "#SBATCH --gres=gpu:1" in one and "#SBATCH --partition=a100" in one
    assert "#SBATCH --constraint=nvlink" in one and "MODEL=${MODEL:-meta-llama/Llama-2-13b-hf}" \
        in one
    assert "#SBATCH --gres=gpu:4" in four and "TP=${TP:-4}" in four
    assert four.count("TP=${TP:-") == 1
    assert f'ENGINE_COMMAND=${{ENGINE_COMMAND:-"{engine_command(engine)}"}}' in four


def test_sbatch_custom_engine_command_and_errors(tmp_path: Path) -> None:
    assert engine_command("vllm", "srv --m {model} --p {port} --tp {tp}") == \
        "srv --m $MODEL --p $PORT --tp $TP"
    with pytest.raises(TemplateError):
        engine_command("vllm", "srv {evil}")
    with pytest.raises(TemplateError):
        engine_command("tgi")
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "vllm.sbatch").write_text("#!/bin/bash\necho hi\n")
    with pytest.raises(TemplateError, match="lacks"):
        write_scripts(tmp_path / "o", [Job("m", 1, "g")], templates=tmp_path / "t")
    for model in ("m}; rm -rf ~; echo {", "$(id)", "m/../../etc", "-x"):  # into a shell script
        with pytest.raises(TemplateError, match="not a model id"):
            write_scripts(tmp_path / "o", [Job(model, 1, "g")])
