"""Labels (SPEC section 16): each token's next token in its own source document, against a reference.

The reference is the data itself, read back with pyarrow: every piece a batch lists
(``documents()``: file, row group, row, offset) must hold that document's tokens, and its
labels must be the document's next tokens, -100 at the document's last token; padding is
-100; and over one epoch every token of every kept document but its first is a target
exactly once (collected over every rank of worlds 1 and 2, concat and best-fit, documents
empty and longer than ``seq_len``, several files and row groups, ``where=``). Also: the
checkpoint does not know labels (a resume with and without), seeks, a mixture, deduplication,
a text source, layout stages (live too), aligned columns named ``labels``, and the torch and
Grain adapters.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import plitzer
from planner.errors import ConfigError
from tests.conftest import write_dataset

Key = tuple[str | None, str, int, int]  # source (a mixture's), file, row group, row
Docs = dict[Key, list[int]]

SLOW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def reference(roots: dict[str | None, Path], column: str = "tokens") -> Docs:
    """Every document of the data as its token list, read back with pyarrow (a null list is empty)."""
    out: Docs = {}
    for source, root in roots.items():
        for path in sorted(root.glob("*.parquet")):
            pf = pq.ParquetFile(path)
            for g in range(pf.num_row_groups):
                for r, d in enumerate(pf.read_row_group(g, columns=[column]).column(column).to_pylist()):
                    out[(source, path.name, g, r)] = list(d or [])
    return out


def check_batch(batch: plitzer.Batch, docs: Docs) -> list[tuple[Key, int, int]]:
    """Check one batch's labels against the documents; its targets: (document, offset, epoch) of each."""
    tokens, labels = np.asarray(batch.tokens), np.asarray(batch.labels)
    assert labels.dtype == np.int64 and labels.shape == tokens.shape
    covered = np.zeros(tokens.shape, bool)
    targets = []
    frame = batch.documents()
    sources = frame["source"].to_list() if "source" in frame.columns else [None] * len(frame)
    cols = ["file", "row_group", "row", "batch_row", "start", "length", "token_offset", "epoch"]
    for src, (f, g, r, row, start, n, off, epoch) in zip(sources, frame.select(cols).iter_rows(), strict=True):
        d = docs[(src, f, g, r)]
        assert tokens[row, start : start + n].tolist() == d[off : off + n]
        want = [d[j] if j < len(d) else -100 for j in range(off + 1, off + n + 1)]
        assert labels[row, start : start + n].tolist() == want, (src, f, g, r, off, n)
        covered[row, start : start + n] = True
        targets.extend(((src, f, g, r), j, epoch) for j in range(off + 1, min(off + n + 1, len(d))))
    assert (labels[~covered] == -100).all()  # padding (best-fit's): no target
    np.testing.assert_array_equal(covered, batch.mask)
    return targets


def check_epoch(targets: Iterable[tuple[Key, int, int]], docs: Docs, kept: Iterable[Key] | None = None) -> None:
    """Every token of every kept document but its first is a target exactly once in epoch 0."""
    got = Counter((k, j) for k, j, e in targets if e == 0)
    keys = docs if kept is None else kept
    want = Counter((k, j) for k in keys for j in range(1, len(docs[k])))
    assert got == want


def run_epoch(make: Any, world: int, docs: Docs) -> list[tuple[Key, int, int]]:
    """Every rank's batches up to the end of epoch 0 (and one more step), checked; their targets."""
    targets = []
    for rank in range(world):
        with make(rank=rank, world=world) as loader:
            for _ in range(len(loader) + 1):
                targets += check_batch(loader.next_batch(), docs)
    return targets


docs_st = st.lists(
    st.one_of(st.none(), st.lists(st.integers(0, 999), max_size=3), st.lists(st.integers(0, 999), max_size=30)),
    min_size=1,
    max_size=7,
)
dataset_st = st.lists(st.lists(docs_st, min_size=1, max_size=3), min_size=1, max_size=2)


