"""The node's decision on one assignment: launch this argv, or refuse with a reason. Pure.

Checks, in order (the first failure is the reason): the node opted in; the envelope is well
formed; the issuer is accepted (a listed peer id, or a listed authority) and the signature is
its; the assignment is for this node; it is valid now (not expired, not issued in the
future beyond the clock skew, not longer-lived than `max_ttl_s`); its id was not used
before; the node is idle; the engine is in the allowlist, the model matches the engine's
globs and is a plain model id, the TP degree fits the node; the command renders. Only a
launch decision records the id in the replay memory.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from dataclasses import dataclass

from otela.assignments.message import (
    AUTHORITY_ISSUER,
    Assignment,
    AssignmentError,
    check_signature,
    open_unverified,
)
from otela.assignments.policy import Policy
from otela.assignments.replay import ReplayGuard
from otela.names import model_id_problem
from otela.registry.certificate import MembershipError, peer_public_key

PARAM_VALUE = re.compile(r"[A-Za-z0-9._/:@+=-]{1,128}")

LAUNCH = "launch"
REFUSE = "refuse"


@dataclass(frozen=True)
class Decision:
    action: str  # LAUNCH or REFUSE
    reason: str
    code: str  # machine-readable: ok, not_opted_in, malformed, unauthorized, forged, ...
    assignment: Assignment | None = None
    argv: tuple[str, ...] = ()

    @property
    def launch(self) -> bool:
        return self.action == LAUNCH

    @property
    def command(self) -> str:
        """The argv as one shell-quoted string (what `otela start --process` takes)."""
        return shlex.join(self.argv)

    @property
    def http_status(self) -> int:
        return {"ok": 202, "malformed": 400, "replayed": 409, "busy": 409,
                "expired": 410}.get(self.code, 403)


def _refuse(code: str, reason: str, a: Assignment | None = None) -> Decision:
    return Decision(REFUSE, reason, code, a)


def decide(data: bytes, policy: Policy, *, now: float, replay: ReplayGuard, port: int,
           busy: bool = False) -> Decision:
    """Decide on the envelope `data`; `port` is where this node would run the engine."""
    if not policy.opted_in:
        return _refuse("not_opted_in", "this node accepts no assignments "
                       "(no --accept-assignments, or an empty engine allowlist)")
    try:
        a, body, sig = open_unverified(data)
    except AssignmentError as exc:
        return _refuse("malformed", str(exc))
    # issuer and signature
    if a.issuer.startswith(AUTHORITY_ISSUER):
        key = policy.authorities.get(a.issuer[len(AUTHORITY_ISSUER):])
        if key is None:
            return _refuse("unauthorized", f"issuer {a.issuer} is not an accepted authority", a)
    else:
        if a.issuer not in policy.peers:
            return _refuse("unauthorized", f"issuer {a.issuer} is not in "
                           "--accept-assignments", a)
        try:
            key = peer_public_key(a.issuer)
        except MembershipError as exc:
            return _refuse("unauthorized", str(exc), a)
    if not check_signature(body, sig, key):
        return _refuse("forged", f"signature does not verify against issuer {a.issuer}", a)
    if a.target != policy.node_peer_id:
        return _refuse("wrong_target", f"assignment is for {a.target}, not this node", a)
    # time and replay
    if now >= a.expires_at:
        return _refuse("expired", "assignment has expired", a)
    if a.issued_at > now + policy.clock_skew_s:
        return _refuse("not_yet_valid", "assignment is issued in the future "
                       "(clock skew beyond the limit)", a)
    if a.expires_at - a.issued_at > policy.max_ttl_s:
        return _refuse("too_long_lived", f"assignment lives {a.expires_at - a.issued_at:.0f} s,"
                       f" more than the {policy.max_ttl_s:.0f} s this node allows", a)
    if a.id in replay:
        return _refuse("replayed", f"assignment {a.id} was already used", a)
    if busy:
        return _refuse("busy", "this node already runs an engine", a)
    # what to run
    template = policy.engines.get(a.engine)
    if template is None:
        return _refuse("engine_not_allowed", f"engine {a.engine!r} is not in this node's "
                       f"allowlist ({', '.join(sorted(policy.engines))})", a)
    problem = model_id_problem(a.model)
    if problem is not None:
        return _refuse("bad_model", f"model id {a.model[:300]!r} is not a model id: {problem}",
                       a)
    if template.models and not any(fnmatch.fnmatchcase(a.model, g) for g in template.models):
        return _refuse("model_not_allowed", f"model {a.model!r} is not allowed for engine "
                       f"{template.name} ({', '.join(template.models)})", a)
    max_tp = min(template.max_tp or policy.local_gpus, policy.local_gpus)
    if a.tp > max_tp:
        return _refuse("too_many_gpus", f"TP {a.tp} needs more GPUs than this node offers "
                       f"({max_tp})", a)
    params = dict(a.params or {})
    extra = set(params) - set(template.params)
    if extra:
        return _refuse("bad_params", f"parameters {sorted(extra)} are not allowed for engine "
                       f"{template.name}", a)
    if not all(PARAM_VALUE.fullmatch(v) for v in params.values()):
        return _refuse("bad_params", "a parameter value has characters that are not allowed", a)
    missing = set(template.params) - set(params)
    if missing:
        return _refuse("bad_params", f"engine {template.name} needs parameters "
                       f"{sorted(missing)}", a)
    values = {"model": a.model, "tp": str(a.tp), "port": str(int(port)), **params}
    argv = tuple(token.format_map(values) for token in shlex.split(template.command))
    replay.remember(a.id, a.expires_at, now)
    return Decision(LAUNCH, f"assigned by {a.issuer}", "ok", a, argv)
