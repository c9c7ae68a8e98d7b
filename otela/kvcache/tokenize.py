"""A request's prompt as the engine's token ids, at the ingress, so its blocks can be
hashed (``otela.kvcache.hashing``) before any node sees it.

A model's tokenizer comes from a directory holding the Hugging Face files the engine
itself loads (``tokenizer.json``, ``tokenizer_config.json``, and the chat template in
``chat_template.jinja`` or the config): the ingress is told where
(``[routing] tokenizers``, ``--tokenizer MODEL=DIR``); nothing is downloaded. Text goes
through the ``tokenizers`` library (the Rust one ``transformers``' fast tokenizers wrap)
and a chat's messages through the model's own Jinja chat template, rendered as
``transformers`` renders it (a sandboxed environment, ``trim_blocks``/``lstrip_blocks``,
``tojson``, ``raise_exception``), so the ids are vLLM's: a completion's prompt is encoded
with the tokenizer's special tokens, a rendered chat without (its template writes them),
as vLLM's OpenAI server does. tests/integration/test_cache_routing.py checks the ids
against the engine's ``/tokenize``.

What it cannot reproduce it says so (``None``): images and other non-text parts, tools
(the template's rendering of them is engine-specific), a template that fails. The
request then routes without cache information (``cache_aware`` falls back).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("otela.kvcache")

MAX_PROMPT_CHARS = 1 << 20  # longer prompts route without cache information


class TokenizerError(ValueError):
    pass


class ModelTokenizer:
    def __init__(self, directory: Path) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:  # the optional extra is missing
            raise TokenizerError("cache-aware routing needs the 'tokenizers' package "
                                 "(pip install 'otela[cache]')") from exc
        directory = Path(directory)
        try:
            self._tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception as exc:  # the library's errors are bare Exceptions
            raise TokenizerError(f"{directory}: no usable tokenizer.json ({exc})") from None
        config: dict[str, Any] = {}
        config_file = directory / "tokenizer_config.json"
        if config_file.exists():
            try:
                config = json.loads(config_file.read_text())
            except (OSError, ValueError) as exc:
                raise TokenizerError(f"{config_file}: {exc}") from None
        template = config.get("chat_template")
        template_file = directory / "chat_template.jinja"
        if template_file.exists():
            template = template_file.read_text()
        if isinstance(template, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        self.special = {name: _token_text(config.get(name))
                        for name in ("bos_token", "eos_token", "unk_token", "pad_token")}
        self._template = _compile(template) if isinstance(template, str) else None
        self.directory = directory

    def prompt_ids(self, body: Mapping[str, Any]) -> list[int] | None:
        """The token ids the engine will see for this request, or ``None``."""
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            if len(prompt) > MAX_PROMPT_CHARS:
                return None
            return list(self._tokenizer.encode(prompt, add_special_tokens=True).ids)
        if isinstance(prompt, list) and prompt and all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        messages = body.get("messages")
        if isinstance(messages, list) and self._template is not None:
            text = self.render(messages, body.get("add_generation_prompt", True) is not False)
            if text is None or len(text) > MAX_PROMPT_CHARS:
                return None
            return list(self._tokenizer.encode(text, add_special_tokens=False).ids)
        return None

    def render(self, messages: Sequence[Any], add_generation_prompt: bool) -> str | None:
        plain = []
        for message in messages:
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                return None
            content = _text_content(message.get("content"))
            if content is None or message.get("tool_calls"):
                return None
            plain.append({**message, "content": content})
        assert self._template is not None
        try:
            return str(self._template.render(messages=plain,
                                             add_generation_prompt=add_generation_prompt,
                                             **self.special))
        except Exception as exc:  # a template's own raise_exception, or its bug
            log.debug("chat template failed: %s", exc)
            return None


def _text_content(content: Any) -> str | None:
    """A message's content as the string a string-format template sees (vLLM joins the
    text parts with newlines); ``None`` for non-text parts."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or \
                    not isinstance(part.get("text"), str):
                return None
            texts.append(part["text"])
        return "\n".join(texts)
    return None


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # AddedToken as saved by older transformers
        value = value.get("content")
    return value if isinstance(value, str) else None


def _compile(source: str) -> Any:
    try:
        from jinja2 import TemplateError
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as exc:
        raise TokenizerError("chat templates need the 'jinja2' package "
                             "(pip install 'otela[cache]')") from exc

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(value: Any, indent: int | None = None) -> str:
        return json.dumps(value, indent=indent, ensure_ascii=False)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(source)
    except TemplateError as exc:
        raise TokenizerError(f"the chat template does not compile: {exc}") from None


class Tokenizers:
    """The ingress's tokenizers by model name, loaded once on first use."""

    def __init__(self, directories: Mapping[str, Path]) -> None:
        self.directories = dict(directories)
        self._loaded: dict[str, ModelTokenizer | None] = {}

    def preload(self) -> None:
        """Load every configured tokenizer now (tens of milliseconds each), at start-up
        rather than in the first request's path; ``TokenizerError`` (a ``ValueError``:
        the node does not start) for one that cannot be loaded."""
        for model, directory in self.directories.items():
            if model not in self._loaded:
                try:
                    self._loaded[model] = ModelTokenizer(directory)
                except TokenizerError as exc:
                    raise TokenizerError(f"the tokenizer for {model!r}: {exc}") from None

    def for_model(self, model: str) -> ModelTokenizer | None:
        if model in self._loaded:
            return self._loaded[model]
        directory = self.directories.get(model)
        tokenizer = None
        if directory is not None:
            try:
                tokenizer = ModelTokenizer(directory)
            except TokenizerError as exc:
                log.warning("no tokenizer for %s: %s (it routes without cache "
                            "information)", model, exc)
        self._loaded[model] = tokenizer
        return tokenizer
