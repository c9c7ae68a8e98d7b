"""Fair sharing at a real ingress (``otela.routing.admission``): an ingress with API keys
on SQLite, and one node whose echo engine takes two requests at once (its command's
``--max-concurrency 2``, read by otela) and generates slowly, so the model is contended.

What a user relies on: a request of a better class overtakes those waiting, and a batch
request waits for everyone else; teams flooding the model get tokens in the ratio of
their weights; a request whose deadline passes gets 429 with Retry-After, one whose
client leaves is dropped from the queue; a key cannot use a class better than its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio

from otela.testing.localfed import (
    LocalFederation,
    LocalNode,
    echo_engine_command,
    free_port,
    wait_for,
)

pytestmark = pytest.mark.slow

MODEL = "echo-fair"
ADMIN = "fair-admin-token-0123456789abcdef"
PROMPT = "one two three four five six seven"  # 9 output tokens: "echo: one ... seven"
LONG = " ".join(["word"] * 30)  # 31 output tokens, ~1 s: a backlog builds on a slow machine


@pytest.fixture(scope="module")
def ingress(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNode]:
    root = tmp_path_factory.mktemp("fair")
    with LocalFederation(root) as federation:
        node = federation.start_node(
            "ingress", ingress=True, provider_id="prov-fair",
            extra_args=["--ingress-db", str(root / "fair.db"), "--starvation-after", "60s"],
            extra_env={"OTELA_ADMIN_TOKEN": ADMIN})
        engine = echo_engine_command(free_port(), [MODEL], "--token-delay", "0.03",
                                     "--max-concurrency", "2")
        federation.start_node("server", bootstrap=[node], process=engine,
                              provider_id="prov-fair")
        wait_for(lambda: chat_sync(node, key(node, "probe")).status_code == 200, 60,
                 "the model served through the ingress")
        yield node


_KEYS: dict[tuple[str, str], str] = {}


def admin(node: LocalNode, method: str, path: str, body: Any = None) -> httpx.Response:
    return httpx.request(method, f"{node.http_url}/v1/admin{path}", trust_env=False,
                         timeout=10, headers={"authorization": f"Bearer {ADMIN}"},
                         json=body)


def key(node: LocalNode, owner: str, **scheduling: Any) -> str:
    """A key's secret (made once per owner and settings)."""
    ident = (owner, repr(sorted(scheduling.items())))
    if ident not in _KEYS:
        made = admin(node, "POST", "/keys", {"owner": owner, **scheduling})
        assert made.status_code == 200, made.text
        _KEYS[ident] = made.json()["key"]
    return _KEYS[ident]


def chat_sync(node: LocalNode, secret: str) -> httpx.Response:
    return httpx.post(f"{node.http_url}/v1/chat/completions", trust_env=False, timeout=30,
                      headers={"authorization": f"Bearer {secret}"},
                      json={"model": MODEL, "messages": [{"role": "user", "content": PROMPT}]})


async def chat(client: httpx.AsyncClient, node: LocalNode, secret: str,
               headers: dict[str, str] | None = None, prompt: str = PROMPT) -> httpx.Response:
    return await client.post(
        f"{node.http_url}/v1/chat/completions", timeout=120,
        headers={"authorization": f"Bearer {secret}", **(headers or {})},
        json={"model": MODEL, "messages": [{"role": "user", "content": prompt}]})


def run(main: Any, limit: float = 120) -> None:
    """``trio.run(main)``, failing instead of hanging if a condition never comes."""
    async def bounded() -> None:
        with trio.fail_after(limit):
            await main()

    trio.run(bounded)


def queue_metric(node: LocalNode, name: str) -> float:
    text = httpx.get(f"{node.http_url}/metrics", trust_env=False, timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name))


def test_better_classes_overtake_and_batch_waits_for_everyone(ingress: LocalNode) -> None:
    normal, urgent_key = key(ingress, "normal"), key(ingress, "urgent")
    finished: list[str] = []

    async def one(client: httpx.AsyncClient, name: str, secret: str,
                  headers: dict[str, str] | None = None) -> None:
        answer = await chat(client, ingress, secret, headers, LONG)
        assert answer.status_code == 200, answer.text
        finished.append(name)

    async def main() -> None:
        async with httpx.AsyncClient(trust_env=False) as client, trio.open_nursery() as n:
            for i in range(10):  # two run, eight wait
                n.start_soon(one, client, f"default{i}", normal)
            while queue_metric(ingress, "otela_queue_requests{") < 8:
                await trio.sleep(0.05)
            n.start_soon(one, client, "batch", normal, {"X-Otela-Priority": "batch"})
            n.start_soon(one, client, "urgent", urgent_key,
                         {"X-Otela-Priority": "interactive"})

    run(main)
    print(finished)
    # batch is dispatched after every default request (though sent before one of them):
    # it runs beside the last one, so it is one of the last two to finish
    assert "batch" in finished[-2:]
    assert finished.index("urgent") <= 4  # next after the two running (and a pair racing)


