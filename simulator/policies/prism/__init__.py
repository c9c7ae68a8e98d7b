"""Prism (many models sharing GPUs): placement, eviction and admission decisions (`core`),
engines sharing one GPU's memory and compute (`shared`), the policy and its baselines
(`policy`) and a Hyperbolic-like eight-model workload (`scenario`)."""
