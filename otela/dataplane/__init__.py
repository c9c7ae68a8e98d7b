"""The request path's own machinery, below any route: otela's HTTP/1.1 server (``http``)
and the ASGI bridge that runs the node's API on it (``asgi``), bounded JSON bodies
(``jsonbody``), in-flight accounting for draining (``inflight``) and the authentication
of node-to-node engine hops (``hop_auth``). Imports nothing from ``otela.api`` or
``otela.routing``: they build on it.
"""
