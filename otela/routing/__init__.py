"""Request routing: choose a serving node for a model, and forward the request to it."""
