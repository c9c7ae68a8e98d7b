"""The pure reconcile core: desired state + observed state -> actions."""

from __future__ import annotations

from otela.fleet.reconcile import reconcile
from otela.fleet.state import (
    Cancel,
    ClusterPolicy,
    Drain,
    Estimate,
    Failure,
    Job,
    JobState,
    Node,
    Observed,
    Policy,
    Submit,
    Want,
)

NOW = 10_000.0
POLICY = Policy(clusters={"a": ClusterPolicy(drain_margin=60, pending_limit=300,
                                             serve_deadline=600),
                          "b": ClusterPolicy(drain_margin=60, pending_limit=300,
                                             serve_deadline=600)},
                backoff=30, max_backoff=600, failure_window=1800, max_failures=2,
                handover_slack=10, interval=5)
EST = {"a": Estimate(queue_wait=10, engine_start=20), "b": Estimate(queue_wait=10,
                                                                     engine_start=20)}


def want(count: int, spec: str = "s1", clusters: tuple[str, ...] = ("a", "b")) -> Want:
    return Want("d", spec, count, clusters)


def job(job_id: str, state: str = "RUNNING", *, cluster: str = "a", spec: str = "s1",
        submitted: float = NOW - 100, started: float | None = NOW - 90,
        ends: float | None = NOW + 3600, marks: frozenset[str] = frozenset(),
        presumed: bool = False) -> Job:
    js = JobState(state)
    return Job(cluster, job_id, "d", spec, js, submitted_at=submitted,
               started_at=started if js is not JobState.PENDING else None,
               ends_at=ends if js is JobState.RUNNING else None, marks=marks,
               presumed=presumed)


def node(job_id: str, state: str = "SERVING", *, cluster: str = "a", spec: str = "s1",
         version: int = 2) -> Node:
    return Node(f"sess-{cluster}-{job_id}-{version}", cluster, job_id, "d", spec, state,
                version=version)


def observed(jobs=(), nodes=(), **kw) -> Observed:
    return Observed(now=NOW, jobs=tuple(jobs), nodes=tuple(nodes), estimates=EST, **kw)


def kinds(decision) -> list[tuple[str, str]]:
    return [(type(a).__name__, getattr(a, "job_id", getattr(a, "cluster", "")))
            for a in decision.actions]


def test_from_nothing_submits_the_count_on_the_first_cluster():
    decision = reconcile([want(3)], observed(), POLICY)
    assert [type(a) for a in decision.actions] == [Submit] * 3
    assert {a.cluster for a in decision.actions} == {"a"}
    assert all(a.spec == "s1" and a.reason == "scale to 3" for a in decision.actions)


def test_pending_and_starting_replicas_count_so_nothing_is_submitted_twice():
    jobs = [job("1", "PENDING"), job("2"), job("3")]
    nodes = [node("3")]  # 2 has no node yet: starting
    assert reconcile([want(3)], observed(jobs, nodes), POLICY).actions == []


def test_scale_down_cancels_pending_then_starting_then_drains_the_least_wall_time():
    jobs = [job("1", ends=NOW + 2000), job("2", ends=NOW + 1000), job("3"),
            job("4", "PENDING"), job("5")]
    nodes = [node("1"), node("2"), node("5")]  # 3 is starting
    decision = reconcile([want(1)], observed(jobs, nodes), POLICY)
    assert kinds(decision) == [("Cancel", "4"), ("Cancel", "3"), ("Drain", "2"),
                               ("Drain", "1")]


def test_a_changed_spec_rolls_new_replicas_first_and_drains_old_ones_once_they_serve():
    old = [job("1"), job("2")]
    old_nodes = [node("1"), node("2")]
    first = reconcile([want(2, spec="s2")], observed(old, old_nodes), POLICY)
    assert [type(a) for a in first.actions] == [Submit, Submit]
    assert all("roll" in a.reason for a in first.actions)
    # new replicas starting: the old ones keep serving
    new = [job("3", spec="s2"), job("4", spec="s2")]
    starting = reconcile([want(2, spec="s2")], observed(old + new, old_nodes), POLICY)
    assert starting.actions == []
    assert {n.what for n in starting.notes} == {"waiting"}
    # one new serves: one old may go; both serve: both go
    one = reconcile([want(2, spec="s2")],
                    observed(old + new, [*old_nodes, node("3", spec="s2")]), POLICY)
    assert [type(a) for a in one.actions] == [Drain]
    both = reconcile([want(2, spec="s2")], observed(
        old + new, [*old_nodes, node("3", spec="s2"), node("4", spec="s2")]), POLICY)
    assert sorted(a.job_id for a in both.actions if isinstance(a, Drain)) == ["1", "2"]


def test_a_roll_cancels_old_replicas_that_do_not_serve_at_once():
    decision = reconcile([want(1, spec="s2")], observed([job("1", "PENDING")]), POLICY)
    assert kinds(decision) == [("Submit", "a"), ("Cancel", "1")]


