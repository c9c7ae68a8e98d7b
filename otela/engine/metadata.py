"""What a node says about each model it serves, beyond the id (paper §7.1).

Three sources, later ones winning:

1. the engine's command line (``--dtype``, ``--quantization``, ``--tensor-parallel-size``,
   ``--max-model-len`` and their SGLang/llama.cpp spellings), read without running it;
2. what the running engine reports (``/v1/models``, SGLang's ``/get_server_info``,
   llama.cpp's ``/props``), which knows the truth about e.g. the context length it
   actually allocated;
3. the provider's ``--model-meta key=value`` overrides, for what neither can tell (a
   quantization hidden in the weights, a model family, a licence...).

Everything here is pure except ``probe_engine_details``, which only issues GETs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import httpx

from otela.engine.command import EngineCommand, option_value
from otela.registry.records import MAX_META, MAX_TEXT, ModelInfo

# Flag spellings per field, across vLLM, SGLang and llama.cpp's server.
_DTYPE = ("--dtype",)
_QUANT = ("--quantization", "-q")
_TP = ("--tensor-parallel-size", "-tp", "--tp-size", "--tp")
_CONTEXT = ("--max-model-len", "--context-length", "--ctx-size", "-c")
_GGUF_QUANT = re.compile(r"[.-]((?:I?Q\d[A-Z0-9_]*)|F16|BF16|F32)(?:[.-]|$)", re.IGNORECASE)
_UNINFORMATIVE = {"auto", "none", ""}
TYPED_KEYS = ("max_context", "dtype", "quantization", "tensor_parallel")


@dataclass(frozen=True)
class CommandMetadata:
    """Model facts read from an engine command line (``None``: the command does not say)."""

    dtype: str | None = None
    quantization: str | None = None
    tensor_parallel: int | None = None
    max_context: int | None = None


def _informative(value: str | None) -> str | None:
    return None if value is None or value.lower() in _UNINFORMATIVE else value


def _int_or_none(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def command_metadata(command: EngineCommand) -> CommandMetadata:
    argv = list(command.argv)
    quantization = _informative(option_value(argv, _QUANT))
    if quantization is None and command.kind == "llama.cpp":
        model = option_value(argv, ("--model", "-m")) or ""
        match = _GGUF_QUANT.search(model.rsplit("/", 1)[-1])
        quantization = match.group(1).upper() if match else None
    return CommandMetadata(
        dtype=_informative(option_value(argv, _DTYPE)),
        quantization=quantization,
        tensor_parallel=_int_or_none(option_value(argv, _TP)),
        max_context=_int_or_none(option_value(argv, _CONTEXT)),
    )


def split_overrides(meta: dict[str, str]) -> tuple[dict[str, Any], tuple[tuple[str, str], ...]]:
    """Provider overrides -> (typed ModelInfo fields, free-form pairs); ValueError if bad."""
    fields: dict[str, Any] = {}
    extra: list[tuple[str, str]] = []
    if len(meta) > MAX_META:  # every replica refuses a record with more
        raise ValueError(f"at most {MAX_META} model-meta pairs, got {len(meta)}")
    for key, value in meta.items():
        if len(key) > MAX_TEXT or len(value) > MAX_TEXT:
            raise ValueError(f"model-meta {key[:40]!r}: keys and values are at most "
                             f"{MAX_TEXT} characters")
        if key in ("max_context", "tensor_parallel"):
            try:
                number = int(value)
            except ValueError:
                raise ValueError(f"model-meta {key} must be an integer, got {value!r}") from None
            if number < 1:
                raise ValueError(f"model-meta {key} must be positive, got {number}")
            fields[key] = number
        elif key in TYPED_KEYS:
            fields[key] = value
        else:
            extra.append((key, value))
    return fields, tuple(sorted(extra))


def enrich(
    models: list[ModelInfo],
    from_command: CommandMetadata,
    reported: dict[str, Any],
    overrides: dict[str, str],
) -> list[ModelInfo]:
    """Apply the three sources, in order, to every model the engine listed."""
    typed, extra = split_overrides(overrides)
    out = []
    for model in models:
        fields: dict[str, Any] = {}
        for name in TYPED_KEYS:
            for source in (getattr(from_command, name), reported.get(name)):
                if source is not None:
                    fields[name] = source
        if model.max_context is not None:
            fields["max_context"] = model.max_context
        fields.update(typed)
        merged = dict(model.meta)
        merged.update(extra)
        out.append(replace(model, meta=tuple(sorted(merged.items())), **fields))
    return out


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value.lower() not in _UNINFORMATIVE else None


def parse_sglang_server_info(info: Any) -> dict[str, Any]:
    """Fields of SGLang's ``/get_server_info`` that describe the model."""
    if not isinstance(info, dict):
        return {}
    found = {
        "dtype": _text(info.get("dtype")),
        "quantization": _text(info.get("quantization")),
        "tensor_parallel": _positive_int(info.get("tp_size")),
        "max_context": _positive_int(info.get("context_length")),
    }
    return {k: v for k, v in found.items() if v is not None}


def parse_llamacpp_props(props: Any) -> dict[str, Any]:
    """The context size llama.cpp's server actually runs with, from ``/props``."""
    if not isinstance(props, dict):
        return {}
    settings = props.get("default_generation_settings")
    n_ctx = _positive_int(settings.get("n_ctx")) if isinstance(settings, dict) else None
    return {"max_context": n_ctx} if n_ctx else {}


async def probe_engine_details(client: httpx.AsyncClient, command: EngineCommand) -> dict[str, Any]:
    """Ask engines that can say more than ``/v1/models``; empty if they cannot."""
    endpoints = {
        "sglang": ("/get_server_info", parse_sglang_server_info),
        "llama.cpp": ("/props", parse_llamacpp_props),
    }
    if command.kind not in endpoints:
        return {}
    path, parse = endpoints[command.kind]
    try:
        response = await client.get(f"{command.url}{path}", timeout=5.0)
        return parse(response.json()) if response.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return {}
