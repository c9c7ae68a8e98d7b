"""The placer: `otela plan`, a CP-SAT deployment planner driven by the serving simulator.

Pure cores (no I/O): `pool` (GPUs and hosts), `demand` (models, rates, lengths, SLOs),
`curves` (piecewise-linear latency-vs-load), `cpsat` (the constraint model), `memp` and
`exhaustive` (baselines), `plan` (the result and its host assignment). I/O lives apart:
`profile` (simulating and caching configurations), `federation` (reading a live registry),
`sbatch` (rendering scripts), `evaluate` (event simulation of a plan), `cli` (typer app).
docs/placer.md explains the model.
"""
