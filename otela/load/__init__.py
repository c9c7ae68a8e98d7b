"""A serving node's load, as it reports it: what its engine says (``engine_metrics``), what
its own counters say (``source``), its capacity weight (``capacity``), and the soft-state
gossip that spreads reports at a bounded rate (``gossip``). Ingresses read the reports
in ``otela.routing.load``."""
