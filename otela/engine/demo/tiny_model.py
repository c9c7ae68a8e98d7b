"""Build a tiny random-weight Llama model with a locally trained tokenizer (no downloads).

It lets a real vLLM (tests, ``otela demo --engine vllm``) start in about a minute on a
CPU: the weights are random, so answers are gibberish, but the engine, tokenizer, chat
template, batching, streaming and OpenAI API are the real ones. Sizes follow what vLLM's
CPU attention kernels accept (head_dim 64). Needs ``torch``, ``transformers`` and
``tokenizers`` (present wherever vLLM is), so run it with vLLM's interpreter:

    .venv-vllm/bin/python -m otela.engine.demo.tiny_model /tmp/tiny-llama

``--lora DIR`` also writes a LoRA adapter for it (PEFT's layout, random weights): what a
test loads into vLLM with runtime LoRA updating on, to show which paths reach vLLM's
adapter administration and which do not.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}</s>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# Enough varied text for a byte-level BPE of a few hundred merges.
CORPUS = [
    "otela federates GPU nodes from Slurm jobs, pods and workstations into one platform.",
    "Every node keeps a replica of the registry and routes OpenAI requests to a peer.",
    "The quick brown fox jumps over the lazy dog while the engine streams tokens.",
    "Hello, world! How are you today? I am a tiny language model with random weights.",
    "Nodes join, serve, drain and leave; the gossip network tells every other node.",
    "Tensor parallel size, dtype, quantization and context length describe a model.",
    "0123456789 + - * / = ( ) [ ] { } < > : ; , . ! ? ' \" @ # $ % ^ & _ ~ |",
]
SPECIAL_TOKENS = ["<s>", "</s>", "<unk>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
VOCAB_SIZE = 512
MAX_POSITIONS = 512
MARKER = "otela-tiny-model.json"


def build(target: Path, seed: int = 0, max_positions: int = MAX_POSITIONS) -> Path:
    """Write the model and tokenizer into ``target`` (skipped if already built there)."""
    marker = target / MARKER
    if marker.exists():
        return target
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    target.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(CORPUS * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=max_positions,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(target)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="bfloat16",
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(target)
    marker.write_text(json.dumps({"seed": seed, "vocab_size": VOCAB_SIZE,
                                  "max_positions": max_positions}))
    return target


LORA_RANK = 8


def build_lora(target: Path, seed: int = 0) -> Path:
    """Write a rank-8 LoRA adapter of the tiny model's attention query and value
    projections into ``target`` (PEFT's file names and tensor names)."""
    import torch
    from safetensors.torch import save_file

    target.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    hidden, kv_out = 128, 64  # 2 heads x 64 for queries, 1 key-value head x 64 for values
    tensors = {}
    for layer in range(2):
        for module, out in (("q_proj", hidden), ("v_proj", kv_out)):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(LORA_RANK, hidden) * 0.01
            tensors[f"{prefix}.lora_B.weight"] = torch.zeros(out, LORA_RANK)
    save_file(tensors, str(target / "adapter_model.safetensors"))
    (target / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": LORA_RANK, "lora_alpha": 16,
        "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
        "target_modules": ["q_proj", "v_proj"], "base_model_name_or_path": "tiny-llama"}))
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", type=Path, help="directory to write the model into")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-positions", type=int, default=MAX_POSITIONS,
                        help="longest context (RoPE: no learned positions to size)")
    parser.add_argument("--lora", type=Path, help="also write a LoRA adapter here")
    args = parser.parse_args()
    print(build(args.target, args.seed, args.max_positions))
    if args.lora is not None:
        print(build_lora(args.lora, args.seed))


if __name__ == "__main__":
    main()
