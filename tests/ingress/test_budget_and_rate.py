"""Budgets and rates that mean what they say: concurrent requests cannot each spend a
key's last tokens (reserved at admission, settled on completion); ``/v1/me``, the admin
API and ``otela keys`` say "over budget" alike; a limit of N requests per minute admits at
most N in any minute; ``otela usage``'s mean latency is over served requests only."""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ingress.limits import limits_for
from otela.dataplane.errors import RequestError
from otela.testing.localfed import (
    LocalFederation,
    LocalNode,
    echo_engine_command,
    free_port,
    wait_for,
)

MODEL = "echo-budget"
ADMIN = "budget-admin-token-0123456789abcdef"
DELAY_S = 1.0  # the engine's work per request: concurrent requests overlap
Fed = tuple[LocalNode, Path]


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fed]:
    root = tmp_path_factory.mktemp("budget")
    db = root / "budget.db"
    with LocalFederation(root) as federation:
        node = federation.start_node(
            "ingress", ingress=True, provider_id="prov-b",
            process=echo_engine_command(free_port(), [MODEL], "--request-delay",
                                        str(DELAY_S)),
            extra_args=["--ingress-db", str(db)],
            extra_env={"OTELA_ADMIN_TOKEN": ADMIN, "OTELA_LOG_PROMPTS": "true"})
        wait_for(lambda: node.states().get(node.session_id) == "SERVING", 30, "serving")
        yield node, db


def chat(node: LocalNode, key: str) -> httpx.Response:
    return httpx.post(f"{node.http_url}/v1/chat/completions", trust_env=False, timeout=20,
                      headers={"authorization": f"Bearer {key}"},
                      json={"model": MODEL, "max_tokens": 2,
                            "messages": [{"role": "user", "content": "x"}]})


