"""Synthetic but well-formed tokenizer vocabularies of a real model's size.

Tokens form a trie: every multi-character token is an earlier token plus one character, so each
one has a genuine BPE merge (``"<parent> <char>"``) and all strings are unique.  Byte-level BPE
vocabularies start with GPT-2's 256 byte characters (llama.cpp tokenizes ``"\\n"`` at load time);
SentencePiece vocabularies carry ``<0xXX>`` byte tokens and scores.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from offload_planner.core.synth.spec import TokenizerKind, TokenizerSpec

TOKEN_NORMAL = 1
TOKEN_CONTROL = 3
TOKEN_BYTE = 6

_FANOUT = 4  # children per trie node: gives token lengths of ~5 characters at 128k tokens
_SPM_ALPHABET = "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?'\"-()"


@dataclass(frozen=True, slots=True)
class Vocab:
    tokens: list[str]
    types: list[int]
    merges: list[str]  # empty for SentencePiece
    scores: list[float]  # empty for byte-level BPE
    bos_id: int
    eos_id: int
    pad_id: int
    unk_id: int | None


def gpt2_byte_chars() -> list[str]:
    """GPT-2's ``bytes_to_unicode`` characters, in the order they open a BPE vocabulary."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = [chr(b) for b in printable]
    extra = 0
    for b in range(256):
        if b not in printable:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def _trie(base: list[str], count: int) -> tuple[list[str], list[str]]:
    """``count`` unique tokens (base first) and the merge of every token after the base."""
    tokens = list(base[:count])
    merges: list[str] = []
    nb = len(base)
    k = len(tokens)
    while k < count:
        j = k - nb
        parent = j // _FANOUT
        char = base[((j % _FANOUT) * 97 + parent) % nb]
        tokens.append(tokens[parent] + char)
        merges.append(f"{tokens[parent]} {char}")
        k += 1
    return tokens, merges


def _extra_merges(tokens: list[str], first: int, n: int, taken: set[str]) -> list[str]:
    """``n`` more merge rules between multi-character tokens (tiktoken-derived vocabularies
    list more merges than tokens)."""
    out: list[str] = []
    m = len(tokens) - first
    i = 0
    while len(out) < n and m > 0:
        left = tokens[first + i % m]
        right = tokens[first + (i * 7919 + i // m) % m]
        rule = f"{left} {right}"
        if rule not in taken:
            taken.add(rule)
            out.append(rule)
        i += 1
        if i > 8 * n + 1000:
            raise ValueError("synth: cannot make that many distinct merges for this vocabulary")
    return out


def _bpe(spec: TokenizerSpec) -> Vocab:
    n_normal = spec.n_vocab - spec.n_special
    base = gpt2_byte_chars()
    if n_normal < len(base):
        raise ValueError(f"synth: a byte-level BPE vocabulary needs >= {len(base)} normal tokens")
    tokens, merges = _trie(base, n_normal)
    if spec.n_merges <= len(merges):
        merges = merges[: spec.n_merges]
    else:
        merges += _extra_merges(tokens, len(base), spec.n_merges - len(merges), set(merges))
    named = ["<|begin_of_text|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    specials = named[: spec.n_special]
    specials += [f"<|synth_special_{i}|>" for i in range(len(specials), spec.n_special)]
    types = [TOKEN_NORMAL] * n_normal + [TOKEN_CONTROL] * spec.n_special
    bos = n_normal if spec.n_special else 0
    eos = n_normal + 1 if spec.n_special > 1 else bos
    return Vocab(tokens + specials, types, merges, [], bos, eos, eos, None)


def _spm(spec: TokenizerSpec) -> Vocab:
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    specials += [f"<unused{i}>" for i in range(max(0, spec.n_special - len(specials)))]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    n_pieces = spec.n_vocab - len(specials) - len(byte_tokens)
    if n_pieces < len(_SPM_ALPHABET):
        raise ValueError("synth: SentencePiece vocabulary too small")
    pieces, _ = _trie(list(_SPM_ALPHABET), n_pieces)
    tokens = specials + byte_tokens + pieces
    types = [TOKEN_CONTROL] * len(specials) + [TOKEN_BYTE] * 256 + [TOKEN_NORMAL] * n_pieces
    types[3] = 2  # <unk> is UNKNOWN
    scores = [0.0] * (len(specials) + 256) + [-float(i) for i in range(n_pieces)]
    return Vocab(tokens, types, [], scores, bos_id=2, eos_id=1, pad_id=0, unk_id=3)


@lru_cache(maxsize=4)
def make_vocab(spec: TokenizerSpec) -> Vocab:
    """The vocabulary of ``spec`` (cached: big ones take a second to build)."""
    return _bpe(spec) if spec.kind is TokenizerKind.BPE else _spm(spec)
