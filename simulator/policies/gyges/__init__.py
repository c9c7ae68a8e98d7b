"""Gyges (dynamic cross-instance TP transformation): pure decisions in `core`, simulation glue
in `policy`, the paper's workload in `scenario`."""
