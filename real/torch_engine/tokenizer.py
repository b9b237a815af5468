"""The bundled model's tokenizer: a byte-level BPE trained on a corpus generated in code.

Why: SGLang clients (its benchmark client, RL frameworks, OpenAI clients) send and read *text*;
a server without a tokenizer reports empty ``text`` and refuses text prompts. Nothing is ever
downloaded: :func:`corpus` writes deterministic pseudo-English from a seeded generator,
:func:`build_tokenizer` trains a byte-level BPE on it with the ``tokenizers`` library, and
:func:`ensure_tokenizer` saves ``tokenizer.json`` (+ ``tokenizer_config.json`` and
``special_tokens_map.json``, so that ``transformers.AutoTokenizer.from_pretrained(dir)`` loads
it) in a local directory, keyed by vocabulary size, and reuses it afterwards.

Special tokens take the first ids, so they line up with :class:`ModelConfig`'s defaults:
``<|pad|>`` = 0, ``<|bos|>`` = 1, ``<|eos|>`` = 2 (the model's ``eos_token_id``).
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path

SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|eos|>")
EOS_TOKEN = "<|eos|>"
MIN_VOCAB = 256 + len(SPECIAL_TOKENS) + 16  # the byte alphabet, the specials, a few merges
CORPUS_VERSION = 1

_ONSETS = ["", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v",
           "w", "z", "th", "sh", "ch", "st", "tr", "pl", "gr", "br"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "io"]
_CODAS = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng"]
_PUNCT = [".", ".", ".", ",", "?", "!", ";", ":"]


def corpus(n_sentences: int = 4000, seed: int = 0) -> list[str]:
    """Deterministic pseudo-English: a Zipf-ish vocabulary of syllable words, numbers, code."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                     for _ in range(rng.choice((1, 1, 2, 2, 3)))) for _ in range(1500)]
    weights = [1.0 / (i + 1) for i in range(len(words))]
    lines: list[str] = []
    for i in range(n_sentences):
        n = rng.randint(4, 18)
        sent = rng.choices(words, weights, k=n)
        sent[0] = sent[0].capitalize()
        if i % 7 == 0:
            sent.insert(rng.randrange(n), str(rng.randint(0, 10_000)))
        text = " ".join(sent) + rng.choice(_PUNCT)
        if i % 11 == 0:
            text = f"def {sent[1]}(x):\n    return x + {rng.randint(1, 99)}\n"
        lines.append(text)
    return lines


def build_tokenizer(vocab_size: int, seed: int = 0):
    """Train a byte-level BPE of exactly ``vocab_size`` tokens (a ``tokenizers.Tokenizer``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < MIN_VOCAB:
        raise ValueError(f"a byte-level BPE needs vocab_size >= {MIN_VOCAB}, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2,
    )
    tok.train_from_iterator(corpus(seed=seed), trainer=trainer)
    if tok.get_vocab_size() != vocab_size:  # too small a corpus would leave fewer merges
        raise RuntimeError(f"trained {tok.get_vocab_size()} tokens, wanted {vocab_size}")
    return tok


def default_cache_dir() -> Path:
    """Where tokenizers are kept: ``$APRILSIM_TOKENIZER_CACHE`` or ``~/.cache/aprilsim``."""
    env = os.environ.get("APRILSIM_TOKENIZER_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "aprilsim" / "tokenizers"


def ensure_tokenizer(vocab_size: int, directory: str | Path | None = None) -> Path:
    """The directory holding the tokenizer for ``vocab_size``, building it on first use.

    Written atomically (temp dir + rename), so concurrent servers never read half a file.
    """
    base = Path(directory) if directory else default_cache_dir()
    target = base / f"aprilsim-bpe-v{CORPUS_VERSION}-{vocab_size}"
    if (target / "tokenizer.json").exists():
        return target
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=base, prefix=".build-"))
    tok = build_tokenizer(vocab_size)
    tok.save(str(tmp / "tokenizer.json"))
    (tmp / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 30,
        "bos_token": "<|bos|>", "eos_token": EOS_TOKEN, "pad_token": "<|pad|>",
        "clean_up_tokenization_spaces": False,
    }, indent=2))
    (tmp / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<|bos|>", "eos_token": EOS_TOKEN, "pad_token": "<|pad|>"}, indent=2))
    try:
        tmp.rename(target)
    except OSError:  # another process won the race: use its copy
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return target


class TextCodec:
    """Encode/decode through a ``tokenizer.json``; what the server uses for ``text``."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer

        self.path = Path(path)
        self.tok = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        self.vocab_size = self.tok.get_vocab_size()
        self.special_ids = frozenset(self.tok.token_to_id(t) for t in SPECIAL_TOKENS)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """The text of one token as SGLang puts it in logprob tuples."""
        return self.tok.decode([token_id], skip_special_tokens=False)
