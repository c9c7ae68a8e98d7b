"""SageServe (forecast-aware scaling across regions and tiers): the load forecaster
(`forecast`), the hourly ILP (`ilp`), the per-request scaling and NIW release rules
(`rules`), the policy (`policy`) and a day of traffic shaped like the paper's (`scenario`)."""