@given(
    files=dataset_st,
    seed=st.integers(0, 2**32),
    lanes=st.sampled_from([1, 2, 4]),
    window=st.integers(1, 3),
    seq_len=st.integers(2, 12),
    world=st.sampled_from([1, 2]),
    packing=st.sampled_from(["concat", "best-fit"]),
    where=st.sampled_from([None, "n % 3 != 1"]),
)
@SLOW
def test_labels_are_each_documents_next_tokens(
    tmp_path_factory: pytest.TempPathFactory, files, seed, lanes, window, seq_len, world, packing, where
) -> None:
    root = tmp_path_factory.mktemp("labels")
    write_dataset(root, files)
    docs = reference({None: root})
    kept = [k for k in docs if where is None or k[3] % 3 != 1]
    lanes = max(lanes, world)
    kw = {"seed": seed, "lanes": lanes, "window": window, "seq_len": seq_len, "packing": packing, "where": where}
    refused = None
    try:
        plitzer.Loader(root, **kw, labels=True).close()
    except (ConfigError, plitzer.DataError) as e:  # too few tokens (or bins) for the lanes, or none at all
        refused = str(e)
    if refused is not None:
        assert "exceeds" in refused or "no " in refused or "nothing" in refused, refused
        return
    targets = run_epoch(lambda **r: plitzer.Loader(root, **kw, **r, labels=True, budget=1 << 24), world, docs)
    check_epoch(targets, docs, kept)


def test_the_worked_example(tmp_path: Path) -> None:
    write_dataset(tmp_path, [[[[5, 6, 7], [8, 9]]]])
    with plitzer.Loader(tmp_path, lanes=1, window=1, seq_len=2, labels=True) as loader:
        got = [loader.next_batch() for _ in range(3)]
    # Seed 0 packs the window's two documents as [8 9], [5 6 7]; the next epoch packs them again.
    assert [b.tokens[0].tolist() for b in got] == [[8, 9], [5, 6], [7, 8]]
    assert [b.labels[0].tolist() for b in got] == [[9, -100], [6, 7], [-100, 9]]
    assert got[0].labels.dtype == np.int64


