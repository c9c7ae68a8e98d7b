"""A protocol-level simulator of otela's mesh: thousands of nodes in one process.

Each simulated node runs otela's own sans-IO protocol cores (the registry CRDT and its
replica core, anti-entropy as steps, the liveness table, news, watch, health, round trips
and the probe loop's decisions, peering's plan, load-report schedules) under a
discrete-event clock and a simulated network (latency classes, loss as TCP
retransmission delay, bandwidth, partitions, NAT through relays, pauses, a CPU model).
What is modelled rather than run is the libp2p library: GossipSub's mesh, TCP, Noise and
Yamux framing (``gossip.py``, ``network.py``). Deterministic for a seed. docs/scale.md.
"""
