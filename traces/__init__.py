"""Trace formats, generators and replay (later issue)."""
