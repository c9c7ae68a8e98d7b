"""Signed engine assignments: a planner tells an idle node which engine to start.

`message` signs and opens assignments (wire format), `policy` is what a node accepts
(issuers, engine allowlist), `replay` remembers assignment ids until they expire, `decide` is
the pure decision (launch this argv / refuse with a reason), `acceptor` is the node side
(``POST /v1/assignments`` on a node started with ``--accept-assignments``), `sender` the
planner side. docs/placer.md, "Assignments".
"""
