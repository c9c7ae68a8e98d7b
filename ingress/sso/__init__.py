"""Single sign-on for the /ui dashboard: an OpenID Connect relying party (authorization
code with PKCE), users made from the provider's claims, and dashboard sessions.

- ``settings``: what the operator configured (``[ingress] sso_*``), checked at start;
- ``claims``: which team a user is in and whether they are an admin (pure);
- ``users``, ``sessions``: the ``users``, ``ui_sessions`` and ``sso_logins`` tables;
- ``oidc``: the provider (discovery, code exchange, ID token checks; authlib, joserfc);
- ``gate``: which dashboard calls a session cookie may make (and the CSRF rule);
- ``routes``: ``/ui/login``, ``/ui/callback``, ``/ui/session``, ``/ui/logout``;
- ``pages``: the small HTML pages a browser is shown when a sign-in fails.

None of it is on the request path: the OpenAI routes take API keys only.
"""
