"""Serving policies compared in the companion benchmarks (OSERVE, Gyges, Prism, SageServe and
their baselines), run on the event simulator's cluster model."""