def test_long_rows(tmp_path: Path) -> None:
    """Rows of long pieces (the packer's direct gather, not the short rows' transposed one)."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 900, (3, 4, 6))
    write_dataset(tmp_path, [[[rng.integers(0, 50_000, n).tolist() for n in rg] for rg in f] for f in lengths])
    docs = reference({None: tmp_path})
    for packing in ("concat", "best-fit"):
        kw = {"lanes": 4, "window": 2, "seq_len": 512, "packing": packing, "seed": 9}
        check_epoch(run_epoch(lambda kw=kw, **r: plitzer.Loader(tmp_path, **kw, **r, labels=True), 2, docs), docs)


def test_labels_change_no_token_and_no_checkpoint(tmp_path: Path) -> None:
    files = [[[[i * 7 + j for j in range(n)] for i, n in enumerate([5, 0, 13, 2, 30, 1, 9])]] * 3] * 2
    write_dataset(tmp_path, files)
    docs = reference({None: tmp_path})
    for packing in ("concat", "best-fit"):
        kw = {"lanes": 4, "window": 2, "seq_len": 8, "packing": packing, "seed": 5}
        with plitzer.Loader(tmp_path, **kw, labels=True) as a, plitzer.Loader(tmp_path, **kw) as b:
            assert a.config == b.config
            for _ in range(5):
                x, y = a.next_batch(), b.next_batch()
                assert y.labels is None and x.labels is not None
                np.testing.assert_array_equal(np.asarray(x.tokens), np.asarray(y.tokens))
                assert a.checkpoint() == b.checkpoint()  # byte-identical
            with_labels, without = a.checkpoint(), b.checkpoint()
            want = [a.next_batch() for _ in range(6)]
        # A checkpoint taken with labels resumes without and vice versa, at another world size.
        for state, labels in ((with_labels, False), (without, True)):
            for rank in range(2):
                with plitzer.Loader(tmp_path, **kw, labels=labels, world=2, rank=rank) as c:
                    c.resume(state)
                    for w in want:
                        got = c.next_batch()
                        np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(w.tokens)[2 * rank :][:2])
                        if labels:
                            check_batch(got, docs)
                            np.testing.assert_array_equal(np.asarray(got.labels), np.asarray(w.labels)[2 * rank :][:2])
                        else:
                            assert got.labels is None
        # A seek lands on the same labels.
        with plitzer.Loader(tmp_path, **kw, labels=True) as d:
            d.seek(5)
            for w in want:
                np.testing.assert_array_equal(np.asarray(d.next_batch().labels), np.asarray(w.labels))


def test_layout_stages_and_a_live_change(tmp_path: Path) -> None:
    lengths = [3, 17, 0, 8, 25, 4]
    write_dataset(
        tmp_path,
        [[[list(range(100 * g + 10 * i, 100 * g + 10 * i + n)) for i, n in enumerate(lengths)]] for g in range(4)],
    )
    docs = reference({None: tmp_path})
    staged = {"lanes": [(0, 4), (3, 2), (6, 4)], "seq_len": [(0, 8), (3, 16), (6, 4)], "window": 2, "seed": 1}
    check_epoch(run_epoch(lambda **r: plitzer.Loader(tmp_path, **staged, **r, labels=True), 2, docs), docs)
    # Live: a layout stage set during the run (lanes under best-fit; lanes and seq_len under concat).
    for packing, change in (("concat", {"lanes": 2, "seq_len": 12}), ("best-fit", {"lanes": 2})):
        targets = []
        with plitzer.Loader(tmp_path, lanes=4, window=2, seq_len=8, packing=packing, labels=True) as loader:
            for _ in range(2):
                targets += check_batch(loader.next_batch(), docs)
            loader.set_layout(**change)
            for _ in range(len(loader) + 1):
                targets += check_batch(loader.next_batch(), docs)
        check_epoch(targets, docs)


def test_a_mixture_and_deduplication(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    write_dataset(a, [[[list(range(i, i + n)) for i, n in enumerate([4, 9, 1, 20, 6])]] * 3])
    write_dataset(b, [[[[1000 + i] * n for i, n in enumerate([7, 2, 11, 5])]] * 2] * 2)
    docs = reference({"a": a, "b": b})
    mix = {"a": str(a), "b": str(b)}
    seen = set()
    with plitzer.Loader(mix, weights={"a": 1, "b": 1}, lanes=2, window=2, seq_len=8, labels=True) as loader:
        for _ in range(30):
            seen |= {k[0] for k, _, _ in check_batch(loader.next_batch(), docs)}
    assert seen == {"a", "b"}
    # dedupe="tokens": row groups 1 and 2 of "a" repeat row group 0; only the first copy is a document.
    one = {(None, *k[1:]): v for k, v in docs.items() if k[0] == "a"}
    first = [k for k in sorted(one) if k[2] == 0]
    targets = run_epoch(lambda **r: plitzer.Loader(a, dedupe="tokens", lanes=2, seq_len=4, **r, labels=True), 2, one)
    check_epoch(targets, one, first)


def test_a_text_source(tmp_path: Path) -> None:
    from plitzer.text.source import load_tokenizer
    from tests.share_fixtures import utf8_bytes

    texts = ["the first", "", "a longer document than a row", None, "ok"]
    pq.write_table(pa.table({"text": texts * 3}), tmp_path / "t.parquet", row_group_size=5)
    tok = load_tokenizer(utf8_bytes, name="bytes-v1", eos_id=256, bos_id=257, vocab_size=258)
    docs = {k: [*(t or "").encode(), 256] for k, t in _texts(tmp_path).items()}  # a null text is [EOS] too
    targets = run_epoch(
        lambda **r: plitzer.Loader(tmp_path, tokenizer=tok, lanes=2, seq_len=8, **r, labels=True), 1, docs
    )
    check_epoch(targets, docs)


def _texts(root: Path) -> dict[Key, str | None]:
    pf = pq.ParquetFile(root / "t.parquet")
    return {
        (None, "t.parquet", g, r): t
        for g in range(pf.num_row_groups)
        for r, t in enumerate(pf.read_row_group(g).column("text").to_pylist())
    }


def test_a_column_named_labels(tmp_path: Path) -> None:
    rows = [[1, 2, 3], [4, 5, 6, 7], [8]]
    table = pa.table({"tokens": rows * 4, "labels": [[-1] * len(r) for r in rows] * 4})
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=3)
    with plitzer.Loader(tmp_path, lanes=2, seq_len=4, columns=["labels"], labels=True) as loader:
        b = loader.next_batch()
        assert (np.asarray(b.columns["labels"]) == -1).all()  # the data's column, apart from the loader's labels
        assert (np.asarray(b.labels) != -1).all() and b.labels.dtype == np.int64
    pytest.importorskip("grain")
    from plitzer import grain

    with pytest.raises(ConfigError, match=r"'labels'.*leave out labels=True"):
        next(iter(grain.Dataset(tmp_path, lanes=2, seq_len=4, columns=["labels"], labels=True)))
    element = next(iter(grain.Dataset(tmp_path, lanes=2, seq_len=4, columns=["labels"])))
    assert (element["labels"] == -1).all()


def test_torch_and_grain_carry_the_labels(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("grain")
    import plitzer.grain
    import plitzer.torch

    write_dataset(tmp_path, [[[[1] * 7, [2, 3, 4], [3] * 12, []], [[4] * 5, list(range(9)), None]]])
    for packing in ("concat", "best-fit"):
        kw = {"lanes": 2, "window": 2, "seq_len": 8, "packing": packing}
        with plitzer.Loader(tmp_path, **kw, labels=True) as loader:
            want = [loader.next_batch() for _ in range(4)]
        with plitzer.torch.Dataset(tmp_path, **kw, labels=True) as ds:
            for w, got in zip(want, ds, strict=False):
                assert got.labels.dtype == torch.int64 and got.labels.shape == got.tokens.shape
                np.testing.assert_array_equal(got.labels.numpy(), np.asarray(w.labels))
                moved = got.to("cpu")
                assert moved.labels is not None and torch.equal(moved.labels, got.labels)
                if plitzer.torch._can_pin():
                    assert got.pin_memory().labels.is_pinned()
                # What cross_entropy takes: the mean over the real targets, -100 ignored.
                flat, v = got.labels.reshape(-1), 16  # every token id of the data is below 16
                logits = torch.randn(flat.numel(), v, dtype=torch.float64)
                real = flat != -100
                if real.any():
                    ce = torch.nn.functional.cross_entropy(logits, flat, ignore_index=-100)
                    by_hand = -torch.log_softmax(logits, 1)[real.nonzero()[:, 0], flat[real]].mean()
                    assert torch.allclose(ce, by_hand)
        with plitzer.torch.Dataset(tmp_path, **kw) as plain:
            assert next(iter(plain)).labels is None
        elements = list(plitzer.grain.Dataset(tmp_path, **kw, labels=True))[:4]  # epoch 0
        assert len(elements) >= 2
        for w, el in zip(want, elements, strict=False):
            assert el["labels"].dtype == np.int64
            np.testing.assert_array_equal(el["labels"], np.asarray(w.labels))
        assert "labels" not in next(iter(plitzer.grain.Dataset(tmp_path, **kw)))


def test_labels_is_a_bool(tmp_path: Path) -> None:
    write_dataset(tmp_path, [[[[1, 2, 3]]]])
    with pytest.raises(ConfigError, match=r"labels=.*True or False"):
        plitzer.Loader(tmp_path, lanes=1, labels="yes")


def test_a_window_with_nothing_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows a selection left empty take the packer's short path: their labels are the general path's (none)."""
    import plitzer.readpath.scan as scan
    from plitzer.readpath.pack import finish_unit, pack_unit
    from plitzer.readpath.pieces import Pieces

    schema = pa.schema([("tokens", pa.list_(pa.int32())), ("keep", pa.bool_())])
    with pq.ParquetWriter(tmp_path / "a.parquet", schema) as w:
        for g in range(30):
            rows = [list(range(g * 50, g * 50 + n)) for n in (30, 7, 12)]
            w.write_table(pa.table({"tokens": rows, "keep": [g % 10 == 0] * 3}, schema=schema))
    docs = reference({None: tmp_path})
    empty = []
    real = scan.pack_unit

    def seen(chunks: Any, reads: Any, columns: Any = None, **kw: Any) -> Any:
        if not chunks:
            empty.append(reads)
        return real(chunks, reads, columns, **kw)

    monkeypatch.setattr(scan, "pack_unit", seen)
    kw = {"lanes": 4, "seq_len": 16, "window": 2, "seed": 3, "where": "keep"}
    kept = [k for k in docs if k[2] % 10 == 0]
    check_epoch(run_epoch(lambda **r: plitzer.Loader(tmp_path, **kw, **r, labels=True), 2, docs), docs, kept)
    assert empty
    z = np.zeros(0, np.int64)
    for reads in empty:
        nl = len(reads.place.rank_lanes)
        short = pack_unit([], reads, labels=True)
        nothing = Pieces(z, z, z, z, z, z, z)
        general = finish_unit([], nothing, z, np.zeros(nl + 1, np.int64), reads, tiled=True, labels=True)
        a, b = general.labels, short.labels
        assert a is not None and b is not None and a.dtype == b.dtype == np.int64
        assert a.shape == b.shape == (0,)  # no sub-piece, so no last label


