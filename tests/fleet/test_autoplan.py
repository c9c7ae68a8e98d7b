"""``gpus = "auto"``: the placer (simulator + CP-SAT) chooses the replica shape."""

from __future__ import annotations

import pytest

from otela.fleet import autoplan
from otela.fleet.errors import FleetError, FleetFileError
from otela.fleet.identity import spec_hash
from otela.fleet.placement import Placement
from otela.fleet.spec import parse

FILE = """\
[fleet]
name = "auto"
bootstrap = ["/ip4/127.0.0.1/tcp/1/p2p/x"]
ingress = ["http://127.0.0.1:9"]

[clusters.small]
gpu_type = "l4"
gpus_per_node = 4
nodes = 1

[clusters.big]
gpu_type = "a100-80g-sxm"
gpus_per_node = 4
nodes = 1

[[deployments]]
name = "llama"
model = "MODEL"
command = "vllm serve {model} --port {port} --tensor-parallel-size {tp}"
gpus = "auto"
rate = 1
replicas = 1
"""


@pytest.fixture(autouse=True)
def small_simulations(monkeypatch, tmp_path):
    monkeypatch.setenv("OTELA_PLACER_CACHE", str(tmp_path / "placer"))
    monkeypatch.setattr(autoplan, "SIM_REQUESTS", 60)


def test_auto_picks_a_gpu_type_and_tp_that_fit_and_the_clusters_that_have_it():
    fleet = parse(FILE.replace("MODEL", "llama-3.3-70b"))
    placement = Placement(fleet)
    shape, clusters = placement.shape(fleet.deployments[0])
    # 70B in 16-bit weights: no 4 x L4 (96 GB) holds it; 4 x A100-80GB does
    assert (shape.gpus, shape.gpu_type) == (4, "a100-80g-sxm")
    assert clusters == ("big",)
    assert placement.shape(fleet.deployments[0]) == (shape, clusters)  # planned once
    assert spec_hash(fleet.deployments[0], shape) != spec_hash(fleet.deployments[0],
                                                               type(shape)(2, shape.gpu_type))


def test_auto_needs_a_model_the_simulator_knows():
    fleet = parse(FILE.replace("MODEL", "my-own-model"))
    with pytest.raises(FleetError, match="needs a model the simulator knows"):
        Placement(fleet).shape(fleet.deployments[0])


def test_auto_plans_a_quantized_checkpoint_at_its_precision():
    only_l4 = FILE.replace("MODEL", "llama-3.3-70b").replace(
        "replicas = 1", 'replicas = 1\nclusters = ["small"]')
    # in BF16 no L4 pool of four holds a 70B: refused when the file is read
    with pytest.raises(FleetFileError, match="fits no allowed GPU"):
        parse(only_l4)
    fleet = parse(only_l4 + "weight_bits = 8\nact_bits = 8\n")
    shape, clusters = Placement(fleet).shape(fleet.deployments[0])
    # FP8 weights (~66 GiB) over four L4s (24 GB each) leave room for the KV cache
    assert (shape.gpus, shape.gpu_type, clusters) == (4, "l4", ("small",))
