"""Command-line options generated from the settings: one typer option per setting.

``with_setting_options(command)`` gives ``command`` an option for every setting that has
a flag (grouped in ``--help`` by section, with its environment variable and its default
stated from the declaration, so help can never drift from the code) and calls it with
``flags``: the raw values the user actually gave, by attribute, for ``resolve`` to parse
like any other layer (so a bad flag gets the same error, naming the flag).
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any

import typer

from otela.config.schema import SETTINGS, Setting


def _annotation(setting: Setting) -> Any:
    if setting.repeatable:
        return list[str]
    if setting.switch:
        return bool | None
    return str | None


def _option(setting: Setting) -> Any:
    assert setting.flag is not None
    declarations = [setting.flag]
    if setting.switch:
        declarations = [f"{setting.flag}/--no-{setting.flag[2:]}"]
    if setting.short:
        declarations.append(setting.short)
    default = setting.describe_default()
    stated = f" Default: {default}." if default is not None else ""
    return typer.Option(
        [] if setting.repeatable else None,
        *declarations,
        help=f"{setting.help}{stated} Env: {setting.env}.",
        show_default=False,
        metavar=setting.metavar,
        rich_help_panel=f"Settings: {setting.section}",
    )


def _given(value: Any) -> bool:
    return value not in (None, [])


def with_setting_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``command(flags=..., **its own options)`` with an option per setting added."""
    own = inspect.signature(command)
    hints = typing.get_type_hints(command)
    parameters = [p.replace(annotation=hints.get(name, p.annotation))
                  for name, p in own.parameters.items() if name != "flags"]
    flagged = [s for s in SETTINGS if s.flag is not None]
    for setting in flagged:
        parameters.append(inspect.Parameter(setting.attr, inspect.Parameter.KEYWORD_ONLY,
                                            default=_option(setting),
                                            annotation=_annotation(setting)))

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        flags = {s.attr: kwargs.pop(s.attr) for s in flagged if _given(kwargs.get(s.attr))}
        for setting in flagged:
            kwargs.pop(setting.attr, None)
        return command(flags=flags, **kwargs)

    wrapper.__signature__ = own.replace(parameters=parameters)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
    del wrapper.__wrapped__  # typer must see the new signature, not the wrapped one's
    return wrapper
