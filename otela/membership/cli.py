"""``otela membership``: create a federation's authority, admit nodes, revoke them, inspect files.

Exit codes: 0 success; 1 a file that does not verify (``show``); 2 bad arguments or input.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import NoReturn

import typer
from libp2p.crypto.ed25519 import Ed25519PrivateKey
from libp2p.crypto.keys import PublicKey
from libp2p.peer.id import ID
from rich.markup import escape

from otela.console import make_console
from otela.membership.authority import (
    KEY_FILE,
    PUB_FILE,
    default_authority_dir,
    init_authority,
    load_authority_key,
    load_authority_public,
)
from otela.registry.certificate import (
    MAX_MESSAGE_BYTES,
    Certificate,
    MembershipError,
    Revocation,
    authority_id,
    decode_certificate,
    format_authority,
    format_time,
    inspect_unverified,
    issue_certificate,
    issue_revocation,
    parse_authority,
    parse_expiry,
    peer_public_key,
    verify_certificate,
    verify_revocation,
)

app = typer.Typer(
    help="Membership admission: an authority key signs certificates binding a node's peer id "
    "to a provider; only nodes with a valid certificate join a federation that has an authority.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
console = make_console(soft_wrap=True, highlight=False)
err_console = make_console(stderr=True, soft_wrap=True, highlight=False)

_DIR_HELP = (
    "Authority directory (authority.key, authority.pub). Default: $XDG_CONFIG_HOME/otela/authority."
)


def _fail(message: str, code: int = 2) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {escape(message)}")
    raise typer.Exit(code)


def _field(name: str, value: str) -> None:
    console.print(f"  [bold]{name:<12}[/] {escape(value)}")


def _short(peer_id: str) -> str:
    """The distinctive tail of a peer id (every Ed25519 one starts with 12D3KooW)."""
    return peer_id[-8:]


def _write_new(path: Path, data: bytes, force: bool) -> None:
    """Write a certificate/revocation (public, 0644) without clobbering unless asked."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except FileExistsError:
        _fail(f"{path} already exists (use --force to overwrite)")
    except OSError as exc:
        _fail(f"cannot write {path}: {exc.strerror}")


def _read_message(path: Path) -> bytes:
    try:
        if path.stat().st_size > MAX_MESSAGE_BYTES:
            _fail(f"{path} is larger than {MAX_MESSAGE_BYTES} bytes: not a certificate")
        return path.read_bytes()
    except OSError as exc:
        _fail(f"cannot read {path}: {exc.strerror}")


