"""Every setting is declared once (``otela.config.schema``) and reaches the node the same
way through each layer: a flag, an ``OTELA_*`` variable, a config file key. The docs'
table and ``--help`` are generated from the same declarations, so they cannot drift."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from otela.cli import app
from otela.config import SETTINGS, render_value, settings_markdown
from otela.config.render import SECRET_SETTINGS

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def show(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    """``otela config show --json`` in a clean environment (no user config, no OTELA_*)."""
    clean = {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), **(env or {})}
    result = runner.invoke(app, ["config", "show", "--json", *args], env=clean)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["settings"]


def expected(setting) -> str:
    """What ``otela config show`` prints for the setting's example (credentials hidden)."""
    if setting.attr in SECRET_SETTINGS:
        return "(set, hidden)"
    return render_value(setting.parse(setting.example))


@pytest.fixture(autouse=True)
def no_otela_env(monkeypatch):
    import os

    for name in [n for n in os.environ if n.startswith("OTELA_")]:
        monkeypatch.delenv(name)


def test_examples_are_valid_and_differ_from_the_defaults():
    for setting in SETTINGS:
        assert setting.parse(setting.example) != setting.default, setting.attr


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.flag], ids=lambda s: s.attr)
def test_a_flag_reaches_the_setting(tmp_path, setting):
    args = [setting.flag] if setting.switch and setting.example == "true" else \
        [f"--no-{setting.flag[2:]}"] if setting.switch else [setting.flag, setting.example]
    row = show(tmp_path, *args)[f"{setting.section}.{setting.key}"]
    assert (row["value"], row["source"]) == (expected(setting), "flag")


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.attr)
def test_an_environment_variable_reaches_the_setting(tmp_path, setting):
    row = show(tmp_path, env={setting.env: setting.example})[f"{setting.section}.{setting.key}"]
    assert (row["value"], row["source"], row["env"]) == (expected(setting), "env", setting.env)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.attr)
def test_a_config_file_key_reaches_the_setting(tmp_path, setting):
    path = tmp_path / "otela.toml"
    path.write_text(f"[{setting.section}]\n{setting.key} = {render_value(setting.example)}\n")
    row = show(tmp_path, "--config", str(path))[f"{setting.section}.{setting.key}"]
    assert (row["value"], row["source"]) == (expected(setting), f"file {path}")


def test_flags_beat_the_environment_which_beats_the_file(tmp_path):
    path = tmp_path / "otela.toml"
    path.write_text("[node]\nhttp_port = 1111\np2p_port = 2222\nprovider_id = 'file'\n")
    rows = show(tmp_path, "--config", str(path), "--provider-id", "flag",
                env={"OTELA_P2P_PORT": "3333", "OTELA_PROVIDER_ID": "env"})
    assert rows["node.http_port"]["value"] == "1111"
    assert rows["node.p2p_port"]["value"] == "3333"
    assert rows["node.provider_id"] == {"value": "'flag'", "source": "flag",
                                        "env": "OTELA_PROVIDER_ID"}


@pytest.mark.parametrize(("args", "needle"), [
    (["--registry-retention", "soon"], "bad value for retention (--registry-retention)"),
    (["--http-port", "eighty"], "bad value for http_port (--http-port)"),
    (["--max-body", "huge"], "bad value for max_body (--max-body)"),
    (["--model-meta", "novalue"], "(--model-meta)"),
])
def test_a_bad_flag_is_reported_as_the_flag_the_user_typed(tmp_path, args, needle):
    result = runner.invoke(app, ["config", "show", *args],
                           env={"XDG_CONFIG_HOME": str(tmp_path)})
    assert result.exit_code == 2
    assert needle in result.output


def test_help_states_each_default_from_its_declaration():
    from otela.config.options import option_for

    for setting in (s for s in SETTINGS if s.flag):
        default = setting.describe_default()
        option = option_for(setting)
        if default is not None:
            assert f"Default: {default}." in option.help, setting.attr
        assert setting.env in option.help
    drain = next(s for s in SETTINGS if s.attr == "engine_stop_grace")
    assert "Default: 8.0." in option_for(drain).help  # it once said 10 while the code said 8


def test_the_docs_table_is_the_generated_one():
    page = (ROOT / "docs" / "config.md").read_text()
    assert settings_markdown() in page, (
        "docs/config.md is out of date: replace its settings table with the output of "
        "`python -m otela.config --update docs/config.md`")
