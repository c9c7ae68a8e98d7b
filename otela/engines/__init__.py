"""Engines shipped with otela. ``echo`` is a stand-in engine for demos and tests."""
