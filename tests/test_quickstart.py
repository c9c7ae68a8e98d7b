"""The README's quick start: exactly two commands, and both do what they promise."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def quickstart_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(?:sh|bash)?\n(.*?)```", section, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def test_quickstart_has_exactly_the_demo_and_test_commands():
    assert quickstart_commands() == ["./scripts/demo", "./scripts/test"]
    for script in ("scripts/demo", "scripts/test", "scripts/bootstrap", ".ci/run"):
        assert os.access(ROOT / script, os.X_OK), f"{script} is not executable"


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci/run").read_text()
    assert "./scripts/test" in ci.split("exec", 1)[1]


def test_setup_installs_into_its_own_virtualenv():
    bootstrap = (ROOT / "scripts/bootstrap").read_text()
    assert "-m venv" in bootstrap and "pip install" in bootstrap
    for script in ("scripts/demo", "scripts/test"):
        assert "scripts/bootstrap" in (ROOT / script).read_text()


@pytest.mark.slow
def test_demo_runs_a_federation_and_shuts_it_down():
    # The same entry point as ./scripts/demo, minus the (already done) environment setup.
    # Piped, as `otela demo | cat` or a CI log: 80 columns must not wrap anything.
    result = subprocess.run(
        [sys.executable, "-m", "otela", "demo", "--requests", "2"],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    ingress = [line for line in out.splitlines() if line.startswith("ingress ")]
    assert len(ingress) == 1 and re.search(
        r"http://127\.0\.0\.1:\d+\s+/ip4/127\.0\.0\.1/tcp/\d+/p2p/12D3KooW"
        r"[1-9A-HJ-NP-Za-km-z]{44}$", ingress[0]), out
    rows = [line for line in out.splitlines() if "lab-alpha" in line and "http://" in line]
    assert rows and all(re.search(r"http://127\.0\.0\.1:\d+ ", row) for row in rows), out
    assert re.search(r"INGRESS", out) and "JOIN" not in out, out
    assert re.search(r"echo-small\s+-> node-[ab]", out)
    assert re.search(r"echo-large\s+-> node-c", out)
    assert "chunks)" in out
    assert re.search(r"exit codes \{.*'ingress': 0\}", out)
    # the public ingress service: a key made, used, and its usage counted per node
    assert re.search(r"dashboard\s+http://127\.0\.0\.1:\d+/ui", out)
    assert re.search(r"API key key_[0-9a-f]{12} created", out)
    counted = re.findall(r"node-[abc]\s+│\s+(\d+)\s+│\s+(\d+)\s+│\s+(\d+)", out)
    assert sum(int(requests) for requests, _, _ in counted) == 2 * 2 + 1  # and the stream
    assert all(int(completion) > 0 for _, _, completion in counted)


@pytest.mark.slow
@pytest.mark.parametrize(("how", "code"), [("ctrl-c", 130), ("kill", 128 + 15)])
def test_ctrl_c_or_kill_stops_the_demo_and_every_node_cleanly(tmp_path, how, code):
    import signal
    import time

    env = {**os.environ, "COLUMNS": "80", "TMPDIR": str(tmp_path)}
    demo = subprocess.Popen(
        [sys.executable, "-m", "otela", "demo", "--requests", "100000"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT,
        start_new_session=True,  # its own process group, like a terminal's foreground job
    )
    assert demo.stdout is not None
    output = []
    for line in demo.stdout:  # wait until requests are flowing
        output.append(line)
        if "-> node-" in line:
            break
    if how == "ctrl-c":
        os.killpg(demo.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    else:
        demo.send_signal(signal.SIGTERM)  # `kill PID`, `timeout`: the demo process alone
    try:
        # Each node gets 20 s to stop before the demo kills it (a non-zero exit code,
        # asserted below); they stop side by side, so this is ample even on a busy machine.
        rest, _ = demo.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        logs = {str(log.relative_to(tmp_path)): log.read_text(errors="replace")[-3000:]
                for log in tmp_path.glob("otela-demo-*/**/node.log")}
        os.killpg(demo.pid, signal.SIGKILL)
        for pid in _processes_mentioning(str(tmp_path)):  # nodes: sessions of their own
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        pytest.fail(f"the demo did not end within 90 s of {how}; node logs: {logs}")
    text = "".join(output) + rest
    assert demo.returncode == code, text
    assert re.search(r"exit codes \{'node-c': 0, 'node-b': 0, 'node-a': 0, 'ingress': 0\}",
                     text), text  # on one line: piped output is never wrapped
    deadline = time.monotonic() + 10
    while _processes_mentioning(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_mentioning(str(tmp_path)) == []


def _processes_mentioning(fragment: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if fragment in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(proc.name))
            except OSError:
                pass
    return pids
