"""HTTP over libp2p: the data path to nodes that plain HTTP cannot reach (docs/nat.md)."""
