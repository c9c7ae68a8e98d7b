"""Engines for demos and tests, not for serving: the echo engine (an OpenAI-compatible
server that echoes prompts, ``python -m otela.engine.demo.echo``) and the builder of the
tiny random-weight model the real-vLLM tests and demo serve (``tiny_model``)."""
