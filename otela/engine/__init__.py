"""Wrapping an inference engine: parse its command, launch it, wait for it, watch it."""
