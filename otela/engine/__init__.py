"""Wrapping an inference engine: parse its command (``command``), run it as a supervised
child process (``process``), wait for it and watch it (``supervisor``, ``health``), read
its models' metadata (``metadata``) and keep its logs (``logs``). ``demo`` holds engines
for demos and tests, not for serving."""
