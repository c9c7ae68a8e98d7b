"""OSERVE (heterogeneous, workload-aware deployment and adaptive switching): request types
(`types`), the assignment LP (`assignment`), the layout search (`search`), profiling
(`profile`), forecasts (`predict`), switch plans (`switching`), the policy (`policy`) and the
paper's workloads (`scenario`)."""
