"""Prompts to token ids exactly as each vision-language model's authors tokenize them, offline.

Three kinds, each the authors' own algorithm:
  - a Hugging Face `tokenizer.json` (CONCH's byte-level BPE, TITAN's copy of it, PLIP's CLIP BPE) run by
    the `tokenizers` library, the engine under transformers' PreTrainedTokenizerFast that the authors
    call, with the same truncation and padding arguments they pass;
  - CLIP's BPE from `vocab.json` + `merges.txt` (a PLIP folder without tokenizer.json), assembled as
    transformers' CLIPConverter assembles it (NFC, whitespace runs to one space, lower case, CLIP's
    split pattern, byte-level symbols, `</w>` word ends, <|startoftext|> ... <|endoftext|>);
  - BioGPT's tokenizer (PRISM): Moses tokenization (sacremoses, aggressive dash splits, XML escapes)
    then word-level BPE with `</w>` word ends, as transformers' BioGptTokenizer does.
Tokenizer files are read from the model folder, a file the user gives, or the Hugging Face cache; never
downloaded. Random-initialised towers (tests, the demo) may use `byte_tokenizer`: one symbol per byte.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from wsi.core.errors import WeightsError
from wsi.core.user_text import load_json_file

log = logging.getLogger("wsi.models.text_encoders")

#: CLIP's pre-tokenizer split (transformers convert_slow_tokenizer.CLIPConverter)
CLIP_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""


@dataclass
class Tokenized:
    """Token ids of a batch of prompts, (P, L) int64, and the pad id they were padded with."""

    ids: torch.Tensor
    pad_id: int


class HfTokenizer:
    """A `tokenizers.Tokenizer` with the authors' call: truncation and padding to `max_length`,
    special tokens from the file's post-processor, `extra_pad` more pad columns (CONCH's <cls> slot)."""

    def __init__(
        self, tokenizer: Any, *, max_length: int, pad_token: str, extra_pad: int = 0, source: str = ""
    ) -> None:
        pad_id = tokenizer.token_to_id(pad_token)
        if pad_id is None:
            raise WeightsError(
                f"tokenizer {source} has no pad token {pad_token!r}; is it this model's tokenizer?"
            )
        self._tok = tokenizer
        self.max_length = max_length
        self.pad_token = pad_token
        self.pad_id = int(pad_id)
        self.extra_pad = extra_pad
        self.source = source
        self.vocab_size = int(tokenizer.get_vocab_size(with_added_tokens=True))

    def __call__(self, prompts: Sequence[str]) -> Tokenized:
        tok = self._tok
        # PreTrainedTokenizerFast(max_length=L, truncation=True, padding="max_length") sets exactly these
        tok.enable_truncation(max_length=self.max_length, strategy="longest_first", stride=0)
        tok.enable_padding(
            length=self.max_length, pad_id=self.pad_id, pad_token=self.pad_token, direction="right"
        )
        encodings = tok.encode_batch(list(prompts), add_special_tokens=True)
        ids = torch.tensor([e.ids for e in encodings], dtype=torch.long)
        if self.extra_pad:
            ids = torch.nn.functional.pad(ids, (0, self.extra_pad), value=self.pad_id)
        return Tokenized(ids, self.pad_id)


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError as exc:  # a core dependency; only a broken install lacks it
        raise WeightsError(
            f"the `tokenizers` package is needed for text prompts ({exc}); pip install tokenizers"
        ) from None
    return tokenizers


def load_tokenizer_json(path: Path) -> Any:
    """A Hugging Face tokenizer.json as a `tokenizers.Tokenizer` (its normalizer, pre-tokenizer, model and
    post-processor as saved)."""
    tokenizers = _tokenizers()
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust parser's error types
        raise WeightsError(f"{path} is not a readable Hugging Face tokenizer.json ({exc})") from None


def clip_tokenizer(
    vocab_json: Path, merges_txt: Path, *, bos: str = "<|startoftext|>", eos: str = "<|endoftext|>"
) -> Any:
    """CLIP's BPE from vocab.json + merges.txt, assembled as transformers' CLIPConverter does."""
    tk = _tokenizers()
    vocab = load_json_file(vocab_json, what="CLIP vocabulary", error=WeightsError)
    if not isinstance(vocab, dict):
        raise WeightsError(f"{vocab_json} is not a token -> id table")
    merges = _read_merges(merges_txt)
    tok = tk.Tokenizer(
        tk.models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="</w>",
            fuse_unk=False,
            unk_token=eos,
        )
    )
    tok.normalizer = tk.normalizers.Sequence(
        [tk.normalizers.NFC(), tk.normalizers.Replace(tk.Regex(r"\s+"), " "), tk.normalizers.Lowercase()]
    )
    tok.pre_tokenizer = tk.pre_tokenizers.Sequence(
        [
            tk.pre_tokenizers.Split(tk.Regex(CLIP_SPLIT), behavior="removed", invert=True),
            tk.pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.decoder = tk.decoders.ByteLevel()
    for special in (bos, eos):
        if special not in vocab:
            raise WeightsError(f"{vocab_json} lacks CLIP's special token {special!r}")
    tok.add_special_tokens([bos, eos])
    tok.post_processor = (
        tk.processors.RobertaProcessing(  # (sep, cls) positionally: the keywords changed across releases
            (eos, int(vocab[eos])), (bos, int(vocab[bos])), trim_offsets=False, add_prefix_space=False
        )
    )
    return tok


def _read_merges(path: Path) -> list[tuple[str, str]]:
    """merges.txt: a '#version' line (optional), then 'a b' per line (BioGPT adds a count: 'a b 123')."""
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise WeightsError(f"cannot read BPE merges {path}: {exc}") from None
    out: list[tuple[str, str]] = []
    for line in lines:
        if not line or line.startswith("#version"):
            continue
        parts = line.split()
        if len(parts) < 2:
            raise WeightsError(f"{path}: {line[:60]!r} is not a BPE merge ('a b')")
        out.append((parts[0], parts[1]))
    return out


def byte_tokenizer(*, specials: Sequence[str], template: tuple[str, str] | None, vocab_size: int) -> Any:
    """One symbol per byte, after the special tokens: for random-initialised towers only (their words mean
    nothing), so that a test or the demo runs without any tokenizer file."""
    tk = _tokenizers()
    symbols = list(tk.pre_tokenizers.ByteLevel.alphabet())
    vocab = {s: i for i, s in enumerate(list(specials) + sorted(symbols))}
    if len(vocab) > vocab_size:
        raise ValueError(f"a byte tokenizer needs {len(vocab)} ids, the tower has {vocab_size}")
    tok = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.add_special_tokens(list(specials))
    if template is not None:
        bos, eos = template
        tok.post_processor = tk.processors.TemplateProcessing(
            single=f"{bos} $A {eos}", special_tokens=[(bos, vocab[bos]), (eos, vocab[eos])]
        )
    return tok


class BioGptTokenizer:
    """transformers' BioGptTokenizer as PRISM calls it (biogpt.py `tokenize`): each prompt + '</s>', the
    '</s>' separator prepended, padded with <pad> to the longest prompt of the batch."""

    def __init__(self, vocab_json: Path, merges_txt: Path) -> None:
        try:
            import sacremoses
        except ImportError as exc:
            raise WeightsError(
                f"PRISM's tokenizer needs sacremoses ({exc}); pip install sacremoses"
            ) from None
        vocab = load_json_file(vocab_json, what="BioGPT vocabulary", error=WeightsError)
        if not isinstance(vocab, dict):
            raise WeightsError(f"{vocab_json} is not a token -> id table")
        self.encoder: dict[str, int] = {str(k): int(v) for k, v in vocab.items()}
        self.ranks = {pair: i for i, pair in enumerate(_read_merges(merges_txt))}
        self.moses = sacremoses.MosesTokenizer(lang="en")
        for special in ("</s>", "<pad>", "<unk>"):
            if special not in self.encoder:
                raise WeightsError(f"{vocab_json} lacks BioGPT's special token {special!r}")
        self.eos_id = self.encoder["</s>"]
        self.pad_id = self.encoder["<pad>"]
        self.unk_id = self.encoder["<unk>"]
        self.vocab_size = max(self.encoder.values()) + 1
        self.source = str(vocab_json.parent)
        self._cache: dict[str, list[str]] = {}

    def bpe(self, token: str) -> list[str]:
        """Word-level BPE: the last symbol carries '</w>'; the lowest-ranked pair is merged first."""
        if token in self._cache:
            return self._cache[token]
        word = [*token[:-1], token[-1] + "</w>"]
        while len(word) > 1:
            pairs = set(itertools.pairwise(word))
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            merged: list[str] = []
            i = 0
            while i < len(word):
                if i < len(word) - 1 and (word[i], word[i + 1]) == best:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        self._cache[token] = word
        return word

    def ids(self, text: str) -> list[int]:
        """A prompt's ids: '</s>' + BPE(Moses(text)) + '</s>' (the appended '</s>' stays one token)."""
        out = [self.eos_id]
        words = self.moses.tokenize(text, aggressive_dash_splits=True, return_str=False, escape=True)
        for word in words:
            if word:
                out.extend(self.encoder.get(piece, self.unk_id) for piece in self.bpe(word))
        return [*out, self.eos_id]

    def __call__(self, prompts: Sequence[str]) -> Tokenized:
        rows = [self.ids(p) for p in prompts]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
        return Tokenized(ids, self.pad_id)


def special_token(folder: Path, key: str, default: str) -> str:
    """A special token's text from the folder's special_tokens_map.json / tokenizer_config.json."""
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        path = folder / name
        if path.is_file():
            data = load_json_file(path, what="tokenizer settings", error=WeightsError)
            value = data.get(key) if isinstance(data, dict) else None
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                return value
    return default


__all__ = [
    "BioGptTokenizer",
    "HfTokenizer",
    "Tokenized",
    "byte_tokenizer",
    "clip_tokenizer",
    "load_tokenizer_json",
    "special_token",
]
