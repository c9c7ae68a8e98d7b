"""The fleet file: every error names the file, the line and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from otela.fleet.errors import FleetFileError
from otela.fleet.identity import Shape, spec_hash
from otela.fleet.spec import format_time_limit, load, parse, parse_time_limit

EXAMPLE = Path(__file__).resolve().parents[2] / "otela" / "fleet" / "example.toml"

BASE = """\
[fleet]
name = "lab"
bootstrap = ["/ip4/127.0.0.1/tcp/1/p2p/x"]
ingress = ["http://127.0.0.1:8092"]

[clusters.a]
partition = "gpu"
gpu_type = "h100"
gpus_per_node = 4

[clusters.b]
ssh = "me@login"
gpus_per_node = 8
gpu_type = "a100-80g-sxm"

[[deployments]]
name = "one"
model = "Qwen/Qwen3-8B"
command = "vllm serve {model} --port {port}"
replicas = 1

[[deployments]]
name = "two"
model = "m"
command = "serve --port {port}"
min = 0
max = 3
[deployments.autoscale]
target_rps = 2
"""


def error_of(text: str) -> FleetFileError:
    with pytest.raises(FleetFileError) as info:
        parse(text, Path("f.toml"))
    return info.value


def line_of(text: str, needle: str, nth: int = 1) -> int:
    hits = [i + 1 for i, line in enumerate(text.splitlines()) if line.startswith(needle)]
    return hits[nth - 1]


def test_the_example_written_by_init_parses():
    fleet = load(EXAMPLE)
    assert fleet.name == "lab" and set(fleet.clusters) == {"alps", "lab"}
    assert [d.name for d in fleet.deployments] == ["qwen3-8b", "llama-70b"]
    llama = fleet.deployment("llama-70b")
    assert llama.autoscaled and (llama.min, llama.max) == (0, 4)
    assert llama.otela == {"OTELA_MODEL_META": "family=llama3"}


def test_a_valid_file():
    fleet = parse(BASE)
    assert fleet.clusters["b"].ssh == "me@login"
    assert fleet.deployments[0].clusters == ("a", "b")
    assert fleet.deployments[1].autoscale is not None
    assert fleet.deployments[1].autoscale.target_rps == 2.0


@pytest.mark.parametrize("change, needle, nth, field, message", [
    (("replicas = 1", "replicas = 1\ncolour = 3"), "colour", 1, "deployments[0].colour",
     "unknown field"),
    (("replicas = 1", "replicas = 1\ngpus = 8"), "gpus =", 1, "deployments[0].gpus",
     "8 GPU(s) per replica do not fit cluster 'a', whose nodes have 4 GPU(s) per node"),
    (('model = "m"', 'model = "m"\ngpu_types = ["l4"]'), "gpu_types", 1,
     "deployments[1].gpu_types", "none of the allowed clusters (a, b) has l4"),
    (('model = "Qwen/Qwen3-8B"', 'model = "deepseek-v3"'), "model", 1,
     "deployments[0].model", "deepseek-v3 fits no allowed GPU"),
    (("target_rps = 2", "target_rps = -1"), "target_rps", 1,
     "deployments[1].autoscale.target_rps", "must be a positive number"),
    (('partition = "gpu"', 'partition = "gpu"\ntime_limit = "soon"'), "time_limit", 1,
     "clusters.a.time_limit", "not a Slurm time limit"),
    (("gpus_per_node = 8", "gpus_per_node = 8\ndrain_margin = \"2h\"\ntime_limit = 60"),
     "drain_margin", 1, "clusters.b.drain_margin", "leaves nothing of the time limit"),
    (("replicas = 1", "replicas = 1\nmin = 1"), "replicas", 1, "deployments[0].replicas",
     "either replicas or min/max"),
    (('command = "serve --port {port}"', 'command = "serve --port {port} {weights}"'),
     "command", 2, "deployments[1].command", "unknown placeholder {weights}"),
    (('name = "two"', 'name = "one"'), "name", 3, "deployments[1].name",
     "'one' is declared twice"),
    (('replicas = 1', 'replicas = 1\nclusters = ["c"]'), "clusters", 1,
     "deployments[0].clusters", "unknown cluster 'c'"),
    (('gpu_type = "h100"', 'gpu_type = "h1000"'), "gpu_type", 1, "clusters.a.gpu_type",
     "unknown GPU 'h1000'"),
    (("--port {port}\"", "--port {port} --quantization fp8\""), "command", 1,
     "deployments[0].command", "quantizes the weights (--quantization fp8): say what"),
    (("--port {port}\"", "--port {port} --kv-cache-dtype=fp8_e4m3\"\nweight_bits = 8"),
     "command", 1, "deployments[0].command", "say kv_bits = 8"),
    (("replicas = 1", "replicas = 1\nweight_bits = 6"), "weight_bits", 1,
     "deployments[0].weight_bits", "must be 4, 8 or 16 bits, not 6"),
    (("replicas = 1", "replicas = 1\nweight_format = \"fp9\""), "weight_format", 1,
     "deployments[0].weight_format", "'fp9' is not one of bf16, fp8"),
])
def test_errors_name_file_line_and_field(change, needle, nth, field, message):
    text = BASE.replace(*change, 1)
    error = error_of(text)
    assert error.field == field
    assert error.line == line_of(text, needle, nth), str(error)
    assert message in error.message, str(error)
    assert str(error).startswith(f"f.toml:{error.line}: {field}: ")


def test_the_memory_check_sizes_the_checkpoint_at_the_precision_it_stores():
    one_gpu_70b = BASE.replace('model = "Qwen/Qwen3-8B"',
                               'model = "llama-3.3-70b"\ngpus = 1\nclusters = ["a"]')
    # 70B in BF16 is ~131 GiB: no single H100 holds it
    assert "llama-3.3-70b fits no allowed GPU" in error_of(one_gpu_70b).message
    fp8 = one_gpu_70b.replace("gpus = 1", "gpus = 1\nweight_bits = 8\nact_bits = 8")
    deployment = parse(fp8).deployments[0]  # ~66 GiB in FP8: one H100 holds it
    assert (deployment.precision.weight_bits, deployment.precision.act_bits,
            deployment.precision.kv_bits) == (8, 8, 16)
    assert parse(BASE).deployments[0].precision.weight_bits == 16  # BF16 unless said
    quantized = fp8.replace("--port {port}\"", "--port {port} --quantization fp8\"", 1)
    assert parse(quantized).deployments[0].precision.weight_bits == 8
    # another engine's -q (quiet), or --quantization none, quantizes nothing
    for flags in ("-q --port {port}", "--port {port} --quantization none"):
        quiet = BASE.replace("--port {port}\"", flags + "\"", 1)
        assert parse(quiet).deployments[0].precision.weight_bits == 16


def test_toml_syntax_errors_name_the_line():
    error = error_of(BASE.replace("replicas = 1", "replicas = = 1"))
    assert error.line == line_of(BASE, "replicas") and "not valid TOML" in str(error)


def test_missing_parts():
    assert "a [fleet] table is required" in str(error_of("[clusters.a]\n"))
    no_ingress = BASE.replace('ingress = ["http://127.0.0.1:8092"]\n', "")
    assert error_of(no_ingress).field == "fleet.ingress"
    no_target = BASE.replace("target_rps = 2", "")
    assert "needs target_rps or target_in_flight" in str(error_of(no_target))


def test_time_limits():
    assert parse_time_limit(90) == 5400
    assert parse_time_limit("30") == 1800
    assert parse_time_limit("04:00:00") == 14400
    assert parse_time_limit("1-02:00:00") == 93600
    assert parse_time_limit("5:30") == 330
    assert format_time_limit(5400) == "0-01:30:00"
    assert format_time_limit(61) == "0-00:02:00"


def test_identity_changes_with_command_or_shape_not_count_or_clusters():
    fleet = parse(BASE)
    one = fleet.deployments[0]
    base = spec_hash(one, Shape(1))
    from dataclasses import replace
    assert spec_hash(replace(one, replicas=5, clusters=("b",)), Shape(1)) == base
    assert spec_hash(replace(one, command="other --port {port}"), Shape(1)) != base
    assert spec_hash(one, Shape(2)) != base
    assert spec_hash(one, Shape(1, "h100-sxm")) != base
    assert spec_hash(replace(one, otela={"OTELA_MODEL_META": "x=y"}), Shape(1)) != base
