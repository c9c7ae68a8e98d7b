"""The bits a checkpoint stores, as a fleet deployment and a placer demand name them.

One parser for both files, so that ``weight_bits = 8`` means the same and is refused for
the same reasons wherever an operator writes it (the simulator's ``Precision`` holds the
result; its weight formats are checked where the simulator is at hand).
"""

from __future__ import annotations

from typing import Any

BITS_KEYS = ("weight_bits", "act_bits", "kv_bits")  # what a checkpoint stores, 16 unless said
STORED_BITS = (4.0, 8.0, 16.0)


def stored_bits(value: Any) -> float:
    """``value`` as a width the simulator models (4, 8 or 16); ValueError saying why not."""
    if isinstance(value, bool):
        raise ValueError(f"must be a number of bits, not {value!r}")
    try:
        bits = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"must be a number of bits, not {value!r}") from None
    if bits not in STORED_BITS:
        raise ValueError(f"must be 4, 8 or 16 bits, not {value!r}")
    return bits
