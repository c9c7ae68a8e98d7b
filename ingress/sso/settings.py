"""The dashboard's single sign-on as the operator configured it (``[ingress] sso_*``).

Checked once, when the node starts: a half-configured SSO (an issuer without a client id
or without a redirect base) stops the node with a message rather than failing at every
sign-in. The client secret comes from the environment, the config file or a file, and is
kept out of ``repr`` so that no log line or traceback can show it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from otela.services import ServiceError

if TYPE_CHECKING:
    from otela.config import NodeConfig

CALLBACK_PATH = "/ui/callback"
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class SsoConfigError(ServiceError):
    """The ``sso_*`` settings cannot work together."""


@dataclass(frozen=True)
class SsoSettings:
    issuer: str
    client_id: str
    redirect_base: str
    client_secret: str | None = field(default=None, repr=False)
    scopes: tuple[str, ...] = ("openid", "email", "profile")
    team_claim: str = "groups"
    teams: Mapping[str, str] = field(default_factory=dict)
    admin_claim: str = "groups"
    admin_values: frozenset[str] = frozenset()
    session_ttl: float = 8 * 3600.0
    login_ttl: float = 600.0  # from /ui/login to /ui/callback, at most
    user_keys: bool = False  # signed-in users may create keys of their own

    @property
    def redirect_uri(self) -> str:
        return self.redirect_base + CALLBACK_PATH

    @property
    def secure_cookies(self) -> bool:
        """Browsers reach this ingress over https: its cookies are ``Secure``."""
        return self.redirect_base.startswith("https://")

    @classmethod
    def from_config(cls, config: NodeConfig) -> SsoSettings | None:
        """The settings, ``None`` when SSO is off; ``SsoConfigError`` says what is wrong."""
        if not config.sso_issuer:
            return None
        issuer = config.sso_issuer.rstrip("/")
        _check_url(issuer, "sso_issuer", https_unless_loopback=True)
        if not config.sso_client_id:
            raise SsoConfigError("sso_issuer is set but sso_client_id is not (the client "
                                 "id this ingress has at the OpenID provider)")
        if not config.sso_redirect_base:
            raise SsoConfigError("sso_issuer is set but sso_redirect_base is not (this "
                                 "ingress's public URL, e.g. https://llm.example.org)")
        base = config.sso_redirect_base.rstrip("/")
        _check_url(base, "sso_redirect_base", https_unless_loopback=False)
        secret = config.sso_client_secret or _read_secret(config.sso_client_secret_file)
        scopes = tuple(dict.fromkeys(["openid", *config.sso_scopes]))
        return cls(issuer=issuer, client_id=config.sso_client_id, redirect_base=base,
                   client_secret=secret, scopes=scopes, team_claim=config.sso_team_claim,
                   teams=dict(config.sso_teams), admin_claim=config.sso_admin_claim,
                   admin_values=frozenset(config.sso_admin_values),
                   session_ttl=config.sso_session_ttl, user_keys=config.sso_user_keys)


def _check_url(url: str, name: str, *, https_unless_loopback: bool) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SsoConfigError(f"{name} must be an http(s) URL, got {url[:200]!r}")
    if parts.query or parts.fragment:
        raise SsoConfigError(f"{name} must not have a query or fragment: {url[:200]!r}")
    if https_unless_loopback and parts.scheme == "http" and parts.hostname not in _LOOPBACK:
        # The ID token's keys and the code exchange would travel in clear text.
        raise SsoConfigError(f"{name} must be https (plain http only on loopback, for "
                             f"tests): {url[:200]!r}")


def _read_secret(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        secret = path.read_text().strip()
    except OSError as exc:
        raise SsoConfigError(f"cannot read sso_client_secret_file {path}: "
                             f"{exc.strerror or exc}") from None
    if not secret:
        raise SsoConfigError(f"sso_client_secret_file {path} is empty")
    return secret
