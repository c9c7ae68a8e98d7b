"""Model architectures: the shipped catalog and any local Hugging Face `config.json`.

Only the numbers the roofline needs are kept (sizes, heads, experts, windows); parameter
counts are derived from them rather than copied, so a config change propagates everywhere.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

CATALOG = Path(__file__).with_name("catalog") / "models.toml"


@dataclass(frozen=True)
class ModelSpec:
    """Decoder-only transformer architecture (dense or mixture-of-experts)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tie_embeddings: bool = False
    max_context: int = 4096
    experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    shared_expert_intermediate: int = 0
    sliding_window: int = 0
    sliding_layers: int = 0
    attention_bias: bool = False
    default_expert_bits: float = 16.0
    source: str = ""

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    # ---- parameter counts (per full model, unsharded) -------------------------------
    @property
    def attn_params_per_layer(self) -> int:
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        bias = (self.heads + 2 * self.kv_heads) * self.head_dim if self.attention_bias else 0
        return q + kv + o + bias

    @property
    def dense_mlp_params_per_layer(self) -> int:
        return 0 if self.is_moe else 3 * self.hidden * self.intermediate

    @property
    def expert_params(self) -> int:
        """Parameters of ONE routed expert (gated MLP: gate, up, down)."""
        return 3 * self.hidden * self.moe_intermediate

    @property
    def moe_params_per_layer(self) -> int:
        if not self.is_moe:
            return 0
        shared = 3 * self.hidden * self.shared_expert_intermediate
        return self.experts * self.expert_params + shared + self.hidden * self.experts

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tie_embeddings else 2)

    @property
    def total_params(self) -> int:
        per_layer = (
            self.attn_params_per_layer
            + self.dense_mlp_params_per_layer
            + self.moe_params_per_layer
            + 2 * self.hidden
        )
        return self.layers * per_layer + self.embedding_params + self.hidden

    @property
    def active_params(self) -> int:
        """Parameters touched by one token (MoE: only the routed experts)."""
        if not self.is_moe:
            return self.total_params
        inactive = (self.experts - self.experts_per_token) * self.expert_params
        return self.total_params - self.layers * inactive

    def kv_bytes_per_token(self, kv_bits: float = 16) -> float:
        """KV-cache bytes per token over all layers (full-attention layers only grow)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * kv_bits / 8


def _from_mapping(name: str, c: dict[str, Any]) -> ModelSpec:
    hidden = int(c["hidden_size"])
    heads = int(c["num_attention_heads"])
    text = c.get("text_config")
    if text and "hidden_size" not in c:  # multimodal wrappers keep the LM under text_config
        return _from_mapping(name, text)
    experts = int(c.get("num_experts", c.get("num_local_experts", 0)) or 0)
    moe_inter = int(c.get("moe_intermediate_size", 0) or 0)
    if experts and not moe_inter:
        moe_inter = int(c.get("intermediate_size", 0))
    sliding = int(c.get("sliding_window") or 0)
    sliding_layers = int(c.get("sliding_window_layers", 0))
    if sliding and not sliding_layers and "layer_types" in c:
        sliding_layers = sum(1 for t in c["layer_types"] if t == "sliding_attention")
    elif (
        sliding
        and not sliding_layers
        and c.get("use_sliding_window", True)
        and not c.get("max_window_layers")
    ):
        sliding_layers = int(c["num_hidden_layers"])
    return ModelSpec(
        name=name,
        hidden=hidden,
        layers=int(c["num_hidden_layers"]),
        heads=heads,
        kv_heads=int(c.get("num_key_value_heads") or heads),
        head_dim=int(c.get("head_dim") or hidden // heads),
        intermediate=int(c.get("intermediate_size", 4 * hidden)),
        vocab=int(c["vocab_size"]),
        tie_embeddings=bool(c.get("tie_word_embeddings", False)),
        max_context=int(c.get("max_position_embeddings", 4096)),
        experts=experts,
        experts_per_token=int(c.get("num_experts_per_tok", 0) or 0),
        moe_intermediate=moe_inter,
        shared_expert_intermediate=int(c.get("shared_expert_intermediate_size", 0) or 0),
        sliding_window=sliding if sliding_layers else 0,
        sliding_layers=sliding_layers,
        attention_bias=bool(c.get("attention_bias", False)),
        default_expert_bits=float(c.get("default_expert_bits", 16.0)),
        source=str(c.get("source", c.get("_name_or_path", name))),
    )


@cache
def _catalog() -> dict[str, tuple[ModelSpec, tuple[str, ...]]]:
    with CATALOG.open("rb") as fh:
        raw = tomllib.load(fh)["model"]
    return {
        key: (_from_mapping(key, fields), tuple(fields.get("aliases", ())))
        for key, fields in raw.items()
    }


def list_models() -> list[ModelSpec]:
    """All catalog models in file order."""
    return [spec for spec, _ in _catalog().values()]


def load_hf_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """Build a spec from a local Hugging Face `config.json` (file or directory holding it)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    with p.open() as fh:
        data = json.load(fh)
    return _from_mapping(name or data.get("_name_or_path") or p.parent.name, data)


def get_model(name: str) -> ModelSpec:
    """Catalog key, alias or HF id (case-insensitive), or a path to a local config.json."""
    wanted = name.strip().lower()
    for key, (spec, aliases) in _catalog().items():
        if wanted == key or wanted in {a.lower() for a in aliases}:
            return spec
    p = Path(name)
    if p.exists():
        return load_hf_config(p)
    raise KeyError(f"unknown model {name!r}; known: {', '.join(_catalog())} or a config.json path")
