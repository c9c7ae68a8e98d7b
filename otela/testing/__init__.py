"""Harnesses for tests and benchmarks (like ``trio.testing``): not used by a running node.

``lean_install``: a virtual environment with what ``pip install otela`` installs, and
nothing more.
"""
