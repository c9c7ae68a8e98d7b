"""An ingress restarted while its federation serves: its first requests are answered, not
told that the model does not exist while its replica is still empty (issue 36)."""

from __future__ import annotations

import pytest

from otela.testing.localfed import free_port, wait_for

from .helpers import CONVERGE_S, chat, serving_node, wait_state

pytestmark = pytest.mark.slow

MODEL = "warm-model"


def test_a_restarted_ingress_answers_its_first_requests_instead_of_404(federation):
    boot_port = free_port()  # the ingress keeps its address: the serving node calls back
    ingress = federation.start_node("ingress", ingress=True, p2p_port=boot_port)
    server = serving_node(federation, "server", ingress, MODEL)
    wait_state(ingress, server, "SERVING")
    assert chat(ingress, MODEL).status_code == 200
    assert federation.stop_node(ingress) == 0

    # Restarted on its home (its peers remembered) and asked at once, while it knows no
    # model yet: every answer is the engine's, or a 503 to retry; never a 404.
    ingress = federation.start_node("ingress", ingress=True, p2p_port=boot_port)
    health = ingress.get("/v1/health")
    statuses = []
    answered = wait_for(lambda: (statuses.append(chat(ingress, MODEL).status_code)
                                 or statuses[-1] == 200), CONVERGE_S,
                        "the restarted ingress to answer")
    assert answered and 404 not in statuses, statuses
    assert set(statuses) <= {200, 503}, statuses
    assert health["registry_warming"] in (True, False)
    wait_for(lambda: not ingress.get("/v1/health")["registry_warming"], CONVERGE_S,
             "the replica to be warm")
    # warm: a model nobody serves is a 404 again, at once
    missing = chat(ingress, "no-such-model")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"
    assert "registry_warming" not in ingress.get("/v1/models")
