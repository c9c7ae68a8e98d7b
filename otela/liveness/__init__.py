"""Failure detection: SWIM-style probing with suspicion, kept out of the registry CRDT."""
