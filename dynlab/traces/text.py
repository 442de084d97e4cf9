"""Text to tokens for traces that carry text (ShareGPT, aiperf): a real tokenizer, or an approximation.

- :class:`FileTokenizer`: a local Hugging Face ``tokenizer.json`` read with the ``tokenizers`` package
  (the ``tokenizers`` extra); no network, no special tokens added, no chat template: the token ids of
  the text as written.
- :class:`ApproxTokenizer` (without ``--tokenizer``): dynlab's own approximation. Text is cut into
  pieces, each with the whitespace before it: a run of ASCII letters is one token per 7 letters
  (``ceil(n / 7)``: one for most English words), a run of digits one per 3 digits, every other
  character (punctuation, CJK, emoji, other scripts) one token, trailing whitespace one. A token's id
  is a hash of its characters. The cut depends only on the text before it, so two texts that share a
  prefix share that prefix's tokens (all but the one piece in which they part), and so their leading
  blocks, as with a real tokenizer.

  How far off the counts are: BPE vocabularies of 32k-128k entries (GPT, Llama) make one token of
  most common English words and about 1.3 tokens per word of prose; the approximation gives one per
  word up to 7 letters, so on English prose it is expected within about ±25 % of a real tokenizer; on
  code, long rare words and non-Latin scripts (where real tokenizers vary most) it can be off by 2x
  either way. It was not measured against a real tokenizer here (none ships with dynlab): give
  ``--tokenizer`` when token counts matter.
"""
from __future__ import annotations

import re
import zlib
from typing import Optional

from dynlab.errors import DynlabError, InputFileError

_PIECES = re.compile(r"\s*(?:[A-Za-z]+|[0-9]+|\S)|\s+")


def _crc(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


class ApproxTokenizer:
    """dynlab's approximation (module docstring): ``encode(text) -> list[int]``."""

    name = "approx"

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        append = out.append
        for m in _PIECES.finditer(text):
            piece = m.group()
            body = piece.lstrip()
            if len(body) <= 1:
                append(_crc(piece))
                continue
            lead = piece[:len(piece) - len(body)]
            step = 3 if body[0].isdigit() else 7
            for s in range(0, len(body), step):
                append(_crc((lead if s == 0 else "") + body[s:s + step]))
        return out


class FileTokenizer:
    """A Hugging Face ``tokenizer.json`` (``tokenizers.Tokenizer.from_file``): ``encode(text) -> list[int]``.

    Raises :class:`~dynlab.errors.InputFileError` when the file is missing or not a tokenizer, and
    :class:`~dynlab.errors.DynlabError` when the ``tokenizers`` package is not installed.
    """

    name = "file"

    def __init__(self, path: str):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise DynlabError("--tokenizer needs the tokenizers package: pip install 'dynlab[tokenizers]'") from None
        import os

        if not os.path.isfile(path):
            raise InputFileError(path, "no such tokenizer file (a tokenizer.json)")
        try:
            self._tok = Tokenizer.from_file(path)
        except Exception as exc:  # tokenizers raises its own Exception subclass for a bad file
            raise InputFileError(path, f"not a tokenizer.json: {str(exc).splitlines()[0][:200]}") from None

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids


def tokenizer_for(path: Optional[str]):
    """:class:`FileTokenizer` of ``path``, or :class:`ApproxTokenizer` for ``None``."""
    return ApproxTokenizer() if path is None else FileTokenizer(path)