def test_a_replica_near_its_wall_time_gets_a_successor_and_drains_only_once_it_serves():
    # drain point = ends - 60; lead = 10 + 20 + slack 10 + interval 5 = 45
    soon = job("1", ends=NOW + 60 + 40)  # 40 s before its drain point: expiring
    later = job("2", ends=NOW + 60 + 50)  # 50 s: not yet
    nodes = [node("1"), node("2")]
    decision = reconcile([want(2)], observed([soon, later], nodes), POLICY)
    assert kinds(decision) == [("Submit", "a")]
    assert decision.actions[0].reason.startswith("successor of a/1")
    successor = job("3", started=NOW - 5)
    waiting = reconcile([want(2)], observed([soon, later, successor], nodes), POLICY)
    assert waiting.actions == []  # it does not serve yet: the old one serves on
    served = reconcile([want(2)], observed([soon, later, successor], [*nodes, node("3")]),
                       POLICY)
    assert kinds(served) == [("Drain", "1")]
    assert served.actions[0].reason.startswith("wall time")


def test_draining_and_down_replicas_are_left_alone_and_not_counted():
    jobs = [job("1", marks=frozenset({"drain"})), job("2"), job("3")]
    nodes = [node("1"), node("2", "DOWN"), node("3")]
    # The DOWN node was not asked to drain: its engine failed. That is a failure at once,
    # before Slurm reports the job FAILED: its replacement waits out the backoff.
    decision = reconcile([want(2)], observed(jobs, nodes), POLICY)
    assert kinds(decision) == [] and decision.notes[0].what == "backoff"
    already = [Failure("d", "a", NOW - 31, "job FAILED", "failed", "2")]  # once known
    decision = reconcile([want(2)], observed(jobs, nodes, failures=already), POLICY)
    assert kinds(decision) == [("Submit", "a")]  # counted once: the backoff has passed
    drained = [job("1", marks=frozenset({"drain"})), job("3")]  # a drain is no failure
    decision = reconcile([want(2)], observed(drained, [node("1", "DOWN"), node("3")]),
                         POLICY)
    assert kinds(decision) == [("Submit", "a")]


def test_a_replica_that_never_serves_is_cancelled_as_a_failure_and_replaced():
    stuck = job("1", started=NOW - 700)
    decision = reconcile([want(1)], observed([stuck]), POLICY)
    cancel, submit = decision.actions
    assert isinstance(cancel, Cancel) and cancel.failure == "never served"
    assert isinstance(submit, Submit) and "never served" in submit.reason


def test_failures_back_off_exponentially_then_move_to_another_cluster():
    one = [Failure("d", "a", NOW - 10, "job FAILED")]
    decision = reconcile([want(1)], observed(failures=one), POLICY)
    assert decision.actions == [] and decision.notes[0].what == "backoff"
    assert "next replica in 20s" in decision.notes[0].message
    later = [Failure("d", "a", NOW - 31, "job FAILED")]
    assert kinds(reconcile([want(1)], observed(failures=later), POLICY)) == [("Submit", "a")]
    two = [Failure("d", "a", NOW - 100, "x"), Failure("d", "a", NOW - 10, "x")]
    moved = reconcile([want(1)], observed(failures=two), POLICY)
    assert kinds(moved) == [("Submit", "b")]  # no failure on b: no backoff there
    everywhere = [*two, Failure("d", "b", NOW - 50, "x"), Failure("d", "b", NOW - 40, "x")]
    waiting = reconcile([want(1)], observed(failures=everywhere), POLICY)
    assert waiting.actions == [] and "next replica in" in waiting.notes[0].message


def test_a_job_pending_too_long_is_tried_on_another_cluster():
    stuck = job("1", "PENDING", submitted=NOW - 400)
    decision = reconcile([want(1)], observed([stuck]), POLICY)
    assert kinds(decision) == [("Cancel", "1"), ("Submit", "b")]
    assert decision.actions[0].pending_too_long
    # with nowhere else to go it keeps waiting
    alone = reconcile([want(1, clusters=("a",))], observed([stuck]), POLICY)
    assert alone.actions == []


def test_an_unreachable_cluster_counts_its_serving_nodes_and_is_compensated_elsewhere():
    presumed = job("1", presumed=True)  # from the registry: its node serves
    decision = reconcile([want(2)], observed([presumed], [node("1")],
                                             unreachable=frozenset({"a"})), POLICY)
    assert kinds(decision) == [("Submit", "b")]
    # the surplus once it answers again is never taken from where it cannot act
    decision = reconcile([want(1)], observed([presumed, job("2", cluster="b")],
                                             [node("1"), node("2", cluster="b")],
                                             unreachable=frozenset({"a"})), POLICY)
    assert kinds(decision) == [("Drain", "2")]
    nowhere = reconcile([want(1)], observed(unreachable=frozenset({"a", "b"})), POLICY)
    assert nowhere.actions == [] and nowhere.notes[0].what == "no_cluster"


