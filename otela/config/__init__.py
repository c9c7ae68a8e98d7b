"""A node's settings: declared once (``schema``), resolved from four layers (``layers``),
offered as command-line options (``options``) and rendered for people (``render``).

Offers ``NodeConfig`` (the resolved settings a node runs with), ``resolve`` and
``ConfigError``, the ``SETTINGS`` table derived from ``NodeConfig``'s declarations, and
the renderers behind ``otela init``, ``otela config show`` and docs/config.md.
"""

from otela.config.layers import ConfigError, Resolved, default_config_file, resolve
from otela.config.render import render_template, settings_markdown, show_rows
from otela.config.schema import (
    DEFAULT_FATAL_PATTERNS,
    DEFAULT_HTTP_PORT,
    DEFAULT_P2P_PORT,
    SETTINGS,
    SETTINGS_BY_ATTR,
    NodeConfig,
    Setting,
    default_of,
)
from otela.config.values import render_value, split_addresses

__all__ = [
    "DEFAULT_FATAL_PATTERNS",
    "DEFAULT_HTTP_PORT",
    "DEFAULT_P2P_PORT",
    "SETTINGS",
    "SETTINGS_BY_ATTR",
    "ConfigError",
    "NodeConfig",
    "Resolved",
    "Setting",
    "default_config_file",
    "default_of",
    "render_template",
    "render_value",
    "resolve",
    "settings_markdown",
    "show_rows",
    "split_addresses",
]
