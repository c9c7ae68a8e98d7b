"""Request routing: which serving node gets a request (``policy``, pure) and forwarding it
there, trying another only when it provably never ran (``router``, ``forward``, ``p2p``)."""
