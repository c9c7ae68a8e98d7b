"""The OpenID provider as this ingress talks to it: discovery, the authorization URL, the
code exchange and the ID token's checks.

OAuth with authlib (``AsyncOAuth2Client``: PKCE S256, the client's authentication at the
token endpoint), JOSE with joserfc (authlib's own successor to ``authlib.jose``). Both are
the ``sso`` extra, imported only where SSO is configured.

The ID token is checked as OpenID Connect Core 3.1.3.7 asks: signed by a key of the
provider's JWKS with an algorithm it announces (never ``none``, never HMAC: the client
secret is no key here), ``iss`` the configured issuer, ``aud`` naming this client (and
``azp`` this client where there are several), not expired, and the ``nonce`` of this
sign-in. The userinfo endpoint's claims are added where the provider has one (many put
groups there rather than in the ID token), provided its ``sub`` is the ID token's.

Every failure is a ``ProviderError`` with a message meant for the person signing in (and
the operator reading the log): no traceback reaches a browser, none stops the node.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
from authlib.common.errors import AuthlibBaseError
from authlib.integrations.httpx_client import AsyncOAuth2Client
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from ingress.sso.sessions import PendingLogin
from ingress.sso.settings import SsoSettings

DISCOVERY_TTL = 3600.0  # the provider's metadata and keys are read again after this
TIMEOUT = 10.0  # seconds for any one call to the provider
LEEWAY = 60  # seconds of clock difference tolerated on exp / iat
_ASYMMETRIC = ("RS", "PS", "ES", "Ed")  # algorithm families of a provider's public keys


class ProviderError(Exception):
    """A sign-in failed at or because of the provider: ``status`` for the browser,
    ``code`` for scripts and logs, the message for people."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _unreachable(settings: SsoSettings, exc: Exception) -> ProviderError:
    return ProviderError(502, f"The identity provider {settings.issuer} cannot be reached "
                         f"({type(exc).__name__}). Try again later, or sign in with an API "
                         "key.", "provider_unreachable")


