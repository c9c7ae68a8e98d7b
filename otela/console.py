"""The rich ``Console`` every otela command prints through.

On a terminal, rich's defaults. Anywhere else (``| cat``, a file, a CI log) rich assumes
80 columns and wraps: a multiaddr printed by ``otela demo`` came out split over two lines,
so it could not be copied or grepped, and tables were squeezed. Off a terminal the console
therefore never wraps text (``soft_wrap``) and gives tables all the width their content
needs; colour and spinners are off there already (rich detects that).
"""

from __future__ import annotations

import sys
from typing import IO, Any

from rich.console import Console

# Wide enough for any table otela prints; tables still take only the width their cells need.
UNWRAPPED_WIDTH = 4096


def is_terminal(stream: IO[str] | None) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):  # closed, or not a real file
        return False


def make_console(file: IO[str] | None = None, *, stderr: bool = False, **options: Any) -> Console:
    """A console for ``file`` (default stdout, or stderr with ``stderr``) that wraps only
    on a terminal."""
    stream = file if file is not None else (sys.stderr if stderr else sys.stdout)
    if is_terminal(stream):
        return Console(file=file, stderr=stderr, **options)
    options.setdefault("soft_wrap", True)
    options.setdefault("width", UNWRAPPED_WIDTH)
    return Console(file=file, stderr=stderr, **options)
