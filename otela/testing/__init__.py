"""Harnesses for tests and benchmarks (like ``trio.testing``): not used by a running node.

- ``localfed``: a federation of ``otela start`` processes on this machine (also what
  ``otela demo`` runs);
- ``steady_load``: an open-loop load of chat requests that records every outcome;
- ``localpg``: a throwaway PostgreSQL server (``initdb``, a free port) for the ingress
  service's tests and benchmarks;
- ``lean_install``: a virtual environment with what ``pip install otela`` installs, and
  nothing more;
- ``netns``: a LAN of network namespaces on one bridge (partitions, packet loss);
- ``nat_topology``: private networks behind NAT routers, in namespaces, for NAT traversal;
- ``http_fuzz``: Hypothesis fuzzers for every HTTP route of a live node.

Tests and benchmarks both use them (benchmarks import no tests).
"""
