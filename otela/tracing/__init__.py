"""The otela trace format and its recorder: what a node writes with ``--record-trace``.

``schema`` is the record format (pure); ``recorder`` appends records to a rotated file from
the request path without blocking it. ``traces/`` (generators, replay, analysis, other
formats) builds on this; the node imports nothing from there.
"""
