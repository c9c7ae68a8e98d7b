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


def pytest_configure(config: pytest.Config) -> None:
    """Refuse ``--dist loadgroup`` where it silently ignores ``xdist_group``.

    Tests that share machine-wide state (the Slurm cluster, the vLLM engine, the test LAN)
    stay on one worker only because pytest-xdist appends their group to their ids. With
    pytest 9.2 and pytest-xdist 3.8 that append is a no-op: those tests ran side by side
    and failed in ways that looked like timing (a fleet job pending behind another test's
    8-CPU job for three minutes). Stop at once with the reason instead.
    """
    if hasattr(config, "workerinput") or config.getoption("dist", "no") != "loadgroup":
        return
    import xdist  # type: ignore[import-untyped]

    xdist_version = tuple(int(part) for part in xdist.__version__.split(".")[:2])
    if pytest.version_tuple[:2] >= (9, 2) and xdist_version <= (3, 8):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} with pytest-xdist {xdist.__version__} ignores "
            "xdist_group under --dist loadgroup, so tests sharing the Slurm cluster or the "
            "vLLM engine would run side by side: install the pinned versions "
            "(pip install -e '.[dev]')")


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
