"""Signed engine assignments: a planner tells an idle node which engine to start.

Self-contained and not wired into the daemon here. `message` signs and opens assignments
(wire format), `policy` is what a node accepts (issuers, engine allowlist), `replay` remembers
assignment ids until they expire, `decide` is the pure decision (launch this argv / refuse
with a reason), `sender` POSTs assignments to nodes. docs/placer.md, "Assignments".
"""
