"""Text in: the tokenizer's own rate, the loader's rate on text, and `plitzer tokenize`'s.

Real text: the ``.py``, ``.md``, ``.rst`` and ``.txt`` files of the installed
packages (site-packages, sorted by path), up to ``--mb`` MB, written as text
Parquet (``--files`` files, row groups of ``--docs-per-row-group`` documents).

Reported, all on every core of this machine:

1. the tokenizer's own batch rate: ``tokenizers``' ``encode_batch`` (multi-threaded)
   or SentencePiece's ``encode(..., num_threads=cores)`` over every document;
2. the counting pass (``plitzer.text.source.text_index``, cold cache);
3. the loader on text: one epoch of ``plitzer.Loader(..., tokenizer=...)`` after the
   counting pass, tokens delivered per second (target: at least 0.8x rate 1);
4. ``plitzer tokenize`` (local engine), text Parquet to token Parquet.

    python benchmarks/tokenize_text.py                      # mistral-common's SentencePiece model
    python benchmarks/tokenize_text.py --tokenizer tokenizer.json --mb 50
"""

from __future__ import annotations

# Not named tokenize.py: that is a module of the standard library (linecache, inspect
# and so polars import it), and a script's folder comes first on sys.path, so a
# benchmarks/tokenize_text.py would shadow it for every benchmark here.
import argparse
import importlib.util
import os
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def real_text(mb: float) -> list[str]:
    root = Path(sysconfig.get_paths()["purelib"])
    out, total = [], 0
    for p in sorted(root.rglob("*")):
        if p.suffix not in (".py", ".md", ".rst", ".txt") or not p.is_file():
            continue
        try:
            t = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if not t:
            continue
        out.append(t)
        total += len(t.encode())
        if total >= mb * 1e6:
            break
    return out


def default_tokenizer() -> str:
    spec = importlib.util.find_spec("mistral_common")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pass --tokenizer FILE (or pip install mistral-common for its SentencePiece model)")
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    models = sorted(data.glob("*.model.v7")) or sorted(data.glob("*.model*"))
    return str(models[-1])


def own_rate(path: str, docs: list[str], cores: int) -> tuple[int, float]:
    """Tokens and seconds of the tokenizer's own batch call on every core."""
    from plitzer.text.source import load_tokenizer

    kind = load_tokenizer(path).kind
    if kind == "sentencepiece":
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=path)
        t0 = time.perf_counter()
        ids = sp.encode(docs, num_threads=cores)
    else:
        import tokenizers

        tok = tokenizers.Tokenizer.from_file(path)
        t0 = time.perf_counter()
        ids = [e.ids for e in tok.encode_batch_fast(docs, add_special_tokens=False)]
    dt = time.perf_counter() - t0
    return sum(len(x) for x in ids) + len(docs), dt  # + EOS, as the loader counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--mb", type=float, default=20.0)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--docs-per-row-group", type=int, default=16)
    ap.add_argument("--lanes", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()
    path = args.tokenizer or default_tokenizer()
    cores = os.cpu_count() or 1
    work = Path(tempfile.mkdtemp(prefix="plitzer-tokenize-bench-"))
    os.environ["PLITZER_CACHE"] = str(work / "cache")  # a cold counting pass

    import plitzer
    from plitzer.text.source import text_index
    from plitzer.text.tokenize import tokenize

    docs = real_text(args.mb)
    mb = sum(len(d.encode()) for d in docs) / 1e6
    src = work / "text"
    src.mkdir()
    for f in range(args.files):
        pq.write_table(
            pa.table({"text": docs[f :: args.files]}), src / f"{f:03d}.parquet", row_group_size=args.docs_per_row_group
        )
    print(f"{len(docs):,} documents, {mb:.1f} MB of text (site-packages), {cores} cores, tokenizer {Path(path).name}")

    tokens, dt = own_rate(path, docs, cores)
    own = tokens / dt
    print(f"tokenizer's own batch rate : {own / 1e6:6.3f} M tokens/s ({mb / dt:5.2f} MB/s of text)")

    t0 = time.perf_counter()
    ix = text_index(src, tokenizer=path, progress=False)
    dt = time.perf_counter() - t0
    assert ix.tokens == tokens, (ix.tokens, tokens)
    print(f"counting pass (cold cache) : {ix.tokens / dt / 1e6:6.3f} M tokens/s ({dt:.1f} s)")
    t0 = time.perf_counter()
    text_index(src, tokenizer=path, progress=False)
    print(f"index again (cached)       : {time.perf_counter() - t0:6.3f} s")

    with plitzer.Loader(
        src, tokenizer=path, lanes=args.lanes, seq_len=args.seq_len, window=args.window, seed=0
    ) as loader:
        # Several epochs of several windows each: the reads the loader starts ahead
        # (the next windows) are then a small part of the work timed.
        n = 0
        t0 = time.perf_counter()
        got = 0
        for _ in range(args.epochs):
            for batch in loader:
                got += int(np.from_dlpack(batch.tokens).size)
                n += 1
        dt = time.perf_counter() - t0
    rate = got / dt
    print(
        f"loader on text ({args.epochs} epochs)  : {rate / 1e6:6.3f} M tokens/s ({n} steps, "
        f"{rate / own:.2f}x the tokenizer)"
    )

    r = tokenize(src, work / "tokens", tokenizer=path, progress=False)
    print(f"plitzer tokenize (local)   : {r.tokens / r.seconds / 1e6:6.3f} M tokens/s ({r.seconds:.1f} s)")


if __name__ == "__main__":
    main()
