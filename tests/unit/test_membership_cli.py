"""`otela membership` end to end through typer's CliRunner: files, modes, output, exit codes."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import msgpack
import pytest
from typer.testing import CliRunner

from otela.identity import load_or_create
from otela.membership import (
    format_authority,
    init_authority,
    issue_certificate,
    load_authority_key,
    parse_authority,
    verify_certificate,
    verify_revocation,
)
from otela.membership.cli import app

runner = CliRunner()


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Work in tmp_path, with the default authority under tmp_path/config."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def invoke(*args: str):  # type: ignore[no-untyped-def]
    result = runner.invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def authority_string(result_stdout: str) -> str:
    return next(line for line in result_stdout.splitlines() if line.startswith("otela-authority:"))


def test_full_walkthrough(env: Path) -> None:
    init = invoke("init")
    assert init.exit_code == 0, init.output
    default_dir = env / "config" / "otela" / "authority"
    key_file = default_dir / "authority.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    authority = authority_string(init.stdout)
    assert (default_dir / "authority.pub").read_text().strip() == authority

    node = load_or_create(env / "node")
    peer = node.peer_id.to_base58()
    signed = invoke(
        "sign",
        "--node-key",
        str(env / "node" / "identity.key"),
        "--provider",
        "cscs",
        "--expires",
        "30d",
    )
    assert signed.exit_code == 0, signed.output
    cert_file = env / f"cscs-{peer[-8:]}.cert"
    assert cert_file.exists()
    cert = verify_certificate(cert_file.read_bytes(), parse_authority(authority), now=time.time())
    assert (cert.peer_id, cert.provider_id) == (peer, "cscs")
    assert cert.serial in signed.stdout and peer in signed.stdout and "cscs" in signed.stdout
    assert 29 * 86400 < cert.expires_at - time.time() <= 30 * 86400

    shown = invoke("show", str(cert_file), "--authority", authority)
    assert shown.exit_code == 0, shown.output
    assert "VALID" in shown.stdout and cert.serial in shown.stdout

    revoked = invoke("revoke", "--cert", str(cert_file), "--reason", "decommissioned")
    assert revoked.exit_code == 0, revoked.output
    rev_file = env / f"{cert.serial}.revocation"
    rev = verify_revocation(rev_file.read_bytes(), parse_authority(authority))
    assert (rev.serial, rev.peer_id, rev.reason) == (cert.serial, peer, "decommissioned")

    # show accepts the authority as a string, an authority.pub file, or the directory
    for ref in (authority, str(default_dir / "authority.pub"), str(default_dir)):
        shown = invoke("show", str(rev_file), "--authority", ref)
        assert shown.exit_code == 0, shown.output
        assert "Revocation" in shown.stdout and "decommissioned" in shown.stdout


def test_sign_by_peer_id_with_custom_dir_and_out(env: Path) -> None:
    assert invoke("init", "--dir", "auth").exit_code == 0
    peer = load_or_create(env / "node").peer_id.to_base58()
    out = env / "certs" / "n1.cert"
    out.parent.mkdir()
    result = invoke(
        "sign",
        "--peer-id",
        peer,
        "--provider",
        "eth",
        "--expires",
        "2099-01-01T00:00:00Z",
        "--dir",
        "auth",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    cert = verify_certificate(
        out.read_bytes(), load_authority_key(env / "auth").get_public_key(), now=time.time()
    )
    assert cert.expires_at == 4070908800.0
    assert "2099-01-01T00:00:00Z" in result.stdout
    # never clobbers an existing file unless --force
    again = invoke(
        "sign",
        "--peer-id",
        peer,
        "--provider",
        "eth",
        "--expires",
        "1d",
        "--dir",
        "auth",
        "--out",
        str(out),
    )
    assert again.exit_code == 2 and "already exists" in again.stderr
    forced = invoke(
        "sign",
        "--peer-id",
        peer,
        "--provider",
        "eth",
        "--expires",
        "1d",
        "--dir",
        "auth",
        "--out",
        str(out),
        "--force",
    )
    assert forced.exit_code == 0, forced.output


def test_revoke_by_serial(env: Path) -> None:
    assert invoke("init").exit_code == 0
    peer = load_or_create(env / "node").peer_id.to_base58()
    result = invoke(
        "revoke", "--serial", "0123456789abcdef", "--peer-id", peer, "--out", "x.revocation"
    )
    assert result.exit_code == 0, result.output
    assert (env / "x.revocation").exists()


def test_init_refuses_to_overwrite(env: Path) -> None:
    first = invoke("init")
    key = (env / "config" / "otela" / "authority" / "authority.key").read_bytes()
    second = invoke("init")
    assert second.exit_code == 2
    assert "already exists" in second.stderr
    assert authority_string(first.stdout) in second.stderr  # reminds the operator of it
    assert "Traceback" not in second.output
    assert (env / "config" / "otela" / "authority" / "authority.key").read_bytes() == key
    assert authority_string(first.stdout)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sign", "--provider", "p", "--expires", "1d"], "exactly one of"),
        (["sign", "--peer-id", "nope", "--provider", "p", "--expires", "1d"], "peer id"),
        (
            ["sign", "--node-key", "missing.key", "--provider", "p", "--expires", "1d"],
            "cannot read node key",
        ),
        (
            ["sign", "--node-key", "short.key", "--provider", "p", "--expires", "1d"],
            "not a node identity key",
        ),
        (
            ["sign", "--peer-id", "{peer}", "--provider", "p", "--expires", "soon"],
            "cannot parse expiry",
        ),
        (
            ["sign", "--peer-id", "{peer}", "--provider", "p", "--expires", "2001-01-01"],
            "in the past",
        ),
        (["sign", "--peer-id", "{peer}", "--provider", "a b", "--expires", "1d"], "provider id"),
        (
            ["sign", "--peer-id", "{peer}", "--provider", "p", "--expires", "1d", "--dir", "none"],
            "membership init",
        ),
        (["revoke", "--serial", "0123456789abcdef"], "both --serial and --peer-id"),
        (["revoke", "--cert", "a.cert", "--serial", "0123456789abcdef"], "not both"),
        (["revoke", "--serial", "XYZ", "--peer-id", "{peer}"], "serial"),
        (["revoke", "--cert", "missing.cert"], "cannot read"),
        (["show", "missing.cert"], "cannot read"),
        (["show", "short.key"], "malformed"),
        (["show", "big.bin"], "larger than"),
    ],
)
def test_errors_are_clear_and_exit_2(env: Path, args: list[str], message: str) -> None:
    assert invoke("init").exit_code == 0
    peer = load_or_create(env / "node").peer_id.to_base58()
    (env / "short.key").write_bytes(b"123")
    (env / "big.bin").write_bytes(b"\0" * 10_000)
    result = invoke(*[a.replace("{peer}", peer) for a in args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_show_rejects_other_authority_and_expired(env: Path) -> None:
    assert invoke("init").exit_code == 0
    other_dir = env / "other"
    other_public = init_authority(other_dir)
    peer = load_or_create(env / "node").peer_id.to_base58()
    assert (
        invoke(
            "sign", "--peer-id", peer, "--provider", "p", "--expires", "1d", "--out", "c.cert"
        ).exit_code
        == 0
    )

    wrong = invoke("show", "c.cert", "--authority", format_authority(other_public))
    assert wrong.exit_code == 1
    assert "NOT VALID" in wrong.stdout and "not by the expected" in wrong.stdout

    key = load_authority_key(env / "config" / "otela" / "authority")
    now = time.time()
    expired = issue_certificate(
        key, peer_id=peer, provider_id="p", expires_at=now - 10, now=now - 100
    )
    (env / "old.cert").write_bytes(expired)
    result = invoke("show", "old.cert", "--authority", str(env / "config/otela/authority"))
    assert result.exit_code == 1
    assert "expired" in result.stdout
    # an expired certificate can still be revoked
    assert invoke("revoke", "--cert", "old.cert").exit_code == 0

    unchecked = invoke("show", "old.cert")
    assert unchecked.exit_code == 0 and "signature not checked" in unchecked.stdout

    junk = invoke("show", "c.cert", "--authority", "otela-authority:xyz")
    assert junk.exit_code == 2 and "authority" in junk.stderr


def test_revoke_refuses_a_certificate_of_another_authority(env: Path) -> None:
    assert invoke("init").exit_code == 0
    assert invoke("init", "--dir", "other").exit_code == 0
    peer = load_or_create(env / "node").peer_id.to_base58()
    assert (
        invoke(
            "sign",
            "--peer-id",
            peer,
            "--provider",
            "p",
            "--expires",
            "1d",
            "--dir",
            "other",
            "--out",
            "c.cert",
        ).exit_code
        == 0
    )
    result = invoke("revoke", "--cert", "c.cert")
    assert result.exit_code == 2 and "not by the expected" in result.stderr


def test_show_tampered_certificate_is_not_valid(env: Path) -> None:
    init = invoke("init")
    peer = load_or_create(env / "node").peer_id.to_base58()
    assert (
        invoke(
            "sign", "--peer-id", peer, "--provider", "p", "--expires", "1d", "--out", "c.cert"
        ).exit_code
        == 0
    )
    env_ = msgpack.unpackb((env / "c.cert").read_bytes(), raw=False)
    body = msgpack.unpackb(env_["body"], raw=False)
    body["provider_id"] = "q"
    env_["body"] = msgpack.packb(body, use_bin_type=True)
    (env / "c.cert").write_bytes(msgpack.packb(env_, use_bin_type=True))
    result = invoke("show", "c.cert", "--authority", authority_string(init.stdout))
    assert result.exit_code == 1 and "signature is invalid" in result.stdout


def test_help_lists_the_commands() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("init", "sign", "revoke", "show"):
        assert command in result.stdout
