r"""The bundled model's tokenizer: a byte-level BPE trained on a corpus generated in code.

Why: SGLang clients (its benchmark client, RL frameworks, OpenAI clients) send and read *text*;
a server without a tokenizer reports empty ``text`` and refuses text prompts. Nothing is ever
downloaded: :func:`corpus` writes deterministic pseudo-English from a seeded generator,
:func:`build_tokenizer` trains a byte-level BPE on it with the ``tokenizers`` library, and
:func:`ensure_tokenizer` saves ``tokenizer.json`` (+ ``tokenizer_config.json`` and
``special_tokens_map.json``, so that ``transformers.AutoTokenizer.from_pretrained(dir)`` loads
it) in a local directory, keyed by vocabulary size, and reuses it afterwards.

Special tokens take the first ids, so they line up with :class:`ModelConfig`'s defaults:
``<|pad|>`` = 0, ``<|bos|>`` = 1, ``<|eos|>`` = 2 (the model's ``eos_token_id``).

Round trip: a random-weight model emitting any token writes text that re-encodes to a different
number of tokens (byte pieces of a UTF-8 character, pieces BPE merges across token boundaries),
so SGLang's ``bench_serving`` counted ~25 % more "retokenized" tokens than were generated.
:func:`roundtrip_token_ids` picks the tokens the server lets the model sample
(:meth:`real.torch_engine.engine.BatchEngine.restrict_output`): each decodes to one space
followed by ASCII letters only or digits only (" the", " 42") and encodes back to itself alone.
The GPT-2 split pattern of the ``ByteLevel`` pre-tokenizer (``'s|'t|'re|'ve|'m|'ll|'d|
?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+``) starts a new piece at every space
followed by a letter or digit and ends ``" ?\p{L}+"``/``" ?\p{N}+"`` at the next space, so the
text of any sequence of such tokens pre-tokenizes into exactly their texts, BPE never merges
across them, and ``encode(decode(ids)) == ids``.
"""

from __future__ import annotations

import functools
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


def _whole_word(text: str) -> bool:
    """One space, then one run of ASCII letters or of ASCII digits (a whole pre-token)."""
    word = text[1:]
    return (text[:1] == " " and bool(word) and word.isascii()
            and (word.isalpha() or word.isdigit()))


def roundtrip_token_ids(tok) -> list[int]:
    """Ids of ``tok`` (a ``tokenizers.Tokenizer``) whose every sequence round-trips.

    A token qualifies when its text is one whole word after a space (:func:`_whole_word`), the
    pre-tokenizer keeps that text in one piece, and encoding the text gives back the token alone.
    Special tokens never qualify (EOS is the engine's to add). The result is checked once more on
    the text of all of them concatenated; an empty list means this tokenizer has no such set
    (another pre-tokenizer than the bundled one's), and the caller should not restrict.
    """
    special = {tok.token_to_id(t) for t in SPECIAL_TOKENS}
    pre = tok.pre_tokenizer
    ids: list[int] = []
    texts: list[str] = []
    for tid in range(tok.get_vocab_size()):
        if tid in special:
            continue
        text = tok.decode([tid], skip_special_tokens=False)
        if not _whole_word(text):
            continue
        if pre is not None and len(pre.pre_tokenize_str(text)) != 1:
            continue
        if tok.encode(text, add_special_tokens=False).ids == [tid]:
            ids.append(tid)
            texts.append(text)
    if ids and tok.encode("".join(texts), add_special_tokens=False).ids != ids:
        return []  # the splitting argument does not hold for this tokenizer
    return ids


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

    @functools.cached_property
    def roundtrip_ids(self) -> tuple[int, ...]:
        """:func:`roundtrip_token_ids` of this tokenizer, computed once."""
        return tuple(roundtrip_token_ids(self.tok))

    def token_text(self, token_id: int) -> str:
        """The text of one token as SGLang puts it in logprob tuples."""
        return self.tok.decode([token_id], skip_special_tokens=False)
