"""Hypothesis fuzzing of every HTTP route of one live node (``http_fuzz.py`` says what is
generated and the rule each answer keeps), a bounded number of examples per route family;
``benchmarks/fuzz.py`` runs many more.

The node (``http_fuzz.start_node``) is an ingress serving an echo model itself, running the
ingress service with an API key and an admin token the fuzzers use half the time, and
opted in to assignments from a planner whose key the test holds. After every test it must
be alive, still route a request, and neither it nor its engine may have logged a
traceback.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from otela.testing.http_fuzz import FUZZERS, Target, start_node, traceback_in
from otela.testing.localfed import LocalFederation, LocalNode

from .helpers import chat

pytestmark = pytest.mark.slow

MODEL = "echo-fuzz"
# About 12 s on one loaded core; raise them in benchmarks/fuzz.py, not here.
EXAMPLES = {"openapi": 800, "inference": 800, "engine_hop": 400, "other": 400,
            "assignments": 400}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalNode, Target]]:
    root = tmp_path_factory.mktemp("fuzz")
    federation = LocalFederation(root / "fed")
    try:
        live, target = start_node(federation, root, MODEL)
        yield live, target
        target.client.close()
    finally:
        federation.close()


@pytest.fixture(autouse=True)
def still_serving(node: tuple[LocalNode, Target]) -> Iterator[None]:
    yield
    live, _ = node
    assert live.process.poll() is None, live.log_tail()
    response = chat(live, MODEL, "still here?")
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "echo: still here?"
    for log in (live.log_path, live.home / "logs" / "engine.log"):
        assert not traceback_in(log), f"{log}:\n{traceback_in(log)}"


def test_the_schema_lists_the_inspection_routes(node: tuple[LocalNode, Target]) -> None:
    _, target = node
    paths = {path for _, path, _ in target.operations()}
    assert {"/v1/health", "/v1/network", "/v1/models", "/v1/models/{model_id}",
            "/v1/registry/nodes", "/v1/registry/nodes/{session_id}", "/v1/assignments",
            "/v1/admin/keys",
            "/v1/admin/keys/{key_id}", "/v1/me", "/v1/load-reports"} <= paths


@pytest.mark.parametrize("family", sorted(EXAMPLES))
def test_fuzzed_requests_never_get_a_5xx_of_the_nodes_making(
    node: tuple[LocalNode, Target], family: str
) -> None:
    _, target = node
    before = sum(target.seen.values())
    FUZZERS[family](target, EXAMPLES[family])
    assert sum(target.seen.values()) - before >= EXAMPLES[family] // 2  # really sent