def test_jobs_of_a_deployment_no_longer_in_the_file_are_wound_down():
    jobs = [job("1"), job("2", "PENDING")]
    decision = reconcile([], observed(jobs, [node("1")]), POLICY)
    assert kinds(decision) == [("Cancel", "2"), ("Drain", "1")]


def test_a_rejoined_session_wins_over_its_evicted_one():
    jobs = [job("1")]
    nodes = [node("1", "LEFT", version=5), node("1", "SERVING", version=2)]
    assert reconcile([want(1)], observed(jobs, nodes), POLICY).actions == []


def packed(job_id: str, size: int, state: str = "RUNNING", **kw) -> Job:
    from dataclasses import replace
    return replace(job(job_id, state, **kw), size=size)


def test_whole_node_partitions_pack_replicas_into_one_job():
    want4 = Want("d", "s1", 6, ("a",), {"a": 4})
    decision = reconcile([want4], observed(), POLICY)
    assert [(type(a).__name__, a.size) for a in decision.actions] == [("Submit", 4),
                                                                     ("Submit", 2)]
    # a job of 4 and one of 2 count as 6; partly serving counts by its serving nodes
    jobs = [packed("1", 4), packed("2", 2)]
    nodes = [node("1", version=v) for v in (1, 2, 3)] + [node("2")]
    assert reconcile([want4], observed(jobs, nodes), POLICY).actions == []
    # down to 3: the job of 2 goes; the job of 4 stays (never below the count)
    down = reconcile([Want("d", "s1", 3, ("a",), {"a": 4})], observed(jobs, nodes), POLICY)
    assert [(type(a).__name__, a.job_id) for a in down.actions] == [("Drain", "2")]


def test_a_packed_job_with_a_failed_node_is_ending_and_replaced_whole():
    jobs = [packed("1", 2)]
    nodes = [node("1", version=1), node("1", "DOWN", version=2)]
    want = Want("d", "s1", 2, ("a",), {"a": 2})
    decision = reconcile([want], observed(jobs, nodes), POLICY)  # a failure: backoff first
    assert decision.actions == [] and decision.notes[0].what == "backoff"
    known = [Failure("d", "a", NOW - 31, "job FAILED", "failed", "1")]
    decision = reconcile([want], observed(jobs, nodes, failures=known), POLICY)
    assert [(type(a).__name__, getattr(a, "size", 0)) for a in decision.actions] == [
        ("Submit", 2)]


def test_a_packed_job_is_drained_at_its_wall_time_only_once_its_successor_serves_fully():
    want = Want("d", "s1", 2, ("a",), {"a": 2})
    old = packed("1", 2, ends=NOW + 60 + 30)
    new = packed("2", 2, started=NOW - 5)
    nodes = [node("1", version=1), node("1", version=2), node("2", version=1)]
    assert reconcile([want], observed([old, new], nodes), POLICY).actions == []
    nodes.append(node("2", version=2))
    assert [type(a) for a in reconcile([want], observed([old, new], nodes),
                                       POLICY).actions] == [Drain]


def test_the_wall_time_the_node_read_counts_when_slurm_gives_none():
    from dataclasses import replace
    unknown = job("1", ends=None)
    assert unknown.ends_at is None
    near = replace(node("1"), end_time=NOW + 60 + 30)
    decision = reconcile([want(1)], observed([unknown], [near]), POLICY)
    assert kinds(decision) == [("Submit", "a")]
    assert decision.actions[0].reason.startswith("successor of a/1 (wall time in 90s)")
    assert reconcile([want(1)], observed([unknown], [node("1")]), POLICY).actions == []


def test_a_lead_longer_than_half_a_jobs_life_never_replaces_a_replica_as_it_starts():
    slow = {"a": Estimate(queue_wait=300, engine_start=60), "b": EST["b"]}
    # started 5 s ago, 118 s left, 60 s margin: 53 s of serving life, half of it 26.5 s
    fresh = job("1", started=NOW - 5, ends=NOW + 118)
    obs = Observed(now=NOW, jobs=(fresh,), nodes=(node("1"),), estimates=slow)
    assert reconcile([want(1)], obs, POLICY).actions == []
    later = Observed(now=NOW + 27, jobs=(fresh,), nodes=(node("1"),), estimates=slow)
    assert kinds(reconcile([want(1)], later, POLICY)) == [("Submit", "a")]
    # a starting replica is never expiring: its successor would be no earlier
    starting = Observed(now=NOW + 40, jobs=(fresh,), estimates=slow)
    assert reconcile([want(1)], starting, POLICY).actions == []
