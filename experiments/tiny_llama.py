"""Build a tiny random Llama and a small tokenizer in a folder, for serving with vLLM on CPU.

Nothing comes from a hub: the tokenizer is a byte-level BPE trained here on the repository's own
docs (a few hundred tokens), the model a ``LlamaConfig`` with 2 layers and hidden size 256 and
random weights (seeded). Needs transformers and tokenizers (the vLLM venv has both).

    venv-vllm/bin/python experiments/tiny_llama.py DIR [--vocab 384]   # the vLLM venv
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def corpus() -> list[str]:
    """Lines of the repository's Markdown, the tokenizer's training text."""
    lines = []
    for p in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        lines += [x for x in p.read_text(errors="replace").splitlines() if x.strip()]
    return lines


def build(out: Path, vocab: int = 384, seed: int = 0, max_len: int = 2048) -> dict:
    """Write config, weights and tokenizer to ``out``; returns what was built."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<s>", "</s>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", model_max_length=max_len)
    fast.save_pretrained(out)
    n = len(fast)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=n, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=max_len,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                      torch_dtype="bfloat16")
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    info = {"vocab_size": n, "layers": 2, "hidden": 256, "max_len": max_len, "seed": seed}
    (out / "aprilsim_tiny.json").write_text(json.dumps(info))
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--vocab", type=int, default=384)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(json.dumps(build(args.out, args.vocab, args.seed)))


if __name__ == "__main__":
    main()
