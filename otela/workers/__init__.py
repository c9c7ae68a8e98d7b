"""Data-path worker processes (``--workers N``): each runs the request path assembled as the
node assembles its own (``otela.api.assembly``), on the node's port (SO_REUSEPORT), while
the control process (``control.py``) owns the mesh, the registry and the engine; they talk
over a local channel (``channel.py``), and ``view.py`` is the registry as a worker sees it.
"""
