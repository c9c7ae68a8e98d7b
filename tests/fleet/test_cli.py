"""``otela fleet`` commands that need no cluster: init, check, and their errors."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from otela.cli import app


def test_init_writes_an_example_that_check_accepts(tmp_path: Path):
    runner = CliRunner()
    target = tmp_path / "fleet.toml"
    result = runner.invoke(app, ["fleet", "init", "--path", str(target)])
    assert result.exit_code == 0 and target.exists()
    assert runner.invoke(app, ["fleet", "init", "--path", str(target)]).exit_code == 1
    checked = runner.invoke(app, ["fleet", "check", "--file", str(target)])
    assert checked.exit_code == 0, checked.output
    assert "fleet lab, 2 cluster(s), 2 deployment(s): ok" in checked.output


def test_a_bad_file_exits_2_naming_file_line_and_field(tmp_path: Path):
    target = tmp_path / "fleet.toml"
    text = (Path(__file__).resolve().parents[2] / "otela" / "fleet" / "example.toml"
            ).read_text().replace("replicas = 2", "replicas = \"two\"")
    target.write_text(text)
    line = text.splitlines().index("replicas = \"two\"") + 1
    for command in ("check", "diff", "apply", "status"):
        result = CliRunner().invoke(app, ["fleet", command, "--file", str(target)])
        assert result.exit_code == 2, (command, result.output)
        assert f"{target}:{line}: deployments[0].replicas: must be a whole number" in \
            result.output
    missing = CliRunner().invoke(app, ["fleet", "check", "--file", str(tmp_path / "no")])
    assert missing.exit_code == 2 and "cannot read" in missing.output


def test_every_fleet_command_has_help():
    for command in ("init", "check", "diff", "apply", "run", "status", "stop", "resume"):
        result = CliRunner().invoke(app, ["fleet", command, "--help"])
        assert result.exit_code == 0, result.output
        assert ("--path" if command == "init" else "--file") in result.output
