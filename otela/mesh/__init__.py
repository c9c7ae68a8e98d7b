"""The node's network: the py-libp2p host and GossipSub (``host``), bounded random peering
(``peering``), bootstrap (``bootstrap``), NAT traversal — reachability, relays, hole
punching (``nat``, ``reachability``, ``relay``) — what kind each connection is
(``connections``), the connection log (``netlog``), length-prefixed frames for otela's
one-shot stream protocols (``framing``) and the py-libp2p workarounds (``workarounds``)."""