def test_the_budget_admits_labels_where_it_admits_tokens(tmp_path: Path) -> None:
    """Labels cost 8 bytes a piece, not a token (they are made from the step's tokens): same budget as tokens alone."""
    from planner.order.epoch import row_group_counts
    from plitzer.loader import budget_floor
    from plitzer.readpath.cost import LABEL_BYTES

    # The trainers' shape on real text (issue 69): 200 M tokens in 46 row groups of about 1,035
    # documents, 128 lanes of 2,048 tokens, window 16. Tokens alone fit 2 GiB, and so do labels.
    tok, rows = np.full(46, 200_000_000 // 46), np.full(46, 47_616 // 46)
    shape = {"lanes": 128, "window": 16, "seq_len": 2048}
    for ahead in (0, 1):  # what a step needs, and two windows in flight
        alone, _ = budget_floor(tok, rows, **shape, ahead=ahead)
        labelled, _ = budget_floor(tok, rows, **shape, ahead=ahead, labels=True)
        assert alone < labelled <= alone * 1.001 and labelled <= 2 << 30
    assert budget_floor(tok, rows, **shape, ahead=1, labels=True)[0] <= plitzer.LoaderSettings().budget
    # A loader checks the same floor: admitted at it, refused a byte below.
    rng = np.random.default_rng(5)
    write_dataset(tmp_path, [[[rng.integers(0, 99, n).tolist() for n in rng.integers(0, 60, 20)] for _ in range(4)]])
    kw = {"lanes": 4, "window": 2, "seq_len": 16}
    t, r, _ = row_group_counts(plitzer.Loader(tmp_path, **kw).index)
    alone, _ = budget_floor(t, r, **kw)
    need, _ = budget_floor(t, r, **kw, labels=True)
    assert alone < need and (need - alone) % LABEL_BYTES == 0  # pieces' labels, no token's
    with pytest.raises(ConfigError, match=f"up to {need:,} bytes"):
        plitzer.Loader(tmp_path, **kw, budget=need - 1, labels=True)
    with pytest.warns(plitzer.PerformanceWarning):  # a step's windows fit, not the next one as well
        ld = plitzer.Loader(tmp_path, **kw, budget=need, labels=True)
    with ld:
        n = sum(int((np.asarray(b.labels) != -100).sum()) for b in ld)
        assert ld.stats.overruns == 0 and n > 0
