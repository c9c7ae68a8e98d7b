"""Configuration layers: flags > OTELA_* env > file > defaults, with sources and clear errors."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from otela.config import SETTINGS, ConfigError, NodeConfig, render_template, resolve


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_precedence_flags_over_env_over_file_over_defaults(tmp_path):
    path = write(tmp_path, "[node]\nhttp_port = 1111\np2p_port = 2222\nprovider_id = 'file'\n")
    env = {"OTELA_P2P_PORT": "3333", "OTELA_PROVIDER_ID": "env"}
    resolved = resolve({"provider_id": "flag"}, env, path)
    config = resolved.config
    assert (config.http_port, config.p2p_port, config.provider_id) == (1111, 3333, "flag")
    assert resolved.sources["http_port"] == f"file {path}"
    assert resolved.sources["p2p_port"] == "env"
    assert resolved.sources["provider_id"] == "flag"
    assert resolved.sources["drain_grace"] == "default"
    assert config.drain_grace == NodeConfig().drain_grace


def test_typed_values_from_env_and_file(tmp_path):
    path = write(
        tmp_path,
        "[engine]\nmodel_meta = {quantization = 'awq-4bit'}\n"
        "fatal_patterns = ['boom', 'x+y']\n[hardware]\ngpus = '2xA100:80'\n",
    )
    env = {"OTELA_INGRESS": "yes", "OTELA_BOOTSTRAP": "/ip4/1/tcp/2, /ip4/3/tcp/4",
           "OTELA_DRAIN_GRACE": "7.5"}
    config = resolve({}, env, path).config
    assert config.ingress is True
    assert config.bootstrap == ["/ip4/1/tcp/2", "/ip4/3/tcp/4"]
    assert config.drain_grace == 7.5
    assert config.model_meta == {"quantization": "awq-4bit"}
    assert config.fatal_patterns == ["boom", "x+y"]
    assert config.hw_gpus == "2xA100:80"


@pytest.mark.parametrize(
    ("text", "env", "needle"),
    [
        ("[node]\nhttp_prot = 1\n", {}, "unknown key 'http_prot' in [node]"),
        ("[nodes]\nhttp_port = 1\n", {}, "unknown section [nodes]"),
        ("[node]\nhttp_port = 'abc'\n", {}, "bad value for http_port (node.http_port in"),
        ("[node]\nhttp_port = 70000\n", {}, "port out of range"),
        ("[node\n", {}, "not valid TOML"),
        ("", {"OTELA_HTTP_PORT": "eighty"}, "bad value for http_port (OTELA_HTTP_PORT)"),
        ("", {"OTELA_INGRESS": "maybe"}, "bad value for ingress (OTELA_INGRESS)"),
        ("", {"OTELA_FATAL_PATTERNS": "(unclosed"}, "bad regular expression"),
        ("", {"OTELA_MODEL_META": "novalue"}, "expected key=value"),
        ("", {"OTELA_DRAIN_GRACE": "-1"}, "must not be negative"),
    ],
)
def test_bad_values_name_the_setting_and_source(tmp_path, text, env, needle):
    with pytest.raises(ConfigError) as info:
        resolve({}, env, write(tmp_path, text))
    assert needle in str(info.value)


def test_named_config_file_must_exist(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        resolve({}, {}, tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="does not exist"):
        resolve({}, {"OTELA_CONFIG": str(tmp_path / "missing.toml")})


def test_default_file_is_optional_and_under_xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    resolved = resolve({}, {})
    assert resolved.file == tmp_path / "otela" / "config.toml"
    assert all(source == "default" for source in resolved.sources.values())


def test_init_template_lists_every_setting_and_uncommented_parses_to_defaults(tmp_path):
    template = render_template()
    for setting in SETTINGS:
        assert f"# {setting.key} = " in template
        assert setting.env in template
    uncommented = "\n".join(
        line[2:] if line.startswith("# ") and " = " in line and "(env" not in line else line
        for line in template.splitlines()
    )
    path = write(tmp_path, uncommented)
    assert tomllib.loads(uncommented)  # valid TOML
    resolved = resolve({}, {}, path)
    defaults = NodeConfig(home=resolved.config.home)
    assert resolved.config == defaults
