"""``otela keys`` and ``otela usage``: the ingress service's keys and usage from a shell.

Either straight on the database (``--db``: a SQLite path or ``postgresql://...``; default
the node home's ``ingress.db``), for the operator on the ingress host, or through a running
ingress's admin API (``--url`` with ``OTELA_ADMIN_TOKEN``), from anywhere. Both give the
same objects, so ``--json`` output does not depend on the way in.
"""

from __future__ import annotations

import csv
import getpass
import io
import json
import socket
import time
from pathlib import Path
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from ingress import admin_input, export, keystore, prices, usage
from ingress.database import Database, DatabaseError, DatabaseUrl
from ingress.keys import ApiKey
from ingress.migrations import migrate, open_existing
from ingress.standing import described
from otela.config import resolve
from otela.config.values import parse_duration
from otela.console import make_console
from otela.dataplane.errors import RequestError

keys_app = typer.Typer(no_args_is_help=True, help=(
    "API keys of the public ingress service: create (the secret is printed once), list, "
    "show, update, history, revoke, rotate. On the database (--db) or through an ingress "
    "(--url and OTELA_ADMIN_TOKEN)."))

DB_HELP = ("The ingress database: a SQLite file or postgresql://... [env: OTELA_INGRESS_DB; "
           "config: [ingress] db; default: ingress.db in the node home]")
URL_HELP = ("An ingress node's HTTP URL: use its admin API (token from OTELA_ADMIN_TOKEN) "
            "instead of the database.")


