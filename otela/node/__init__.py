"""The running node's roles beside its composition root (``otela.daemon``).

``otela.daemon.Node`` builds the parts and runs them; what the outside world reads of a
running node is kept here, each in a small object of its own: what the HTTP API shows
(``view``: ``/v1/health``, ``/v1/network``, the catalog's scope), what ``/metrics`` copies
at each scrape (``metrics_source``), and how this node routes (``routing_status``, read by
both). The data-path workers' state (``--workers``) is ``otela.workers.state``.
"""
