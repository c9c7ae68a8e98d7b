"""Roofline serving simulator, event-driven serving simulation and placement."""
