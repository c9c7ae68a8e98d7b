"""The node network: a py-libp2p host, GossipSub, and otela's own stream protocols."""
