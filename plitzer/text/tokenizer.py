"""Tokenizers as plitzer uses them: loading, identity, and the BOS/EOS ids.

:func:`load_tokenizer` takes a SentencePiece model file, a Hugging Face
``tokenizers`` JSON file or ``tokenizers.Tokenizer``, mistral-common's Tekken JSON,
a SentencePiece processor, or a named callable, and gives a :class:`TextTokenizer`:
a batch encoder (list of strings to lists of ids, no special tokens of its own), its
identity (the sha256 of its serialized form and of the BOS and EOS ids) and those
ids. :func:`rebuild` makes the same tokenizer again in another process from
``TextTokenizer.spec``. :mod:`plitzer.text.source` builds the text index on it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.catalog.column import TokenDtype
from planner.errors import ConfigError, one_line

__all__ = ["TextTokenizer", "load_tokenizer", "rebuild"]

_EOS_NAMES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "[EOS]", "<|eos|>")
_BOS_NAMES = ("<s>", "<|begin_of_text|>", "<|startoftext|>", "<bos>", "[BOS]", "<|bos|>")


@dataclass(frozen=True, eq=False)
class TextTokenizer:
    """A tokenizer as plitzer uses it: a batch encoder, its identity and its specials.

    Build one with :func:`load_tokenizer` (the Loader does it for you from any
    accepted ``tokenizer=``); pass one to set ``eos_id``/``bos_id`` by hand.
    """

    kind: str
    identity: str
    encode: Callable[[list[str]], list[list[int]]] = field(repr=False)
    eos_id: int | None = None
    bos_id: int | None = None
    vocab_size: int | None = None
    # How to rebuild it in another process: (kind, serialized bytes) or the callable.
    spec: Any = field(default=None, repr=False)

    @property
    def dtype(self) -> TokenDtype:
        return "uint32" if self.vocab_size is not None and self.vocab_size > 2**31 else "int32"

    def special(self, add_bos: bool, add_eos: bool) -> tuple[int | None, int | None]:
        """(BOS, EOS) ids for this policy; a ConfigError when one is asked for and unknown."""
        for want, got, name in ((add_bos, self.bos_id, "BOS"), (add_eos, self.eos_id, "EOS")):
            if want and got is None:
                msg = (
                    f"add_{name.lower()}=True but the {self.kind} tokenizer has no {name} token that plitzer can "
                    f"find; pass tokenizer=plitzer.text.source.load_tokenizer(..., {name.lower()}_id=ID), or "
                    f"add_{name.lower()}=False"
                )
                raise ConfigError(msg)
        return (self.bos_id if add_bos else None), (self.eos_id if add_eos else None)


def _sha(*parts: bytes | str | int | None) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
        h.update(b"\0")
    return h.hexdigest()


def _of_blob(
    kind: str, blob: bytes, encode: Any, eos: int | None, bos: int | None, vocab_size: int, spec: Any
) -> TextTokenizer:
    """A tokenizer loaded from ``blob`` (its serialized form): its identity is the blob's and the specials'."""
    identity = _sha(kind, blob, eos, bos)
    return TextTokenizer(kind, identity, encode, eos_id=eos, bos_id=bos, vocab_size=vocab_size, spec=spec)


def _tokenizers_tokenizer(tok: Any, blob: bytes, eos_id: int | None, bos_id: int | None) -> TextTokenizer:
    def find(names: tuple[str, ...]) -> int | None:
        for n in names:
            i = tok.token_to_id(n)
            if i is not None:
                return int(i)
        return None

    eos = eos_id if eos_id is not None else find(_EOS_NAMES)
    bos = bos_id if bos_id is not None else find(_BOS_NAMES)
    fast = getattr(tok, "encode_batch_fast", None) or tok.encode_batch

    def encode(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in fast(texts, add_special_tokens=False)]

    vocab = int(tok.get_vocab_size(with_added_tokens=True))
    return _of_blob("tokenizers", blob, encode, eos, bos, vocab, ("tokenizers", blob, eos_id, bos_id))


def _sentencepiece_tokenizer(blob: bytes, eos_id: int | None, bos_id: int | None) -> TextTokenizer:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=blob)
    eos = eos_id if eos_id is not None else (int(sp.eos_id()) if sp.eos_id() >= 0 else None)
    bos = bos_id if bos_id is not None else (int(sp.bos_id()) if sp.bos_id() >= 0 else None)

    def encode(texts: list[str]) -> list[list[int]]:
        # One thread per call: the loader and the counting pass call from a pool of
        # threads already, and SentencePiece releases the GIL while it encodes.
        out: list[list[int]] = sp.encode(texts, num_threads=1)
        return out

    spec = ("sentencepiece", blob, eos_id, bos_id)
    return _of_blob("sentencepiece", blob, encode, eos, bos, int(sp.vocab_size()), spec)


def _tekken_tokenizer(path: str, blob: bytes, eos_id: int | None, bos_id: int | None) -> TextTokenizer:
    try:
        from mistral_common.tokens.tokenizers.tekken import Tekkenizer
    except ImportError as e:
        msg = f"{path} is a Tekken tokenizer (mistral-common's JSON), which needs `pip install mistral-common`"
        raise ConfigError(msg) from e
    tk = Tekkenizer.from_file(path)
    eos = eos_id if eos_id is not None else int(tk.eos_id)
    bos = bos_id if bos_id is not None else int(tk.bos_id)

    def encode(texts: list[str]) -> list[list[int]]:
        return [list(tk.encode(t, bos=False, eos=False)) for t in texts]

    return _of_blob("tekken", blob, encode, eos, bos, int(tk.n_words), ("tekken-file", path, eos_id, bos_id))


def _from_bytes(blob: bytes, where: str, eos_id: int | None, bos_id: int | None) -> TextTokenizer:
    head = blob[:4096].lstrip()
    if head.startswith(b"{"):
        import json

        import tokenizers

        try:
            tok = tokenizers.Tokenizer.from_str(blob.decode())
        except Exception as e:
            try:
                doc = json.loads(blob)
            except ValueError:
                doc = None
            if isinstance(doc, dict) and "config" in doc and "vocab" in doc and "model" not in doc:
                return _tekken_tokenizer(where, blob, eos_id, bos_id)
            msg = f"{where}: not a Hugging Face tokenizers JSON ({one_line(e)})"
            raise ConfigError(msg) from e
        # The identity hashes the JSON as tokenizers writes it (to_str), so that a
        # file and the same tokenizer as an object agree, whatever the file's layout.
        return _tokenizers_tokenizer(tok, tok.to_str().encode(), eos_id, bos_id)
    try:
        return _sentencepiece_tokenizer(blob, eos_id, bos_id)
    except (RuntimeError, OSError) as e:
        msg = (
            f"{where}: neither a SentencePiece model nor a tokenizers JSON ({one_line(e)}); pass a .model file, "
            "a tokenizer.json, a tokenizers.Tokenizer or a callable"
        )
        raise ConfigError(msg) from e


def _from_file(path: str, eos_id: int | None, bos_id: int | None) -> TextTokenizer:
    """The tokenizer in the file at ``path`` (SentencePiece, tokenizers JSON or Tekken)."""
    try:
        blob = Path(path).read_bytes()
    except OSError as e:
        msg = f"tokenizer={path!r}: cannot read it ({one_line(e)}); pass a tokenizer file that exists"
        raise ConfigError(msg) from e
    return _from_bytes(blob, path, eos_id, bos_id)


def _callable_tokenizer(
    tokenizer: Any, eos_id: int | None, bos_id: int | None, name: str | None, vocab_size: int | None
) -> TextTokenizer:
    """A callable as a tokenizer: named by ``name`` (or its ``tokenizer_id``), refused without one."""
    ident = name if name is not None else getattr(tokenizer, "tokenizer_id", None)
    if not isinstance(ident, str) or not ident:
        msg = (
            f"tokenizer={tokenizer!r} is a callable, whose vocabulary plitzer cannot hash: name it, "
            "plitzer.text.source.load_tokenizer(fn, name='my-tokenizer-v1', eos_id=...), or give it a "
            "tokenizer_id attribute; the name goes into checkpoints, so change it with the vocabulary"
        )
        raise ConfigError(msg)
    eos = eos_id if eos_id is not None else getattr(tokenizer, "eos_id", None)
    bos = bos_id if bos_id is not None else getattr(tokenizer, "bos_id", None)
    vocab = vocab_size if vocab_size is not None else getattr(tokenizer, "vocab_size", None)
    return TextTokenizer(
        kind="callable",
        identity=_sha("callable", ident, eos, bos),
        encode=tokenizer,
        eos_id=None if eos is None else int(eos),
        bos_id=None if bos is None else int(bos),
        vocab_size=None if vocab is None else int(vocab),
        spec=("callable", tokenizer, eos, bos, ident, vocab),
    )


def load_tokenizer(
    tokenizer: Any,
    *,
    eos_id: int | None = None,
    bos_id: int | None = None,
    name: str | None = None,
    vocab_size: int | None = None,
) -> TextTokenizer:
    """A :class:`TextTokenizer` from what a user passes as ``tokenizer=``.

    Accepted: a SentencePiece model file, a Hugging Face ``tokenizers`` JSON file,
    a Tekken JSON of mistral-common (with mistral-common installed), a
    ``tokenizers.Tokenizer``, a ``sentencepiece.SentencePieceProcessor``, a
    :class:`TextTokenizer`, or a callable from a list of strings to lists of ids.

    EOS and BOS come from the tokenizer (SentencePiece's ``eos_id()``; for
    ``tokenizers``, the first of ``</s>``, ``<|endoftext|>``, ``<|end_of_text|>``,
    ``<eos>``... that the vocabulary holds) unless ``eos_id``/``bos_id`` say.

    A callable's serialized form is unknown to plitzer, so its identity is the
    ``name`` the user gives (or the callable's ``tokenizer_id`` attribute): a
    version string of its vocabulary, e.g. ``"my-bpe-v3"``. A callable without one
    is refused, rather than named after its ``__qualname__``, which two different
    vocabularies can share. Its EOS/BOS come from ``eos_id``/``bos_id`` (or the
    attributes of those names), its vocabulary size from ``vocab_size``.
    """
    if isinstance(tokenizer, TextTokenizer):
        return tokenizer
    if isinstance(tokenizer, (str, os.PathLike)):
        return _from_file(os.fspath(tokenizer), eos_id, bos_id)
    cls = type(tokenizer)
    if cls.__module__.startswith("tokenizers") and hasattr(tokenizer, "to_str"):
        return _tokenizers_tokenizer(tokenizer, tokenizer.to_str().encode(), eos_id, bos_id)
    if cls.__module__.startswith("sentencepiece") and hasattr(tokenizer, "serialized_model_proto"):
        return _sentencepiece_tokenizer(tokenizer.serialized_model_proto(), eos_id, bos_id)
    if callable(tokenizer):
        return _callable_tokenizer(tokenizer, eos_id, bos_id, name, vocab_size)
    msg = (
        f"tokenizer={tokenizer!r} is not a tokenizer plitzer knows: pass a SentencePiece .model file, a "
        "tokenizers JSON file, a tokenizers.Tokenizer, or a callable from a list of strings to lists of ids"
    )
    raise ConfigError(msg)


def rebuild(spec: Any) -> TextTokenizer:
    """The tokenizer of ``TextTokenizer.spec``, in another process (``plitzer tokenize``)."""
    kind = spec[0]
    if kind == "callable":
        _, fn, eos, bos, ident, vocab = spec
        return load_tokenizer(fn, eos_id=eos, bos_id=bos, name=ident, vocab_size=vocab)
    if kind == "tekken-file":
        _, path, eos, bos = spec
        return load_tokenizer(path, eos_id=eos, bos_id=bos)
    _, blob, eos, bos = spec
    return _from_bytes(blob, kind, eos, bos)
