"""The credential the batch runner sends its lines with: it acts for the batch's key.

A batch's lines go through this node's own OpenAI endpoint like any client's requests, so
they are routed, limited and counted as the key that made the batch. The runner cannot
send that key's secret (only its hash is stored), so the node signs a token per key with
a secret of its own: ``otela-batch-<key id>-<HMAC-SHA256(secret, key id)>``.
``Access.authenticate`` takes such a token as the key it names, with that key's state
(revoked, expired, over budget: refused as the key would be). The secret is derived from
the node's identity key (``ingress.plugin.node_secret``), so the node's data-path workers,
which serve the port the runner sends to, check the tokens of the control process's
runner; without it (tests), a process mints a random one. Tokens and the secret are never
logged or stored; a token names one key and cannot be turned into another's.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

PREFIX = b"otela-batch-"


class InternalCredentials:
    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret if secret is not None else secrets.token_bytes(32)

    def _mac(self, key_id: bytes) -> bytes:
        return hmac.new(self._secret, key_id, hashlib.sha256).hexdigest().encode()

    def header(self, key_id: str) -> str:
        """The ``Authorization`` value that acts for ``key_id``."""
        ident = key_id.encode()
        return f"Bearer {(PREFIX + ident + b'-' + self._mac(ident)).decode()}"

    def key_id(self, token: bytes) -> str | None:
        """The key a token acts for, if this process signed it (else ``None``)."""
        if not token.startswith(PREFIX):
            return None
        ident, _, mac = token[len(PREFIX):].rpartition(b"-")
        if not ident or not hmac.compare_digest(mac, self._mac(ident)):
            return None
        return ident.decode("latin-1")

    def __repr__(self) -> str:  # never the secret, in a log or a traceback
        return "InternalCredentials(<secret>)"
