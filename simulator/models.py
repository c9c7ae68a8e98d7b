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
    mlp_gated: bool = True  # SwiGLU-style gate+up+down; False: GELU/ReLU up+down (OPT, GPT-J)
    dense_layers: int = 0  # MoE models: leading layers with a dense MLP (DeepSeek first_k_dense)
    q_lora_rank: int = 0  # MLA (DeepSeek-V2/V3): low-rank query (0 = full-rank q_proj)
    kv_lora_rank: int = 0  # MLA latent KV width; > 0 makes attention multi-head latent
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices per MLP (3 for gated SwiGLU, 2 for GELU/ReLU up+down)."""
        return 3 if self.mlp_gated else 2

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    def kv_elems_per_token_layer(self, tp: int = 1) -> float:
        """KV-cache elements one GPU of a TP group stores per token and full-attention layer.

        Standard attention shards KV heads (replicated when TP exceeds them); MLA caches one
        latent vector plus the RoPE key per token, which every TP rank keeps whole (vLLM).
        """
        if self.is_mla:
            return float(self.kv_lora_rank + self.qk_rope_head_dim)
        return 2.0 * -(-self.kv_heads // tp) * self.head_dim

    # ---- parameter counts (per full model, unsharded) -------------------------------
    @property
    def attn_params_per_layer(self) -> int:
        if self.is_mla:
            h, qk = self.heads, self.qk_head_dim
            q = (
                self.hidden * self.q_lora_rank + self.q_lora_rank * h * qk
                if self.q_lora_rank
                else self.hidden * h * qk
            )
            kv_a = self.hidden * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_b = self.kv_lora_rank * h * (self.qk_nope_head_dim + self.v_head_dim)
            o = h * self.v_head_dim * self.hidden
            norms = self.kv_lora_rank + self.q_lora_rank
            return q + kv_a + kv_b + o + norms
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        bias = (self.heads + 2 * self.kv_heads) * self.head_dim if self.attention_bias else 0
        return q + kv + o + bias

    @property
    def dense_mlp_params_per_layer(self) -> int:
        """Parameters of one dense MLP (in a MoE model: of one of its `dense_layers`)."""
        return self.mlp_matrices * self.hidden * self.intermediate

    @property
    def expert_params(self) -> int:
        """Parameters of ONE routed expert (gated MLP: gate, up, down)."""
        return self.mlp_matrices * self.hidden * self.moe_intermediate

    @property
    def moe_params_per_layer(self) -> int:
        """Parameters of one MoE block: routed experts, shared expert(s) and the router."""
        if not self.is_moe:
            return 0
        shared = self.mlp_matrices * self.hidden * self.shared_expert_intermediate
        return self.experts * self.expert_params + shared + self.hidden * self.experts

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tie_embeddings else 2)

    @property
    def total_params(self) -> int:
        dense = self.layers - self.moe_layers
        return (
            self.layers * (self.attn_params_per_layer + 2 * self.hidden)
            + dense * self.dense_mlp_params_per_layer
            + self.moe_layers * self.moe_params_per_layer
            + self.embedding_params
            + self.hidden
        )

    @property
    def active_params(self) -> int:
        """Parameters touched by one token (MoE: only the routed experts)."""
        if not self.is_moe:
            return self.total_params
        inactive = (self.experts - self.experts_per_token) * self.expert_params
        return self.total_params - self.moe_layers * inactive

    def kv_bytes_per_token(self, kv_bits: float = 16) -> float:
        """KV-cache bytes per token over all layers (unsharded)."""
        return self.layers * self.kv_elems_per_token_layer(1) * kv_bits / 8


# Architectures whose MLP is up-projection + activation + down-projection (no gate).
NON_GATED_TYPES = {"opt", "gptj", "gpt_neox", "falcon", "gpt2", "bloom", "gpt_bigcode", "phi"}


def _first(c: dict[str, Any], *keys: str, default: Any = None) -> Any:
    """The first key present with a non-null value: configs name the same thing differently
    (Llama `hidden_size`, GPT-J `n_embd`, OPT `ffn_dim`, Falcon `num_kv_heads`)."""
    for k in keys:
        if c.get(k) is not None:
            return c[k]
    return default


def _from_mapping(name: str, c: dict[str, Any]) -> ModelSpec:
    text = c.get("text_config")
    if text and "hidden_size" not in c:  # multimodal wrappers keep the LM under text_config
        return _from_mapping(name, text)
    hidden = int(_first(c, "hidden_size", "n_embd", "d_model"))
    heads = int(_first(c, "num_attention_heads", "n_head"))
    layers = int(_first(c, "num_hidden_layers", "n_layer", "num_layers"))
    model_type = str(c.get("model_type", "")).lower()
    if c.get("multi_query") and not c.get("new_decoder_architecture"):
        kv_heads = 1  # Falcon-7B: multi-query attention
    else:
        kv_heads = int(_first(c, "num_key_value_heads", "num_kv_heads", default=heads))
    gated = bool(c.get("mlp_gated", model_type not in NON_GATED_TYPES))
    intermediate = int(
        _first(c, "intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size", default=4 * hidden)
    )
    experts = int(_first(c, "num_experts", "num_local_experts", "n_routed_experts", default=0))
    moe_inter = int(c.get("moe_intermediate_size", 0) or 0)
    if experts and not moe_inter:
        moe_inter = intermediate
    shared = int(c.get("shared_expert_intermediate_size", 0) or 0)
    if experts and not shared and c.get("n_shared_experts"):
        shared = int(c["n_shared_experts"]) * moe_inter  # DeepSeek: n shared experts, fused
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
        sliding_layers = layers
    kv_lora = int(c.get("kv_lora_rank") or 0)
    return ModelSpec(
        name=name,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=int(c.get("head_dim") or hidden // heads),
        intermediate=intermediate,
        vocab=int(c["vocab_size"]),
        tie_embeddings=bool(
            c.get("tie_word_embeddings", model_type in {"opt", "falcon", "gpt2", "bloom"})
        ),
        max_context=int(
            _first(c, "max_position_embeddings", "n_positions", "max_seq_len", default=4096)
        ),
        experts=experts,
        experts_per_token=int(c.get("num_experts_per_tok", 0) or 0),
        moe_intermediate=moe_inter,
        shared_expert_intermediate=shared,
        sliding_window=sliding if sliding_layers else 0,
        sliding_layers=sliding_layers,
        attention_bias=bool(c.get("attention_bias", False)),
        default_expert_bits=float(c.get("default_expert_bits", 16.0)),
        source=str(c.get("source", c.get("_name_or_path", name))),
        mlp_gated=gated,
        dense_layers=int(c.get("first_k_dense_replace", 0) or 0) if experts else 0,
        q_lora_rank=int(c.get("q_lora_rank") or 0) if kv_lora else 0,
        kv_lora_rank=kv_lora,
        qk_nope_head_dim=int(c.get("qk_nope_head_dim") or 0) if kv_lora else 0,
        qk_rope_head_dim=int(c.get("qk_rope_head_dim") or 0) if kv_lora else 0,
        v_head_dim=int(c.get("v_head_dim") or 0) if kv_lora else 0,
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
