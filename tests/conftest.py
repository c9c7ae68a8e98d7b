"""Shared fixtures: a local federation of real otela processes, logs shown on failure."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from otela.testing.localfed import LocalFederation

# Property tests check behaviour, not speed: hypothesis's default 200 ms deadline per
# example failed them on a loaded 2-core machine (an example that took 250 ms once).
settings.register_profile("otela", deadline=None)
settings.load_profile("otela")


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


ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The interpreter of the real vLLM CPU build, installed by scripts/setup-vllm if needed.

    Never skipped: a machine that cannot install it fails these tests with pip's reason.
    """
    import subprocess

    result = subprocess.run([str(ROOT / "scripts" / "setup-vllm")], capture_output=True,
                            text=True, timeout=1800)
    if result.returncode != 0:
        pytest.fail(f"scripts/setup-vllm failed (vLLM CPU build not installable):\n"
                    f"{result.stderr[-3000:]}")
    from otela.testing.localfed import vllm_python as find

    return find()


@pytest.fixture(scope="session")
def tiny_model(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight Llama, built locally by otela's helper (no downloads)."""
    from otela.testing.localfed import build_tiny_model

    return build_tiny_model(vllm_python, tmp_path_factory.mktemp("models") / "tiny-llama")
