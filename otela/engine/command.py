"""Understand an engine command line without running it: its kind, and where it listens.

``otela start --process "<command>"`` takes the provider's existing serving command
unchanged. The command is split like a shell would (``shlex``) but never run through a
shell, so quoting works and nothing is interpreted behind the provider's back.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from urllib.parse import urlsplit

# Where each engine listens when its command names no port (the engines' own defaults).
DEFAULT_PORTS = {"vllm": 8000, "sglang": 30000, "llama.cpp": 8080, "echo": 8000}
_WILDCARD_HOSTS = {"0.0.0.0", "::", "[::]", ""}


class EngineCommandError(ValueError):
    """The command cannot be used: empty, unparsable, or no way to find its endpoint."""


@dataclass(frozen=True)
class EngineCommand:
    argv: tuple[str, ...]
    kind: str
    url: str


def engine_kind(argv: list[str]) -> str:
    """A best-effort engine name, recorded in the registry so routing can use it later."""
    joined = " ".join(argv)
    if "otela.engine.demo.echo" in joined:
        return "echo"
    if "sglang" in joined:
        return "sglang"
    if "vllm" in joined:
        return "vllm"
    if "llama-server" in joined or "llama_cpp" in joined:
        return "llama.cpp"
    return "openai-compatible"


def option_value(argv: list[str], names: tuple[str, ...]) -> str | None:
    """The value of the last occurrence of ``--name value`` or ``--name=value``."""
    found = None
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                found = argv[i + 1]
            elif arg.startswith(name + "="):
                found = arg.split("=", 1)[1]
    return found


# The options with which engines cap the requests they run at once.
CONCURRENCY_OPTIONS = ("--max-num-seqs", "--max-running-requests", "--parallel",
                       "--max-concurrency")


def command_concurrency(command: str | None) -> int | None:
    """The requests an engine command runs at once, where it says (vLLM's
    ``--max-num-seqs``, SGLang's ``--max-running-requests``, llama.cpp's ``--parallel``,
    otela's echo engine's ``--max-concurrency``);
    ``None`` when it does not (or cannot be read)."""
    if not command:
        return None
    try:
        value = option_value(shlex.split(command), CONCURRENCY_OPTIONS)
        number = int(value) if value is not None else None
    except ValueError:
        return None
    return number if number is not None and number > 0 else None


def parse_engine_command(command: str, engine_url: str | None = None) -> EngineCommand:
    """Split ``command`` and find the engine's base URL (``engine_url`` wins if given)."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise EngineCommandError(f"cannot parse engine command: {exc}") from exc
    if not argv:
        raise EngineCommandError("engine command is empty")
    kind = engine_kind(argv)
    if engine_url:
        return EngineCommand(tuple(argv), kind, check_engine_url(engine_url))
    port_text = option_value(argv, ("--port",))
    if port_text is None:
        if kind not in DEFAULT_PORTS:
            raise EngineCommandError(
                "cannot tell which port the engine listens on: add --port to its command "
                "or pass --engine-url"
            )
        port = DEFAULT_PORTS[kind]
    else:
        try:
            port = int(port_text)
        except ValueError as exc:
            raise EngineCommandError(f"engine --port is not a number: {port_text!r}") from exc
        if not 0 < port < 65536:
            raise EngineCommandError(f"engine --port out of range: {port}")
    host = option_value(argv, ("--host",)) or "127.0.0.1"
    if host in _WILDCARD_HOSTS:
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return EngineCommand(tuple(argv), kind, f"http://{host}:{port}")


def check_engine_url(url: str) -> str:
    """``url`` without a trailing slash, if it is an http(s) URL with a host."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise EngineCommandError(f"bad engine URL {url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EngineCommandError(f"bad engine URL {url!r}: expected http://HOST:PORT")
    if parts.path not in ("", "/") and parts.path.rstrip("/").endswith("/v1"):
        raise EngineCommandError(f"bad engine URL {url!r}: give the server's base URL, without /v1")
    del port
    return url.rstrip("/")


def attached_engine(engine_url: str) -> EngineCommand:
    """An engine otela does not launch (``--engine-url`` without ``--process``)."""
    return EngineCommand((), "openai-compatible", check_engine_url(engine_url))