def _expires_in(expires_at: float, now: float) -> str:
    left = expires_at - now
    if left <= 0:
        return f"{format_time(expires_at)} (expired)"
    days, hours = divmod(int(left) // 3600, 24)
    return f"{format_time(expires_at)} (in {days}d {hours}h)"


@app.command()
def init(dir: Path = typer.Option(None, "--dir", help=_DIR_HELP)) -> None:
    """Create a federation's membership authority key and print the authority string.

    Give the string to every node (--authority); keep authority.key secret: whoever holds it
    can admit any node. An existing authority is never overwritten.
    """
    directory = dir or default_authority_dir()
    try:
        public = init_authority(directory)
    except MembershipError as exc:
        try:
            existing = format_authority(load_authority_public(directory))
            err_console.print(f"existing authority: {existing}")
        except MembershipError:
            pass
        _fail(str(exc))
    console.print(f"[green]Created membership authority[/] in {escape(str(directory))}")
    _field("private key", str(directory / KEY_FILE) + "  (mode 0600; keep it secret)")
    _field("public", str(directory / PUB_FILE))
    _field("id", authority_id(public))
    console.print("\nNodes join this federation with:")
    typer.echo(format_authority(public))


@app.command()
def sign(
    node_key: Path | None = typer.Option(
        None,
        "--node-key",
        help="The node's identity key file (<node home>/identity.key); only its public half "
        "is used. Alternatively give --peer-id.",
    ),
    peer_id: str | None = typer.Option(
        None, "--peer-id", help="The node's libp2p peer id (12D3KooW...), e.g. from its status."
    ),
    provider: str = typer.Option(..., "--provider", help="Provider id the node is bound to."),
    expires: str = typer.Option(
        ...,
        "--expires",
        help="When the certificate expires: a duration (90m, 12h, 30d, 2w) or a UTC date/time "
        "(2027-01-31, 2027-01-31T12:00:00Z).",
    ),
    dir: Path = typer.Option(None, "--dir", help=_DIR_HELP),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Where to write it. Default: ./<provider>-<peer id tail>.cert"
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite --out if it exists."),
) -> None:
    """Issue a certificate admitting one node (by key file or peer id) as part of a provider."""
    if (node_key is None) == (peer_id is None):
        _fail("give exactly one of --node-key PATH or --peer-id ID")
    if node_key is not None:
        peer_id = _peer_id_from_key_file(node_key)
    assert peer_id is not None
    now = time.time()
    try:
        peer_public_key(peer_id)
        expires_at = parse_expiry(expires, now=now)
        key = load_authority_key(dir or default_authority_dir())
        data = issue_certificate(
            key, peer_id=peer_id, provider_id=provider, expires_at=expires_at, now=now
        )
        cert = decode_certificate(data, key.get_public_key())
    except MembershipError as exc:
        _fail(str(exc))
    path = out or Path(f"{_safe_name(provider)}-{_short(peer_id)}.cert")
    _write_new(path, data, force)
    console.print(f"[green]Signed certificate[/] {escape(str(path))}")
    _describe_cert(cert, now)


@app.command()
def revoke(
    cert_file: Path | None = typer.Option(
        None, "--cert", help="The certificate to revoke (or give --serial and --peer-id)."
    ),
    serial: str | None = typer.Option(None, "--serial", help="Serial of the certificate."),
    peer_id: str | None = typer.Option(None, "--peer-id", help="Peer id the certificate names."),
    reason: str = typer.Option("", "--reason", help="Why (kept in the revocation, max 256)."),
    dir: Path = typer.Option(None, "--dir", help=_DIR_HELP),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Where to write it. Default: ./<serial>.revocation"
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite --out if it exists."),
) -> None:
    """Sign a revocation for a certificate; nodes that load it stop admitting that certificate.

    Revocations are permanent. Distribute the .revocation file to nodes (they gossip it on).
    """
    if cert_file is not None and (serial is not None or peer_id is not None):
        _fail("give either --cert FILE or --serial with --peer-id, not both")
    if cert_file is None and (serial is None or peer_id is None):
        _fail("give --cert FILE, or both --serial and --peer-id")
    now = time.time()
    try:
        key = load_authority_key(dir or default_authority_dir())
        if cert_file is not None:
            # Signature only: an expired certificate may still be revoked.
            cert = decode_certificate(_read_message(cert_file), key.get_public_key())
            serial, peer_id = cert.serial, cert.peer_id
        assert serial is not None and peer_id is not None
        data = issue_revocation(key, serial=serial, peer_id=peer_id, now=now, reason=reason)
        revocation = verify_revocation(data, key.get_public_key())
    except MembershipError as exc:
        _fail(str(exc))
    path = out or Path(f"{serial}.revocation")
    _write_new(path, data, force)
    console.print(f"[yellow]Revoked certificate[/] {escape(serial)} -> {escape(str(path))}")
    _describe_revocation(revocation)


@app.command()
def show(
    file: Path = typer.Argument(..., help="A .cert or .revocation file."),
    authority: str | None = typer.Option(
        None,
        "--authority",
        help="Verify against this authority: the otela-authority:... string, an authority.pub "
        "file, or an authority directory. Without it the file is only decoded.",
    ),
) -> None:
    """Decode a certificate or revocation, and verify it if an authority is given.

    Exits 1 when the signature, authority or validity period does not check out.
    """
    data = _read_message(file)
    now = time.time()
    try:
        message = inspect_unverified(data)
    except MembershipError as exc:
        _fail(f"{file}: {exc}")
    if isinstance(message, Certificate):
        console.print(f"[bold]Certificate[/] {escape(str(file))}")
        _describe_cert(message, now)
    else:
        console.print(f"[bold]Revocation[/] {escape(str(file))}")
        _describe_revocation(message)
    if authority is None:
        console.print("[yellow]signature not checked[/] (pass --authority to verify)")
        return
    try:
        public = _resolve_authority(authority)
    except MembershipError as exc:
        _fail(str(exc))
    try:
        if isinstance(message, Certificate):
            verify_certificate(data, public, now=now)
        else:
            verify_revocation(data, public)
    except MembershipError as exc:
        console.print(f"[bold red]NOT VALID[/]: {escape(str(exc))}")
        raise typer.Exit(1) from None
    console.print(f"[bold green]VALID[/]: signed by authority {authority_id(public)}")


# --- helpers ---------------------------------------------------------------------------------


def _describe_cert(cert: Certificate, now: float) -> None:
    _field("serial", cert.serial)
    _field("peer id", cert.peer_id)
    _field("provider", cert.provider_id)
    _field("issued", format_time(cert.issued_at))
    _field("expires", _expires_in(cert.expires_at, now))
    _field("authority", cert.authority_id)


def _describe_revocation(revocation: Revocation) -> None:
    _field("serial", revocation.serial)
    _field("peer id", revocation.peer_id)
    _field("revoked", format_time(revocation.revoked_at))
    _field("reason", revocation.reason or "-")
    _field("authority", revocation.authority_id)


def _peer_id_from_key_file(path: Path) -> str:
    try:
        seed = path.read_bytes()
    except OSError as exc:
        _fail(f"cannot read node key {path}: {exc.strerror}")
    if len(seed) != 32:
        _fail(f"{path} is not a node identity key (<node home>/identity.key, a 32-byte seed)")
    public = Ed25519PrivateKey.from_bytes(seed).get_public_key()
    return str(ID.from_pubkey(public).to_base58())


def _resolve_authority(value: str) -> PublicKey:
    """An authority string, an authority.pub file, or a directory holding one."""
    if value.strip().startswith("otela-authority:"):
        return parse_authority(value)
    path = Path(value).expanduser()
    if path.is_dir():
        return load_authority_public(path)
    if path.is_file():
        if path.stat().st_size > 1024:
            raise MembershipError(f"{path} is too large to be an authority.pub")
        try:
            return parse_authority(path.read_text())
        except (OSError, UnicodeDecodeError) as exc:
            raise MembershipError(f"cannot read {path}: {exc}") from None
    return parse_authority(value)


def _safe_name(provider: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", provider)[:64] or "provider"