def _actor() -> str:
    """Who changes keys straight on the database, for the key's history."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"otela keys on the database by {user}@{socket.gethostname()}"


class _Way:
    """The database or an ingress's admin API, behind one set of calls. Settings resolve as
    ``otela start``'s do (``--db`` > ``OTELA_*`` environment > the config file's
    ``[ingress]`` table > defaults), so ``otela keys`` finds the database and admin token
    the node's config file names."""

    def __init__(self, db: str | None, url: str | None, config_file: Path | None = None,
                 *, reads_only: bool = False) -> None:
        self.url = url.rstrip("/") if url else None
        self.db: Database | None = None
        config = resolve({"ingress_db": db} if db else {}, None, config_file).config
        self.admin_token = config.admin_token
        if self.url is None:
            # A command that only reads never creates a database: a mistyped --db is an
            # error naming the path, not an empty database that lists no keys.
            self.db = Database.connect(DatabaseUrl.parse(config.ingress_db or "", config.home),
                                       create=not reads_only)
            try:
                open_existing(self.db) if reads_only else migrate(self.db)
            except BaseException:
                self.db.close()
                raise

    def _api(self, method: str, path: str, **kwargs: Any) -> Any:
        token = self.admin_token
        if not token:
            raise _Failure("--url needs the admin token: OTELA_ADMIN_TOKEN, or admin_token "
                           "in the config file's [ingress] table")
        import httpx  # only through an ingress (--url): ~0.14 s of every command's start

        try:
            answer = httpx.request(method, f"{self.url}/v1/admin{path}", timeout=30,
                                   headers={"authorization": f"Bearer {token}"}, **kwargs)
        except httpx.HTTPError as exc:
            raise _Failure(f"cannot reach {self.url}: {exc}") from None
        if answer.status_code >= 400:
            try:
                message = answer.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = answer.text[:200]
            raise _Failure(f"{answer.status_code}: {message}")
        return answer.json()

    def create(self, spec: dict[str, Any]) -> dict[str, Any]:
        if self.db is None:
            return dict(self._api("POST", "/keys", json=spec))
        key, secret = keystore.create(self.db, admin_input.key_spec(spec), actor=_actor())
        return {**self._shown(key), "key": secret}

    def update(self, key_id: str, change: dict[str, Any]) -> dict[str, Any]:
        if self.db is None:
            return dict(self._api("PATCH", f"/keys/{key_id}", json=change))
        key = keystore.update(self.db, admin_input.key_id(key_id),
                              admin_input.key_change(change), actor=_actor())
        return self._shown(key)

    def history(self, key_id: str) -> list[dict[str, Any]]:
        if self.db is None:
            return list(self._api("GET", f"/keys/{key_id}/history")["data"])
        return [c.to_dict() for c in keystore.history(self.db, admin_input.key_id(key_id))]

    def all_keys(self) -> list[dict[str, Any]]:
        if self.db is None:
            return list(self._api("GET", "/keys")["data"])
        return described(self.db, keystore.all_keys(self.db), time.time())

    def show(self, key_id: str) -> dict[str, Any]:
        if self.db is None:
            return dict(self._api("GET", f"/keys/{key_id}"))
        return self._shown(keystore.get(self.db, admin_input.key_id(key_id)))

    def _shown(self, key: ApiKey) -> dict[str, Any]:
        assert self.db is not None
        return described(self.db, [key], time.time())[0]

    def set_team(self, name: str, change: dict[str, Any]) -> dict[str, Any]:
        if self.db is None:
            return dict(self._api("PUT", f"/teams/{name}", json=change))
        name, checked = admin_input.team_change(name, change)
        return keystore.set_team(self.db, name, checked).to_dict()

    def revoke(self, key_id: str) -> dict[str, Any]:
        if self.db is None:
            return dict(self._api("POST", f"/keys/{key_id}/revoke"))
        return self._shown(keystore.revoke(self.db, admin_input.key_id(key_id),
                                           actor=_actor()))

    def rotate(self, key_id: str) -> dict[str, Any]:
        if self.db is None:
            return dict(self._api("POST", f"/keys/{key_id}/rotate"))
        key, secret = keystore.rotate(self.db, admin_input.key_id(key_id), actor=_actor())
        return {**self._shown(key), "key": secret}

    def usage(self, by: str, since: float | None, until: float | None,
              filters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        if self.db is None:
            params = {"by": by, **_window_params(since, until), **(filters or {})}
            return list(self._api("GET", "/usage", params=params)["data"])
        return [t.to_dict() for t in usage.aggregate(self.db, by, since, until, None,
                                                     self._resolved(filters))]

    def _resolved(self, filters: dict[str, Any] | None) -> dict[str, Any] | None:
        """Filters with a user named by email taken to the user's id."""
        assert self.db is not None
        if not filters or "user" not in filters:
            return filters
        return {**filters, "user": keystore.user_id_of(self.db, filters["user"])}

    def requests(self, since: float | None, until: float | None, filters: dict[str, Any],
                 limit: int, after: str | None) -> tuple[list[dict[str, Any]], bool]:
        """A page of the request log, newest first, and whether more follow."""
        if self.db is None:
            params = {**_window_params(since, until), **filters, "limit": limit,
                      **({"after": after} if after else {})}
            page = self._api("GET", "/requests", params=params)
            return list(page["data"]), bool(page["has_more"])
        return usage.request_log(self.db, since, until, None, self._resolved(filters), limit,
                                 after)

    def prices(self) -> list[dict[str, Any]]:
        if self.db is None:
            return list(self._api("GET", "/prices")["data"])
        return [p.to_dict() for p in prices.all_prices(self.db)]

    def set_price(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.db is None:
            return dict(self._api("PUT", "/prices", json=body))
        return prices.set_price(self.db, admin_input.price(body)).to_dict()

    def remove_price(self, model: str, provider: str | None) -> None:
        if self.db is None:
            self._api("DELETE", "/prices", params={"model": model,
                                                   **({"provider": provider} if provider
                                                      else {})})
        elif not prices.remove_price(self.db, model, provider):
            raise _Failure(f"no price is set for {model}"
                           + (f" on {provider}" if provider else " on every provider"))


def _window_params(since: float | None, until: float | None) -> dict[str, float]:
    return {**({"since": since} if since is not None else {}),
            **({"until": until} if until is not None else {})}


class _Failure(Exception):
    pass


def _run(work: Any) -> Any:
    """Errors as one line on stderr and exit status 1 (2 for bad input), never a trace."""
    try:
        return work()
    except (RequestError, ValueError) as exc:
        typer.echo(f"otela: {getattr(exc, 'message', exc)}", err=True)
        raise typer.Exit(1 if getattr(exc, "status", 400) == 404 else 2) from None
    except keystore.KeyNotFound as exc:
        typer.echo(f"otela: no such API key: {exc}", err=True)
        raise typer.Exit(1) from None
    except keystore.UserNotFound as exc:
        typer.echo(f"otela: {exc}", err=True)
        raise typer.Exit(1) from None
    except keystore.KeyRevoked as exc:
        typer.echo(f"otela: the API key {exc} is revoked, for good: create a new one",
                   err=True)
        raise typer.Exit(1) from None
    except (_Failure, DatabaseError) as exc:
        typer.echo(f"otela: {exc}", err=True)
        raise typer.Exit(1) from None


def _print_keys(keys: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(keys if len(keys) != 1 else keys[0], indent=2))
        return
    table = Table(show_edge=False)
    for column in ("id", "owner", "user", "name", "status", "models", "providers", "rpm",
                   "tpm", "budget", "used tokens", "expires"):
        table.add_column(column)
    for key in keys:
        limits = key.get("limits") or {}
        expires = key.get("expires_at")
        table.add_row(*_plain(
            key["id"], key["owner"], _user_text(key), key.get("name") or "", key["status"],
            ",".join(key["models"]) if key.get("models") else "any",
            ",".join(key["providers"]) if key.get("providers") else "any",
            str(limits.get("rpm") or "-"), str(limits.get("tpm") or "-"),
            _budget_text(key) if key.get("budget_tokens") is not None
            or key.get("budget_spend") is not None else "-",
            _used_text(key),
            _expiry(expires)))
    make_console().print(table)


def _user_text(key: dict[str, Any]) -> str:
    """A key's user as a person reads it: the email, else the name, else the id."""
    user = key.get("user") or {}
    return str(user.get("email") or user.get("name") or key.get("user_id") or "-")


def _used_text(key: dict[str, Any]) -> str:
    """Tokens (and spend) used in the budget's period, or over the key's life."""
    used = key.get("budget_used") or {}
    if key.get("budget_period") in (None, "lifetime") or not used:
        text = str(key.get("used_tokens", ""))
    else:
        text = f"{used.get('tokens', 0)} this {key['budget_period']}"
    if key.get("budget_spend") is not None and used:
        text += f", {used.get('spend', 0):g} spent"
    return text


def _plain(*cells: str) -> list[Text]:
    """Table cells shown as written. rich reads markup in plain strings: a key owner, or a
    model name any client can put in a usage row, such as ``[/x]`` made ``otela keys list``
    or ``otela usage --by model`` die with a MarkupError (and ``[red]`` restyled the table)."""
    return [Text(cell) for cell in cells]


def _expiry(expires: float | None) -> str:
    """An expiry for the table; one beyond what the platform can format (a row written
    before the admin API bounded it) must not take the whole listing down."""
    if not expires:
        return "never"
    try:
        return time.strftime("%Y-%m-%d %H:%M", time.gmtime(expires))
    except (OverflowError, OSError, ValueError):
        return "far future" if expires > 0 else "far past"


def _print_secret(key: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(key, indent=2))
        return
    typer.echo(f"{key['id']} ({key['owner']}): {key['key']}")
    typer.echo("Keep this secret now: it is stored hashed and cannot be shown again.",
               err=True)


_DB = typer.Option(None, "--db", metavar="URL", help=DB_HELP, show_default=False)
_URL = typer.Option(None, "--url", metavar="URL", help=URL_HELP, show_default=False)
_JSON = typer.Option(False, "--json", help="Print JSON instead of a table.")
_CONFIG = typer.Option(None, "--config", metavar="FILE", show_default=False,
                       help="Config file whose [ingress] db and admin_token apply (as for "
                       "`otela start`). Default: $XDG_CONFIG_HOME/otela/config.toml. Env: "
                       "OTELA_CONFIG.")


# Budgets (docs/ingress.md#budgets): the same options on create, update and teams.
_BUDGET_TOKENS = typer.Option(None, "--budget-tokens",
                              help="Tokens (prompt + completion) per budget period.")
_BUDGET_SPEND = typer.Option(None, "--budget-spend", help="Money per budget period, at "
                             "the prices set with 'otela prices' (then only priced models "
                             "may be used).")
_BUDGET_PERIOD = typer.Option(None, "--budget-period", help="day, month or lifetime (the "
                              "default): a daily budget is fresh at 00:00 UTC, a monthly "
                              "one on the 1st.")

# Fair sharing (docs/scheduling.md): the same options on create and update.
_TEAM = typer.Option(None, "--team", help="The team whose fair share the key's requests "
                     "are charged to (docs/scheduling.md).")
_WEIGHT = typer.Option(None, "--weight", help="The key's weight within its team's share "
                       "(default 1).")
_PRIORITY = typer.Option(None, "--priority", metavar="CLASS", help="The best priority "
                         "class the key may use (default: any the ingress has).")
_QUEUE_WAIT = typer.Option(None, "--queue-wait", metavar="DURATION", help="The longest its "
                           "requests may wait in the ingress queue.")
_USER = typer.Option(None, "--user", metavar="USER", help="The single sign-on user the key "
                     "belongs to: a user id (user_...) or the email of one user (users are "
                     "made on their first sign-in to the dashboard).")


@keys_app.command("create")
def create(
    owner: str = typer.Option(..., "--owner", help="Who the key is for (shown in usage)."),
    name: str = typer.Option("", "--name", help="A label for the key."),
    expires_in: str | None = typer.Option(None, "--expires-in", metavar="DURATION",
                                          help="Expire after this long (e.g. 30d, 12h)."),
    model: list[str] = typer.Option([], "--model", metavar="ID",
                                    help="A model the key may use (repeat; default: any)."),
    provider: list[str] = typer.Option(
        [], "--provider", metavar="NAME",
        help="A provider the key's requests may run on (repeat; default: the ingress's "
        "trust set). Narrows, never widens, the ingress's own --trusted-providers."),
    rpm: int | None = typer.Option(None, "--rpm", help="Requests per minute."),
    tpm: int | None = typer.Option(None, "--tpm", help="Tokens (prompt + completion) per "
                                   "minute."),
    max_concurrent: int | None = typer.Option(None, "--max-concurrent",
                                              help="Requests in flight at once."),
    budget_tokens: int | None = _BUDGET_TOKENS, budget_spend: float | None = _BUDGET_SPEND,
    budget_period: str | None = _BUDGET_PERIOD,
    team: str | None = _TEAM, weight: float | None = _WEIGHT,
    priority: str | None = _PRIORITY, queue_wait: str | None = _QUEUE_WAIT,
    user: str | None = _USER,
    db: str | None = _DB, url: str | None = _URL, as_json: bool = _JSON,
    config_file: Path | None = _CONFIG,
) -> None:
    """Create a key; its secret is printed once."""
    def work() -> dict[str, Any]:
        spec: dict[str, Any] = {"owner": owner, "name": name or None}
        if expires_in:
            spec["expires_in"] = max(1, round(parse_duration(expires_in)))
        for field, value in (("models", model or None), ("providers", provider or None),
                             ("rpm", rpm), ("tpm", tpm), ("max_concurrent", max_concurrent),
                             ("budget_tokens", budget_tokens),
                             ("budget_spend", budget_spend), ("budget_period", budget_period),
                             *_scheduling(team, weight, priority, queue_wait),
                             ("user", user)):
            if value is not None:
                spec[field] = value
        return _Way(db, url, config_file).create({k: v for k, v in spec.items() if v is not None})
    _print_secret(_run(work), as_json)


@keys_app.command("list")
def list_keys(db: str | None = _DB, url: str | None = _URL, as_json: bool = _JSON,
              config_file: Path | None = _CONFIG) -> None:
    """Every key (revoked and expired ones too), with the tokens each has used."""
    keys = _run(lambda: _Way(db, url, config_file, reads_only=True).all_keys())
    if as_json:
        typer.echo(json.dumps(keys, indent=2))
    else:
        _print_keys(keys, False)


@keys_app.command("show")
def show(key_id: str = typer.Argument(..., metavar="KEY_ID"), db: str | None = _DB,
         url: str | None = _URL, as_json: bool = _JSON,
         config_file: Path | None = _CONFIG) -> None:
    """One key's settings and use."""
    _print_keys([_run(lambda: _Way(db, url, config_file, reads_only=True).show(key_id))],
                as_json)


_CLEARABLE = ("name", "expires", "models", "providers", "rpm", "tpm", "max_concurrent",
              "budget_tokens", "budget_spend", "budget_period", "team", "weight", "priority",
              "queue_wait", "user")


def _scheduling(team: str | None, weight: float | None, priority: str | None,
                queue_wait: str | None) -> list[tuple[str, Any]]:
    return [("team", team), ("weight", weight), ("priority", priority),
            ("queue_wait", None if queue_wait is None else parse_duration(queue_wait))]


@keys_app.command("team")
def team(
    name: str = typer.Argument(..., metavar="TEAM"),
    weight: float | None = typer.Option(None, "--weight", help="The team's weight: its "
                                        "share of a busy model against other teams' "
                                        "(default 1)."),
    budget_tokens: int | None = _BUDGET_TOKENS, budget_spend: float | None = _BUDGET_SPEND,
    budget_period: str | None = _BUDGET_PERIOD,
    model: list[str] = typer.Option([], "--model", metavar="ID", help="A model the team's "
                                    "keys may use (repeat: the list; a key may narrow it)."),
    provider: list[str] = typer.Option([], "--provider", metavar="NAME", help="A provider "
                                       "the team's requests may run on (repeat: the list)."),
    rpm: int | None = typer.Option(None, "--rpm", help="The whole team's requests per "
                                   "minute."),
    tpm: int | None = typer.Option(None, "--tpm", help="The whole team's tokens per minute."),
    max_concurrent: int | None = typer.Option(None, "--max-concurrent", help="The whole "
                                              "team's requests in flight at once."),
    priority: str | None = typer.Option(None, "--priority", metavar="CLASS", help="The best "
                                        "priority class the team's keys may use (a key's "
                                        "own applies too: the lower class wins)."),
    clear: list[str] = typer.Option([], "--clear", metavar="FIELD", help="Back to the "
                                    "default: weight, budget_tokens, budget_spend, "
                                    "budget_period, models, providers, rpm, tpm, "
                                    "max_concurrent, priority. Repeatable."),
    db: str | None = _DB, url: str | None = _URL, as_json: bool = _JSON,
    config_file: Path | None = _CONFIG,
) -> None:
    """Set a team's weight in fair sharing (docs/scheduling.md: two teams flooding one
    model get tokens in the ratio of their weights), its budget, limits (shared by all its
    keys' requests), the models and providers its keys may use and the best priority
    class they may ask for. A key's own settings apply too: the tighter wins."""
    def work() -> dict[str, Any]:
        change: dict[str, Any] = {field: None for field in clear}
        for field, value in (("weight", weight), ("budget_tokens", budget_tokens),
                             ("budget_spend", budget_spend),
                             ("budget_period", budget_period), ("models", model or None),
                             ("providers", provider or None), ("rpm", rpm), ("tpm", tpm),
                             ("max_concurrent", max_concurrent), ("priority", priority)):
            if value is not None:
                change[field] = value
        return _Way(db, url, config_file).set_team(name, change)
    result = _run(work)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        typer.echo(f"team {result['name']}: weight {result['weight']:g}, budget "
                   f"{_budget_text(result)}, priority {result.get('priority') or 'any'}")


def _budget_text(item: dict[str, Any]) -> str:
    parts = []
    if item.get("budget_tokens") is not None:
        parts.append(f"{item['budget_tokens']} tokens")
    if item.get("budget_spend") is not None:
        parts.append(f"{item['budget_spend']:g} spend")
    if not parts:
        return "none"
    period = item.get("budget_period")
    return " and ".join(parts) + (" in all" if period in (None, "lifetime")
                                  else f" per {period}")


@keys_app.command("update")
def update(
    key_id: str = typer.Argument(..., metavar="KEY_ID"),
    owner: str | None = typer.Option(None, "--owner", help="Who the key is for."),
    name: str | None = typer.Option(None, "--name", help="A label for the key."),
    expires_in: str | None = typer.Option(None, "--expires-in", metavar="DURATION",
                                          help="Expire this long from now (e.g. 30d)."),
    model: list[str] = typer.Option([], "--model", metavar="ID",
                                    help="The models the key may use (repeat: the new list)."),
    provider: list[str] = typer.Option([], "--provider", metavar="NAME",
                                       help="The providers its requests may run on "
                                       "(repeat: the new list)."),
    rpm: int | None = typer.Option(None, "--rpm", help="Requests per minute."),
    tpm: int | None = typer.Option(None, "--tpm", help="Tokens per minute."),
    max_concurrent: int | None = typer.Option(None, "--max-concurrent",
                                              help="Requests in flight at once."),
    budget_tokens: int | None = _BUDGET_TOKENS, budget_spend: float | None = _BUDGET_SPEND,
    budget_period: str | None = _BUDGET_PERIOD,
    team: str | None = _TEAM, weight: float | None = _WEIGHT,
    priority: str | None = _PRIORITY, queue_wait: str | None = _QUEUE_WAIT,
    user: str | None = _USER,
    clear: list[str] = typer.Option(
        [], "--clear", metavar="FIELD",
        help=f"Put a setting back to its default (no limit, any model, no expiry...): "
        f"{', '.join(_CLEARABLE)}. Repeatable."),
    db: str | None = _DB, url: str | None = _URL, as_json: bool = _JSON,
    config_file: Path | None = _CONFIG,
) -> None:
    """Change a key's settings (checked as at creation; recorded in its history). Its id,
    secret and usage stay; a revoked key cannot be changed."""
    def work() -> dict[str, Any]:
        change: dict[str, Any] = {}
        for field in clear:
            if field not in _CLEARABLE:
                raise ValueError(f"--clear takes one of {', '.join(_CLEARABLE)}, not "
                                 f"{field!r}")
            change["expires_in" if field == "expires" else field] = None
        if expires_in:
            change["expires_in"] = max(1, round(parse_duration(expires_in)))
        for field, value in (("owner", owner), ("name", name), ("models", model or None),
                             ("providers", provider or None), ("rpm", rpm), ("tpm", tpm),
                             ("max_concurrent", max_concurrent),
                             ("budget_tokens", budget_tokens),
                             ("budget_spend", budget_spend), ("budget_period", budget_period),
                             *_scheduling(team, weight, priority, queue_wait),
                             ("user", user)):
            if value is not None:
                change[field] = value
        return _Way(db, url, config_file).update(key_id, change)
    _print_keys([_run(work)], as_json)


@keys_app.command("history")
def history(key_id: str = typer.Argument(..., metavar="KEY_ID"), db: str | None = _DB,
            url: str | None = _URL, as_json: bool = _JSON,
            config_file: Path | None = _CONFIG) -> None:
    """Every change of a key: when, by whom, what (old -> new)."""
    changes = _run(lambda: _Way(db, url, config_file, reads_only=True).history(key_id))
    if as_json:
        typer.echo(json.dumps(changes, indent=2))
        return
    table = Table(show_edge=False)
    for column in ("when (UTC)", "action", "by", "changes"):
        table.add_column(column)
    for change in changes:
        what = "; ".join(f"{field}: {json.dumps(old)} -> {json.dumps(new)}"
                         for field, (old, new) in change["changes"].items())
        table.add_row(*_plain(_expiry(change["at"]), change["action"], change["actor"], what))
    make_console().print(table)


@keys_app.command("revoke")
def revoke(key_id: str = typer.Argument(..., metavar="KEY_ID"), db: str | None = _DB,
           url: str | None = _URL, as_json: bool = _JSON,
           config_file: Path | None = _CONFIG) -> None:
    """Revoke a key for good: every ingress on the database refuses it within seconds."""
    _print_keys([_run(lambda: _Way(db, url, config_file).revoke(key_id))], as_json)


@keys_app.command("rotate")
def rotate(key_id: str = typer.Argument(..., metavar="KEY_ID"), db: str | None = _DB,
           url: str | None = _URL, as_json: bool = _JSON,
           config_file: Path | None = _CONFIG) -> None:
    """A new secret for a key (same id, limits and usage); the old secret stops working."""
    _print_secret(_run(lambda: _Way(db, url, config_file).rotate(key_id)), as_json)


def _when(value: str | None, param: str) -> float | None:
    """A unix time, an ISO date/time, or a duration ago (``24h``: a day ago)."""
    if value is None:
        return None
    try:
        return time.time() - parse_duration(value)
    except ValueError:
        return admin_input.time_param(value, param)


_SINCE = typer.Option(None, "--since", metavar="WHEN",
                      help="From: unix time, ISO date/time, or an age (24h).")
_UNTIL = typer.Option(None, "--until", metavar="WHEN",
                      help="Until (exclusive), same forms. Default: now.")
_F_KEY = typer.Option(None, "--key", metavar="KEY_ID", help="Only this key's requests.")
_F_TEAM = typer.Option(None, "--team", help="Only requests of this team's keys.")
_F_USER = typer.Option(None, "--user", metavar="USER", help="Only requests of this user's "
                       "keys (a user id, or the email of one user).")
_F_MODEL = typer.Option(None, "--model", metavar="ID", help="Only this model.")
_F_PROVIDER = typer.Option(None, "--provider", help="Only requests served by this provider.")
_F_NODE = typer.Option(None, "--node", metavar="PEER_ID",
                       help="Only requests served by this node.")
_F_STATUS = typer.Option(None, "--status", help="Only requests answered with this status.")


def _filters(key: str | None, team: str | None, model: str | None, provider: str | None,
             node: str | None, status: int | None, user: str | None = None
             ) -> dict[str, Any]:
    given = {"key": key, "team": team, "user": user, "model": model, "provider": provider,
             "node": node, "status": None if status is None else str(status)}
    return admin_input.usage_filters({k: v for k, v in given.items() if v is not None})


def usage_command(
    since: str | None = _SINCE, until: str | None = _UNTIL,
    by: str = typer.Option("key", "--by", help="Group by key, team, user (of the key), owner "
                           "(of the key), model, provider, node, ingress or status."),
    key: str | None = _F_KEY, team: str | None = _F_TEAM, user: str | None = _F_USER,
    model: str | None = _F_MODEL, provider: str | None = _F_PROVIDER,
    node: str | None = _F_NODE, status: int | None = _F_STATUS,
    output: str = typer.Option("table", "--format", help="table, csv or json."),
    db: str | None = _DB, url: str | None = _URL, config_file: Path | None = _CONFIG,
) -> None:
    """Usage of the public ingress service: requests, tokens, errors, latency and spend
    per group (spend at the prices set with 'otela prices'; 'unpriced' counts requests
    of models that had none)."""
    if output not in ("table", "csv", "json"):
        typer.echo("otela: --format must be table, csv or json", err=True)
        raise typer.Exit(2)
    rows = _run(lambda: _Way(db, url, config_file, reads_only=True).usage(
        admin_input.group_by(by), _when(since, "since"), _when(until, "until"),
        _filters(key, team, model, provider, node, status, user)))
    columns = ["group", *(["label"] if by == "user" else []), "requests", "prompt_tokens",
               "completion_tokens", "errors", "mean_latency_ms", "mean_ttft_ms", "spend",
               "unpriced_requests"]
    if output == "json":
        typer.echo(json.dumps({"by": by, "data": rows}, indent=2))
    elif output == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow([by if c == "group" else c for c in columns])
        for row in rows:
            writer.writerow(["" if row.get(c) is None else row[c] for c in columns])
        typer.echo(out.getvalue(), nl=False)
    else:
        table = Table(show_edge=False)
        for column in columns:
            table.add_column(by if column == "group" else column.replace("_", " "),
                             justify="left" if column in ("group", "label") else "right")
        for row in rows:
            table.add_row(*_plain(*("-" if row.get(c) is None else str(row[c]) for c in columns)))
        make_console().print(table)


_TABLE_COLUMNS = ("finished_at", "key_id", "team", "user_id", "model", "provider", "status",
                  "prompt_tokens", "completion_tokens", "latency_ms", "ttft_ms", "spend")


def requests_command(
    since: str | None = _SINCE, until: str | None = _UNTIL,
    key: str | None = _F_KEY, team: str | None = _F_TEAM, user: str | None = _F_USER,
    model: str | None = _F_MODEL, provider: str | None = _F_PROVIDER,
    node: str | None = _F_NODE, status: int | None = _F_STATUS,
    limit: int | None = typer.Option(None, "--limit", min=1, help="At most this many "
                                     "(default: 50 for a table or json; every request for "
                                     "csv and jsonl)."),
    after: str | None = typer.Option(None, "--after", metavar="ID", help="Start after this "
                                     "request (the last id of the previous page)."),
    output: str = typer.Option("table", "--format", help="table, json, csv or jsonl."),
    out_file: Path | None = typer.Option(None, "--output", "-o", metavar="FILE",
                                         help="Write to FILE instead of the terminal."),
    db: str | None = _DB, url: str | None = _URL, config_file: Path | None = _CONFIG,
) -> None:
    """The request log of the public ingress service, newest first: one entry per request
    (time, key, team, user, model, node, provider, status, tokens, latency, time to first
    token, spend; never the prompt or the answer). csv and jsonl export every request in
    the window and filters."""
    if output not in ("table", "json", "csv", "jsonl"):
        typer.echo("otela: --format must be table, json, csv or jsonl", err=True)
        raise typer.Exit(2)
    filters = _run(lambda: _filters(key, team, model, provider, node, status, user))
    start, end = _when(since, "since"), _when(until, "until")
    way = _run(lambda: _Way(db, url, config_file, reads_only=True))
    sink = out_file.open("wb") if out_file is not None else None
    try:
        if output in ("csv", "jsonl"):
            _export(way, output, start, end, filters, limit, after, sink)
            return
        entries, more = _run(lambda: way.requests(start, end, filters, limit or 50, after))
        if output == "json":
            text = json.dumps({"data": entries, "has_more": more}, indent=2) + "\n"
            if sink is not None:
                sink.write(text.encode())
            else:
                typer.echo(text, nl=False)
            return
        table = Table(show_edge=False)
        for column in ("id", *_TABLE_COLUMNS):
            table.add_column(column.replace("_", " "))
        for entry in entries:
            cells = [_log_cell(c, entry[c]) for c in ("id", *_TABLE_COLUMNS)]
            table.add_row(*_plain(*cells))
        if sink is not None:
            text_out = io.StringIO()
            make_console(file=text_out, width=200).print(table)
            sink.write(text_out.getvalue().encode())
        else:
            make_console().print(table)
        if more:
            typer.echo(f"more: --after {entries[-1]['id']}", err=True)
    finally:
        if sink is not None:
            sink.close()


def _log_cell(column: str, value: Any) -> str:
    if value is None:
        return "-"
    if column == "finished_at":
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(value)))
    return str(value)