class OpenIDClient:
    def __init__(self, settings: SsoSettings) -> None:
        self.settings = settings
        self._metadata: dict[str, Any] | None = None
        self._keys: KeySet | None = None
        self._read_at = 0.0

    def _http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=TIMEOUT, follow_redirects=False)

    def _oauth(self) -> AsyncOAuth2Client:
        s = self.settings
        return AsyncOAuth2Client(
            client_id=s.client_id, client_secret=s.client_secret, scope=" ".join(s.scopes),
            redirect_uri=s.redirect_uri, code_challenge_method="S256", timeout=TIMEOUT,
            token_endpoint_auth_method="client_secret_basic" if s.client_secret else "none")

    async def metadata(self) -> dict[str, Any]:
        """The provider's ``/.well-known/openid-configuration`` (cached for an hour)."""
        if self._metadata is not None and time.monotonic() - self._read_at < DISCOVERY_TTL:
            return self._metadata
        url = self.settings.issuer + "/.well-known/openid-configuration"
        found = await self._get_json(url, "discovery document")
        if found.get("issuer", "").rstrip("/") != self.settings.issuer:
            # OpenID Connect Discovery 4.3: a document naming another issuer is not its.
            raise ProviderError(502, f"The identity provider's discovery document names the "
                                f"issuer {str(found.get('issuer'))[:200]!r}, not "
                                f"{self.settings.issuer!r} (check sso_issuer).",
                                "provider_misconfigured")
        for name in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
            if not isinstance(found.get(name), str):
                raise ProviderError(502, f"The identity provider's discovery document has no "
                                    f"{name}.", "provider_misconfigured")
        self._metadata, self._keys, self._read_at = found, None, time.monotonic()
        return found

    async def _get_json(self, url: str, what: str) -> dict[str, Any]:
        try:
            async with self._http() as http:
                response = await http.get(url)
        except httpx.HTTPError as exc:
            raise _unreachable(self.settings, exc) from None
        if response.status_code != 200:
            raise ProviderError(502, f"The identity provider answered {response.status_code} "
                                f"for its {what} ({url[:200]}).", "provider_unreachable")
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise ProviderError(502, f"The identity provider's {what} is not a JSON object.",
                                "provider_misconfigured")
        return body

    async def _key_set(self, refresh: bool = False) -> KeySet:
        if self._keys is None or refresh:
            meta = await self.metadata()
            try:
                found: Any = await self._get_json(meta["jwks_uri"], "signing keys")
                self._keys = KeySet.import_key_set(found)
            except (JoseError, KeyError, TypeError, ValueError) as exc:
                raise ProviderError(502, f"The identity provider's signing keys cannot be "
                                    f"read ({type(exc).__name__}).",
                                    "provider_misconfigured") from None
        return self._keys

    async def authorization_url(self, login: PendingLogin) -> str:
        """Where to send the browser to sign in: code flow, PKCE S256, state and nonce."""
        meta = await self.metadata()
        async with self._oauth() as oauth:
            url, _ = oauth.create_authorization_url(
                meta["authorization_endpoint"], state=login.state,
                code_verifier=login.verifier, nonce=login.nonce)
        return str(url)

    async def sign_in(self, code: str, login: PendingLogin) -> dict[str, Any]:
        """Exchange ``code`` (with the sign-in's PKCE verifier) and return the user's
        verified claims: the ID token's, plus userinfo's where there is that endpoint."""
        meta = await self.metadata()
        try:
            async with self._oauth() as oauth:
                token = await oauth.fetch_token(
                    meta["token_endpoint"], grant_type="authorization_code", code=code,
                    code_verifier=login.verifier)
        except httpx.HTTPError as exc:
            raise _unreachable(self.settings, exc) from None
        except (AuthlibBaseError, ValueError) as exc:
            error = getattr(exc, "error", None) or type(exc).__name__
            raise ProviderError(400, f"The identity provider refused this sign-in's code "
                                f"({str(error)[:100]}: it was used already, has expired, or "
                                "was not issued for this sign-in). Sign in again.",
                                "code_refused") from None
        id_token = token.get("id_token")
        if not isinstance(id_token, str):
            raise ProviderError(502, "The identity provider returned no ID token (is "
                                "'openid' among the client's scopes there?).",
                                "id_token_invalid")
        claims = await self.verify_id_token(id_token, login.nonce)
        access = token.get("access_token")
        if isinstance(meta.get("userinfo_endpoint"), str) and isinstance(access, str):
            claims = {**await self._userinfo(meta["userinfo_endpoint"], access,
                                             claims["sub"]), **claims}
        return claims

    async def verify_id_token(self, id_token: str, nonce: str) -> dict[str, Any]:
        meta = await self.metadata()
        announced = meta.get("id_token_signing_alg_values_supported") or ["RS256"]
        algorithms = [a for a in announced if isinstance(a, str) and a.startswith(_ASYMMETRIC)]
        try:
            try:
                token = jwt.decode(id_token, await self._key_set(), algorithms=algorithms)
            except JoseError:  # the provider may have rotated its keys: read them again
                token = jwt.decode(id_token, await self._key_set(refresh=True),
                                   algorithms=algorithms)
            jwt.JWTClaimsRegistry(
                leeway=LEEWAY,
                iss={"essential": True, "value": self.settings.issuer},
                aud={"essential": True, "value": self.settings.client_id},
                sub={"essential": True}, exp={"essential": True}, iat={"essential": True},
                nonce={"essential": True, "value": nonce},
            ).validate(token.claims)
        except JoseError as exc:
            raise ProviderError(502, f"The identity provider's ID token failed verification "
                                f"({type(exc).__name__}: {str(exc)[:150]}).",
                                "id_token_invalid") from None
        claims = dict(token.claims)
        audience = claims.get("aud")
        if isinstance(audience, list) and len(audience) > 1 and \
                claims.get("azp") != self.settings.client_id:
            raise ProviderError(502, "The ID token names several audiences but was not "
                                "issued to this client (azp).", "id_token_invalid")
        return claims

    async def _userinfo(self, url: str, access_token: str, subject: str) -> dict[str, Any]:
        try:
            async with self._http() as http:
                response = await http.get(
                    url, headers={"authorization": f"Bearer {access_token}"})
            info = response.json() if response.status_code == 200 else None
        except httpx.HTTPError as exc:
            raise _unreachable(self.settings, exc) from None
        except ValueError:
            info = None  # a signed (JWT) userinfo answer: the ID token's claims suffice
        if not isinstance(info, dict):
            return {}
        if info.get("sub") != subject:  # Core 5.3.2: else it must not be used
            raise ProviderError(502, "The identity provider's userinfo names another "
                                "subject than its ID token.", "id_token_invalid")
        return info