def test_teams_flooding_a_model_get_tokens_by_their_weights(ingress: LocalNode) -> None:
    secrets = {"heavy": key(ingress, "heavy", team="heavy"),
               "light1": key(ingress, "light1", team="light1"),
               "light2": key(ingress, "light2", team="light2")}
    assert admin(ingress, "PUT", "/teams/heavy", {"weight": 3}).status_code == 200
    teams = admin(ingress, "GET", "/teams").json()["data"]
    heavy = next(team for team in teams if team["name"] == "heavy")
    assert (heavy["weight"], heavy["keys"]) == (3.0, 1)
    tokens: Counter[str] = Counter()

    async def flood(client: httpx.AsyncClient, team: str, until: float) -> None:
        while trio.current_time() < until:
            answer = await chat(client, ingress, secrets[team])
            assert answer.status_code == 200, answer.text
            if trio.current_time() < until:
                tokens[team] += answer.json()["usage"]["completion_tokens"]

    async def main() -> None:
        await trio.sleep(1.5)  # the team weight reaches the ingress's key cache (1 s)
        until = trio.current_time() + 15
        async with httpx.AsyncClient(trust_env=False) as client, trio.open_nursery() as n:
            for team in secrets:
                for _ in range(4):  # four clients each: always some waiting
                    n.start_soon(flood, client, team, until)

    run(main)
    print(dict(tokens))
    assert tokens["light1"] / tokens["light2"] == pytest.approx(1, rel=0.25)
    # 3:1 from the first second on would be exact; the first requests are charged a
    # default estimate until the model's typical request is known, which pulls the
    # ratio of a short run towards 1 (benchmarks/fairness.py measures it over minutes)
    assert 2.2 <= tokens["heavy"] / ((tokens["light1"] + tokens["light2"]) / 2) <= 3.6


def test_deadlines_leaving_clients_and_a_keys_best_class(ingress: LocalNode) -> None:
    normal = key(ingress, "normal")
    capped = key(ingress, "capped", priority="default")
    outcomes: dict[str, Any] = {}

    async def keep_full(client: httpx.AsyncClient, stop: trio.Event) -> None:
        while not stop.is_set():
            await chat(client, ingress, normal, prompt=LONG)

    async def main() -> None:
        stop = trio.Event()
        async with httpx.AsyncClient(trust_env=False) as client, trio.open_nursery() as n:
            for _ in range(6):  # two run, four wait, until the checks are done
                n.start_soon(keep_full, client, stop)
            while queue_metric(ingress, "otela_queue_requests{") < 3:
                await trio.sleep(0.05)
            hurried = await chat(client, ingress, normal, {"X-Otela-Queue-Timeout": "0.2"})
            outcomes["hurried"] = hurried
            before = queue_metric(ingress, 'otela_queue_requests_total{model="echo-fair",'
                                  'priority="default",outcome="left"}')
            with trio.move_on_after(0.3):  # a client that gives up while queued
                await chat(client, ingress, normal)
            while queue_metric(ingress, 'otela_queue_requests_total{model="echo-fair",'
                               'priority="default",outcome="left"}') < before + 1:
                await trio.sleep(0.05)
            outcomes["capped"] = await chat(client, ingress, capped,
                                            {"X-Otela-Priority": "interactive"})
            outcomes["unknown"] = await chat(client, ingress, normal,
                                             {"X-Otela-Priority": "vip"})
            stop.set()

    run(main)
    hurried = outcomes["hurried"]
    assert hurried.status_code == 429, hurried.text
    assert hurried.json()["error"]["code"] == "queue_timeout"
    assert int(hurried.headers["retry-after"]) >= 1
    assert outcomes["capped"].status_code == 200
    assert outcomes["capped"].headers["x-otela-priority"] == "default"
    assert outcomes["unknown"].status_code == 400
    assert outcomes["unknown"].json()["error"]["code"] == "invalid_priority"
    assert queue_metric(ingress, "otela_queue_requests{") == 0