def _export(way: _Way, fmt: str, since: float | None, until: float | None,
            filters: dict[str, Any], limit: int | None, after: str | None,
            sink: Any) -> None:
    """Every matching request (or ``limit``), a page at a time, to ``sink`` or stdout."""
    write = sink.write if sink is not None else (
        lambda data: typer.echo(data.decode(), nl=False))
    left = limit
    header = True
    while left is None or left > 0:
        size = export.PAGE if left is None else min(export.PAGE, left)
        entries, more = _run(lambda after=after, size=size: way.requests(
            since, until, filters, size, after))
        write(export.render(entries, fmt, header))
        header = False
        if left is not None:
            left -= len(entries)
        if not more or not entries:
            return
        after = entries[-1]["id"]


prices_app = typer.Typer(no_args_is_help=True, help=(
    "Model prices of the public ingress service, per million prompt (input) and "
    "completion (output) tokens, in the operator's currency: each request's spend is "
    "priced when it is recorded. On the database (--db) or through an ingress (--url)."))


@prices_app.command("list")
def list_prices(db: str | None = _DB, url: str | None = _URL, as_json: bool = _JSON,
                config_file: Path | None = _CONFIG) -> None:
    """Every price set."""
    found = _run(lambda: _Way(db, url, config_file, reads_only=True).prices())
    if as_json:
        typer.echo(json.dumps(found, indent=2))
        return
    table = Table(show_edge=False)
    for column in ("model", "provider", "input / Mtok", "output / Mtok"):
        table.add_column(column)
    for price in found:
        table.add_row(*_plain(price["model"], price["provider"] or "(any)",
                              f"{price['input_per_mtok']:g}", f"{price['output_per_mtok']:g}"))
    make_console().print(table)