def otela(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTELA_")}
    env["XDG_CONFIG_HOME"] = str(cwd / "xdg")
    return subprocess.run([sys.executable, "-m", "otela", *args], capture_output=True,
                          text=True, timeout=60, env=env, cwd=cwd)


@pytest.mark.slow
def test_concurrent_requests_cannot_overspend_a_budget(fed: Fed, tmp_path: Path) -> None:
    node, db = fed
    budget = 10
    made = httpx.post(f"{node.http_url}/v1/admin/keys", trust_env=False, timeout=10,
                      headers={"authorization": f"Bearer {ADMIN}"},
                      json={"owner": "gina", "budget_tokens": budget,
                            "expires_at": "2099-12-31T00:00:00+00:00"}).json()
    assert made["expires_at"] == 4102358400.0  # ISO 8601 accepted at creation too
    start = threading.Barrier(8)

    def together(_: int) -> httpx.Response:
        with httpx.Client(trust_env=False, timeout=20) as http:
            http.get(f"{node.http_url}/v1/health")  # connected before the barrier
            start.wait()
            return http.post(f"{node.http_url}/v1/chat/completions",
                             headers={"authorization": f"Bearer {made['key']}"},
                             json={"model": MODEL, "max_tokens": 2,
                                   "messages": [{"role": "user", "content": "x"}]})
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        burst = list(pool.map(together, range(8)))
    served = [a for a in burst if a.status_code == 200]
    held = [a for a in burst if a.status_code == 429]
    assert served and len(served) + len(held) == 8, [a.status_code for a in burst]
    assert {a.json()["error"]["code"] for a in held} == {"budget_reserved"}
    one = served[0].json()["usage"]["total_tokens"]
    # Without reservations all 8 ran (each saw nothing used yet): 3 tokens each, 24 of 10.
    assert held and sum(a.json()["usage"]["total_tokens"] for a in served) <= budget + one
    answers = [chat(node, made["key"]) for _ in range(budget)]
    refused = next(i for i, a in enumerate(answers) if a.status_code == 403)
    assert answers[refused].json()["error"]["code"] == "budget_exceeded"
    assert all(a.status_code == 200 for a in answers[:refused])
    headers = {"authorization": f"Bearer {made['key']}"}

    def me() -> dict[str, Any]:
        return dict(httpx.get(f"{node.http_url}/v1/me", headers=headers, trust_env=False,
                              timeout=10).json())
    used = wait_for(lambda: me()["used_tokens"] if me()["status"] == "over budget" else 0,
                    5, "/v1/me to say over budget")
    assert budget <= used <= budget + one  # overshot by one request at most
    assert httpx.get(f"{node.http_url}/v1/admin/keys/{made['id']}", trust_env=False,
                     headers={"authorization": f"Bearer {ADMIN}"}).json()["status"] \
        == "over budget"
    listed = otela("keys", "show", made["id"], "--db", str(db), "--json", cwd=tmp_path)
    assert json.loads(listed.stdout)["status"] == "over budget", listed.stderr
    table = otela("keys", "show", made["id"], "--db", str(db), cwd=tmp_path)
    assert "over budget" in table.stdout


@pytest.mark.slow
def test_mean_latency_is_over_served_requests(fed: Fed, tmp_path: Path) -> None:
    """Requests refused after their body was read (here: a model the key may not use) are
    usage rows of ~0 ms; they count as requests and errors, not in the mean latency."""
    node, db = fed
    made = httpx.post(f"{node.http_url}/v1/admin/keys", trust_env=False, timeout=10,
                      headers={"authorization": f"Bearer {ADMIN}"},
                      json={"owner": "hal", "models": [MODEL]}).json()
    assert all(chat(node, made["key"]).status_code == 200 for _ in range(2))
    for _ in range(6):
        refused = httpx.post(f"{node.http_url}/v1/chat/completions", trust_env=False,
                             headers={"authorization": f"Bearer {made['key']}"}, timeout=10,
                             json={"model": "not-allowed", "messages": []})
        assert refused.status_code == 403

    def row() -> dict[str, Any] | None:
        report = otela("usage", "--by", "key", "--db", str(db), "--format", "json",
                       cwd=tmp_path)
        found = [r for r in json.loads(report.stdout)["data"] if r["group"] == made["id"]]
        return found[0] if found and found[0]["requests"] == 8 else None
    totals = wait_for(row, 5, "eight usage rows")
    assert totals["errors"] == 6
    assert totals["mean_latency_ms"] >= DELAY_S * 1000  # was (2 x 1000 + 6 x ~0) / 8


def _admitted(limits: Any, at: float) -> bool:
    try:
        limits.admit(at)
    except RequestError as refused:
        assert refused.status == 429 and int(refused.headers["Retry-After"]) >= 1
        return False
    limits.finished(0, at)
    return True


@pytest.mark.parametrize("rpm", [1, 6, 12, 60, 600])
def test_a_limit_of_n_per_minute_admits_at_most_n_in_any_minute(rpm: int) -> None:
    """A client retrying every 50 ms for five minutes: every 60-second interval holds at
    most ``rpm`` admissions (the bucket alone let through rpm plus its 10-second burst, 7/6
    of the limit), and the long-run rate is the limit, not less."""
    limits = limits_for(rpm, None, None)
    times = [i * 0.05 for i in range(int(300 / 0.05))]
    admitted = [t for t in times if _admitted(limits, t)]
    starts = sorted({a for a in admitted} | {a - 60 + 1e-9 for a in admitted})
    worst = max(sum(1 for a in admitted if s <= a < s + 60) for s in starts)
    assert worst <= rpm
    assert len(admitted) >= rpm * 5 * 0.95  # five minutes: about five minutes' worth


@pytest.mark.slow
def test_a_teams_daily_money_budget_holds_across_its_keys(fed: Fed, tmp_path: Path) -> None:
    """A team's budget in money per day (set with ``otela keys team``), at the prices set:
    two keys of the team sending at once cannot spend past it by more than one request,
    the refusal names the team's budget and when it resets, and every view says "over
    budget" for both keys; a key outside the team is untouched."""
    node, db = fed
    admin = {"authorization": f"Bearer {ADMIN}"}
    assert httpx.put(f"{node.http_url}/v1/admin/prices", headers=admin, trust_env=False,
                     json={"model": MODEL, "input_per_mtok": 100_000,
                           "output_per_mtok": 100_000}).status_code == 200  # 0.1 a token
    set_team = otela("keys", "team", "optics", "--budget-spend", "1.0", "--budget-period",
                     "day", "--db", str(db), "--json", cwd=tmp_path)
    assert set_team.returncode == 0, set_team.stderr
    assert json.loads(set_team.stdout)["budget_spend"] == 1.0
    bad = otela("keys", "team", "optics", "--budget-period", "week", "--db", str(db),
                cwd=tmp_path)
    assert bad.returncode == 2 and "day, month or lifetime" in bad.stderr

    def key(owner: str, team: str | None) -> dict[str, Any]:
        body = {"owner": owner, **({"team": team} if team else {})}
        return dict(httpx.post(f"{node.http_url}/v1/admin/keys", headers=admin, json=body,
                               trust_env=False, timeout=10).json())
    first, second, outsider = key("ivo", "optics"), key("jan", "optics"), key("kim", None)

    def status_of(made: dict[str, Any]) -> dict[str, Any]:
        return dict(httpx.get(f"{node.http_url}/v1/me", trust_env=False, timeout=10,
                              headers={"authorization": f"Bearer {made['key']}"}).json())
    # The command line wrote the database; the ingress reads it within its refresh (1 s,
    # longer on a loaded machine: the full suite once sent the first requests before it,
    # unbudgeted, and spent 1.8 of 1). The admin API's PUT (same period) reads it now.
    assert httpx.put(f"{node.http_url}/v1/admin/teams/optics", headers=admin,
                     json={"budget_period": "day"}, trust_env=False,
                     timeout=10).json()["budget_spend"] == 1.0
    wait_for(lambda: status_of(first)["status"] == "active", 5, "the key to be usable")
    answers: list[httpx.Response] = []
    for _ in range(6):
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            answers += list(pool.map(lambda made: chat(node, made["key"]), (first, second)))
        if any(a.status_code == 403 for a in answers):
            break
    codes = [a.status_code for a in answers]
    assert 200 in codes and 403 in codes, codes
    refusal = next(a for a in answers if a.status_code == 403).json()["error"]
    assert refusal["code"] == "budget_exceeded"
    assert "Team optics's daily spend budget (1)" in refusal["message"]
    assert "resets at" in refusal["message"]
    spent = sum(a.json()["usage"]["total_tokens"] * 0.1 for a in answers
                if a.status_code == 200)
    biggest = max(a.json()["usage"]["total_tokens"] * 0.1 for a in answers
                  if a.status_code == 200)
    # Two keys at once: each may hold a reservation when the last one settles.
    assert 1.0 <= spent + 1e-9 <= 1.0 + 2 * biggest
    for made in (first, second):
        wait_for(lambda made=made: status_of(made)["status"] == "over budget", 5,
                 "/v1/me to say over budget")
    shown = otela("keys", "show", second["id"], "--db", str(db), "--json", cwd=tmp_path)
    assert json.loads(shown.stdout)["status"] == "over budget", shown.stderr
    assert chat(node, outsider["key"]).status_code == 200
    assert status_of(outsider)["status"] == "active"
    # This ingress opted in to keeping prompts ([ingress] log_prompts): they are in the log.
    logged = httpx.get(f"{node.http_url}/v1/me/requests", trust_env=False, timeout=10,
                       headers={"authorization": f"Bearer {outsider['key']}"}).json()["data"]
    assert [entry["prompt"] for entry in logged] == ["x"]
