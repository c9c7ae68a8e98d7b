"""Where otela keeps its files, following the XDG base-directory convention."""

from __future__ import annotations

import os
from pathlib import Path


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "otela"


def default_home() -> Path:
    """A node's home (identity key, logs) unless ``--home``/``OTELA_HOME`` says otherwise."""
    return config_dir() / "node"