@prices_app.command("set")
def set_price(
    model: str = typer.Argument(..., metavar="MODEL"),
    input_price: float = typer.Option(..., "--input", help="Price per million prompt tokens."),
    output_price: float = typer.Option(..., "--output",
                                       help="Price per million completion tokens."),
    provider: str | None = typer.Option(None, "--provider", help="Only when this provider "
                                        "serves it (default: every provider without its "
                                        "own price)."),
    db: str | None = _DB, url: str | None = _URL, as_json: bool = _JSON,
    config_file: Path | None = _CONFIG,
) -> None:
    """Set (or change) a model's price; requests recorded from now on are priced with it."""
    body = {"model": model, "provider": provider, "input_per_mtok": input_price,
            "output_per_mtok": output_price}
    price = _run(lambda: _Way(db, url, config_file).set_price(body))
    if as_json:
        typer.echo(json.dumps(price, indent=2))
    else:
        typer.echo(f"{price['model']} on {price['provider'] or 'every provider'}: "
                   f"{price['input_per_mtok']:g} in, {price['output_per_mtok']:g} out "
                   "per million tokens")


@prices_app.command("remove")
def remove_price(
    model: str = typer.Argument(..., metavar="MODEL"),
    provider: str | None = typer.Option(None, "--provider",
                                        help="The provider's own price (default: the "
                                        "price for every provider)."),
    db: str | None = _DB, url: str | None = _URL, config_file: Path | None = _CONFIG,
) -> None:
    """Remove a price: the model's requests are recorded unpriced from now on."""
    _run(lambda: _Way(db, url, config_file).remove_price(model, provider))
    typer.echo(f"removed the price of {model} on {provider or 'every provider'}")
