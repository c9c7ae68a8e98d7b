"""What a model id may look like, wherever one becomes a path or an argument. Pure.

Model ids come from engines (``/v1/models``), from members' records, from a planner's
assignments and from fleet files, and end up in URLs (``/v1/models/{id}``), in engine
command lines (``--served-model-name {model}``) and in file paths (a weights directory
under a model root). So a model id is a *name*: one or more ``/``-separated segments of
letters, digits and ``. _ - : @ + = ~``, each starting with a letter, a digit or ``_``
(never ``-``, which a command line reads as an option, nor ``.``, so no ``.`` or ``..``
segment can climb out of a directory), at most ``MAX_MODEL_ID`` characters. That admits
every Hugging Face repository id (``meta-llama/Llama-3.1-8B-Instruct``), tags and
quantisation suffixes (``qwen3:8b-q4_K_M``, ``org/model@rev``), and refuses
``m/../../../../etc``, control characters, spaces, quotes, shell metacharacters and
percent-encoding.
"""

from __future__ import annotations

import re

MAX_MODEL_ID = 256
_SEGMENT = r"[A-Za-z0-9_][A-Za-z0-9._:@+=~-]*"
_MODEL_ID = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT})*")


def model_id_problem(model_id: object) -> str | None:
    """Why ``model_id`` is not a model id, or ``None`` if it is one."""
    if not isinstance(model_id, str) or not model_id:
        return "a model id is a non-empty string"
    if len(model_id) > MAX_MODEL_ID:
        return f"a model id is at most {MAX_MODEL_ID} characters"
    if not _MODEL_ID.fullmatch(model_id):
        return ("a model id is '/'-separated names of letters, digits and . _ - : @ + = ~, "
                "each starting with a letter, a digit or _")
    return None


def is_model_id(model_id: object) -> bool:
    return model_id_problem(model_id) is None
