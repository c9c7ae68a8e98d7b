"""Slurm awareness: the job from the environment, squeue's time left, the drain trigger."""

from __future__ import annotations

import pytest
import trio

from otela.registry.records import Lifecycle, NodeRecord, SlurmJob
from otela.slurm import job_from_env, parse_time_left, watch_wall_time


def test_job_from_env():
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_NODELIST": "n[1-2]",
           "SLURM_CPUS_ON_NODE": "16", "SLURM_JOB_GPUS": "0,1,2,3"}
    assert job_from_env(env) == SlurmJob("42", "gpu", "n[1-2]", 16, 4)
    assert job_from_env({"SLURM_GPUS_ON_NODE": "2", "SLURM_JOB_ID": "7"}).gpus == 2  # type: ignore[union-attr]
    assert job_from_env({}) is None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1:59", 119), ("0:05", 5), ("12:00:00", 43200), ("2-01:00:00", 176400), ("30", 30),
     ("UNLIMITED", None), ("INVALID", None), ("NOT_SET", None), ("", None)],
)
def test_parse_time_left(text, seconds):
    assert parse_time_left(text + "\n") == seconds


def test_drains_at_the_margin_and_rereads_the_time_left():
    answers = iter([None, 500.0, 100.0])  # unknown, then plenty, then the limit was lowered
    asked: list[float] = []
    drained: list[float] = []

    async def query(job_id: str) -> float | None:
        assert job_id == "9"
        asked.append(trio.current_time())
        return next(answers)

    async def main() -> None:
        await watch_wall_time("9", margin=120, poll_interval=60, on_drain=drained.append,
                              query=query)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert drained == [100.0]
    assert [round(t - asked[0]) for t in asked] == [0, 60, 120]


def test_slurm_job_round_trips_through_the_record():
    job = SlurmJob("1", "p", "n1", 4, None, 123.0)
    record = NodeRecord("s", "p", "prov", state=Lifecycle.JOIN, version=1, http_url="h", slurm=job,
                        idle=True)
    back = NodeRecord.from_dict(record.to_dict())
    assert back.slurm == job and back.idle
