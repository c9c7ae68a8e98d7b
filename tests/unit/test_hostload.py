"""Host CPU pressure, as reported next to each suspicion and in /v1/health."""

from __future__ import annotations

from pathlib import Path

from otela.hostload import cpu_pressure, parse_cpu_pressure

PSI = ("some avg10=6.32 avg60=62.92 avg300=89.05 total=23820261101\n"
       "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")


def test_the_share_of_the_last_ten_seconds_some_task_waited_for_a_core() -> None:
    assert parse_cpu_pressure(PSI) == 6.32
    assert parse_cpu_pressure("full avg10=3.00 avg60=0 avg300=0 total=0\n") is None
    assert parse_cpu_pressure("some avg10=oops total=0\n") is None
    assert parse_cpu_pressure("") is None


def test_a_kernel_without_pressure_information_gives_none(tmp_path: Path) -> None:
    assert cpu_pressure(tmp_path / "absent") is None
    psi = tmp_path / "cpu"
    psi.write_text(PSI)
    assert cpu_pressure(psi) == 6.32
