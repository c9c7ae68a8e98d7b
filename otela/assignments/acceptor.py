"""The node side of assignments: what ``POST /v1/assignments`` does on a running node.

A node opts in with ``--accept-assignments FROM`` and an engine allowlist
(``--engine-allowlist``, default ``<home>/engines.toml``); without both it refuses every
assignment, so nothing runs on a node whose owner did not ask for it. An accepted
assignment becomes an ``EngineCommand`` handed to the node's ``launch`` callback, which
runs it under the same supervision as ``otela start --process`` (readiness, health,
fail-stop) and announces SERVING once the engine answers.

Every check is ``decide`` (pure); this module adds what a running node needs around it: the
port the engine gets (chosen here, never by the assigner), the replay memory kept in the
node's home across restarts, logging of every refusal, and answers in the OpenAI error
shape, never a traceback.
"""

from __future__ import annotations

import logging
import shlex
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libp2p.crypto.keys import PublicKey

from otela.assignments.decide import decide
from otela.assignments.message import Assignment, AssignmentError, from_http
from otela.assignments.policy import (
    Policy,
    PolicyError,
    describe,
    parse_accept_from,
    parse_allowlist,
)
from otela.assignments.replay import ReplayGuard
from otela.dataplane.errors import error_body
from otela.engine.command import EngineCommand, parse_engine_command
from otela.logbudget import LogBudget
from otela.registry.certificate import authority_id

log = logging.getLogger("otela.assignments")

ALLOWLIST_FILE = "engines.toml"
REPLAY_FILE = "assignments-seen.json"
AUTHORITY_KEYWORD = "authority"  # in --accept-assignments: the node's own --authority

Launch = Callable[[EngineCommand, Assignment], None]


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: 202 with what was started, or an OpenAI-style error."""

    status: int
    body: dict[str, Any]


def load_policy(accept_from: Iterable[str], allowlist: Path | None, home: Path, *,
                node_peer_id: str, federation_authority: PublicKey | None,
                local_gpus: int) -> Policy | None:
    """The node's policy from its settings; ``None`` when it did not opt in. Raises
    PolicyError (one line, the node exits 2) for an unusable list or allowlist."""
    entries = list(accept_from)
    if not entries:
        return None
    peers, authorities = parse_accept_from([e for e in entries if e != AUTHORITY_KEYWORD])
    if AUTHORITY_KEYWORD in entries:
        if federation_authority is None:
            raise PolicyError("--accept-assignments authority needs --authority (the "
                              "federation's membership authority)")
        authorities[authority_id(federation_authority)] = federation_authority
    path = allowlist or home / ALLOWLIST_FILE
    try:
        text = path.read_text()
    except OSError as exc:
        raise PolicyError(f"--accept-assignments needs an engine allowlist: cannot read "
                          f"{path}: {exc.strerror or exc} (see --engine-allowlist)") from None
    engines = parse_allowlist(text, str(path))
    # A node without GPUs (a CPU engine) still runs one replica of TP 1.
    return Policy(node_peer_id, peers, authorities, engines, max(1, local_gpus))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free now on `host`, for the engine to listen on."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class Acceptor:
    """Checks assignments and launches the accepted ones (see the module docstring)."""

    def __init__(self, policy: Policy | None, *, launch: Launch, busy: Callable[[], bool],
                 replay_path: Path | None = None, clock: Callable[[], float] = time.time,
                 pick_port: Callable[[], int] = free_port) -> None:
        self.policy = policy
        self.launch = launch
        self.busy = busy
        self.replay_path = replay_path
        self.clock = clock
        self.pick_port = pick_port
        self.replay = self._load_replay()
        self.accepted = 0
        self.refused: dict[str, int] = {}
        self._refusal_log = LogBudget()  # anyone can cause a refusal: bound the lines

    def describe(self) -> dict[str, Any]:
        """``GET /v1/assignments``: whether this node takes assignments, from whom (peer
        ids, authority fingerprints) and which engine names; never the command templates.
        Planners read it to leave out nodes that would refuse them."""
        if self.policy is None:
            return {"accepting": False, "peers": [], "authorities": [], "engines": [],
                    "busy": self.busy()}
        d = describe(self.policy)
        return {"accepting": d["opted_in"], "peers": d["peers"],
                "authorities": d["authorities"], "engines": d["engines"],
                "busy": self.busy()}

    def submit(self, payload: Any) -> Answer:
        """Decide on one ``POST /v1/assignments`` body and launch what passes."""
        if self.policy is None:
            return self._refuse(403, "not_opted_in", "this node accepts no assignments (it "
                                "was started without --accept-assignments)")
        try:
            data = from_http(payload)
        except AssignmentError as exc:
            return self._refuse(400, "malformed", str(exc))
        port = self.pick_port()
        d = decide(data, self.policy, now=self.clock(), replay=self.replay, port=port,
                   busy=self.busy())
        if not d.launch or d.assignment is None:
            return self._refuse(d.http_status, d.code, d.reason, d.assignment)
        a = d.assignment
        self._save_replay()
        command = _engine_command(d.argv, port)
        log.info("assignment %s from %s accepted: serving %r (engine %s, TP %d): %s",
                    a.id, a.issuer, a.model, a.engine, a.tp, d.command)
        self.accepted += 1
        self.launch(command, a)
        return Answer(202, {"accepted": True, "assignment": a.id, "model": a.model,
                            "engine": a.engine, "tp": a.tp, "command": d.command,
                            "engine_url": command.url})

    def _refuse(self, status: int, code: str, reason: str,
                a: Assignment | None = None) -> Answer:
        self.refused[code] = self.refused.get(code, 0) + 1
        skipped = self._refusal_log.take()
        if skipped is not None:
            who = "" if a is None else f" {a.id} from {a.issuer!r}"
            more = f" ({skipped} more refusals not logged)" if skipped else ""
            log.warning("assignment%s refused (%s): %r%s", who, code, reason, more)
        return Answer(status, error_body(status, f"assignment refused: {reason}", code=code))

    def _load_replay(self) -> ReplayGuard:
        path = self.replay_path
        if path is None or not path.exists():
            return ReplayGuard()
        try:
            guard = ReplayGuard.from_json(path.read_text())
        except (OSError, ValueError) as exc:
            # Expiry still bounds a replay; a damaged file must not keep the node down.
            log.warning("ignoring the assignment replay memory %s: %s", path, exc)
            return ReplayGuard()
        guard.prune(self.clock())
        return guard

    def _save_replay(self) -> None:
        if self.replay_path is None:
            return
        tmp = self.replay_path.with_suffix(".tmp")
        try:
            tmp.write_text(self.replay.to_json())
            tmp.replace(self.replay_path)
        except OSError as exc:
            log.warning("cannot keep the assignment replay memory in %s: %s",
                        self.replay_path, exc)


def _engine_command(argv: tuple[str, ...], port: int) -> EngineCommand:
    """The command as ``--process`` would take it; where the engine listens is read from
    its argv when the template says (``--port``/``--host``), else the chosen port here."""
    cmd = parse_engine_command(shlex.join(argv), f"http://127.0.0.1:{port}")
    try:
        own = parse_engine_command(shlex.join(argv))
    except ValueError:
        return cmd
    return own if own.url.endswith(f":{port}") else cmd
