"""Shared fixtures: a local federation of real otela processes, logs shown on failure."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from otela.localfed import LocalFederation


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture
def federation(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalFederation]:
    fed = LocalFederation(tmp_path / "fed")
    try:
        yield fed
    finally:
        fed.close()
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            for node in fed.nodes:
                print(f"\n--- log of {node.name} ---\n{node.log_tail(40)}")
