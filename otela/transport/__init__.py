"""HTTP over libp2p (``/otela/http/1``): the data path to nodes plain HTTP cannot reach
(docs/nat.md). Many requests share one long-lived stream per peer, told apart by request
id (``framing``); ``client`` sends them, ``server`` relays them to this node's engine."""
