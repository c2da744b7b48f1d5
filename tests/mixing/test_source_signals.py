"""Per-source signals (SPEC section 20): each token's source, tokens and targets per source, running totals.

The data says its own source: source ``j``'s token ids all lie in ``[1000 j, 1000 j + 1000)``
(``pad_id`` far above them), so every check compares with what the tokens imply, apart from the
loader's bookkeeping: ``source_ids`` is the number (``loader.sources``, the order the sources
were given) of each token's source and -1 exactly where ``mask`` is False; ``source_tokens``
and ``source_targets`` are bincounts of it (over the labels other than -100); ``loader.stats``
totals the batches handed out. At world 1 and 2, under concat and best-fit, with labels,
balanced over a thread group, under ``where=`` and ``dedupe=``, through ``plitzer.torch`` and
``plitzer.grain``, and through a replica's message (what a follower decodes, without the index).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import plitzer
from plitzer.errors import ConfigError, DataError
from plitzer.state import replica
from tests.conftest import write_dataset
from tests.share_fixtures import ThreadGroup, run_ranks

SPAN = 1000
"""Source ``j``'s tokens are ``[SPAN j, SPAN (j + 1))``."""
PAD = 9999
NAMES = ("web", "code", "math")

SLOW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

lengths_st = st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=6), min_size=1, max_size=3)
"""A source's row groups, each its documents' lengths (empty ones too, some longer than a row)."""


def write_source(root: Path, j: int, row_groups: list[list[int]], seed: int = 0) -> Path:
    """A source whose every token is in ``[SPAN j, SPAN (j + 1))``: one file of the given row groups."""
    rng = np.random.default_rng(seed + j)
    docs = [[rng.integers(SPAN * j, SPAN * (j + 1), n).tolist() for n in rg] for rg in row_groups]
    write_dataset(root, [docs])
    return root


def write_sources(root: Path, shapes: dict[str, list[list[int]]]) -> dict[str, str]:
    """The named sources (``NAMES[j]``'s tokens in source ``j``'s range), in the order given."""
    return {n: str(write_source(root / n, NAMES.index(n), shapes[n])) for n in shapes}


def expected_ids(batch: plitzer.Batch, sources: list[str]) -> np.ndarray:
    """Each token's source number, from its value alone (and -1 where the mask says padding)."""
    number = np.array([sources.index(n) if n in sources else -2 for n in NAMES])
    tokens = np.asarray(batch.tokens).astype(np.int64)
    if sources == [""]:  # a path: one source, number 0
        return np.where(batch.mask, 0, -1)
    return np.where(batch.mask, number[np.minimum(tokens // SPAN, len(NAMES) - 1)], -1)


def check(batch: plitzer.Batch, sources: list[str]) -> dict[str, Any]:
    """``batch``'s signals against its tokens, mask and labels; what it adds to the running totals."""
    ids = batch.source_ids
    assert ids.dtype == np.int16 and ids.shape == batch.tokens.shape
    assert batch.sources == tuple(sources)
    np.testing.assert_array_equal(ids, expected_ids(batch, sources))
    assert ((ids == -1) == ~batch.mask).all()
    n = len(sources)
    want = np.bincount(ids[ids >= 0], minlength=n)
    assert batch.source_tokens.dtype == np.int64 and batch.source_tokens.tolist() == want.tolist()
    if batch.labels is None:
        assert batch.source_targets is None
        targets = None
    else:
        real = np.asarray(batch.labels) != -100
        assert (ids[real] >= 0).all()
        targets = np.bincount(ids[real], minlength=n)
        got = batch.source_targets
        assert got is not None and got.dtype == np.int64 and got.tolist() == targets.tolist()
    return {"tokens": want, "targets": targets, "padding": int((~batch.mask).sum())}


def check_totals(loader: Any, seen: list[dict[str, Any]]) -> None:
    """``loader.stats``' per-source fields: the sums of the batches it handed out."""
    s = loader.stats
    n = len(loader.sources)
    assert s.sources == tuple(loader.sources)
    assert list(s.source_tokens) == sum((x["tokens"] for x in seen), np.zeros(n, np.int64)).tolist()
    assert s.padding_tokens == sum(x["padding"] for x in seen)
    if seen and seen[0]["targets"] is not None:
        assert s.source_targets is not None
        assert list(s.source_targets) == sum((x["targets"] for x in seen), np.zeros(n, np.int64)).tolist()
    elif not loader.settings.labels:
        assert s.source_targets is None


@given(
    shapes=st.lists(lengths_st, min_size=1, max_size=3),
    order=st.permutations(range(3)),
    path=st.booleans(),
    seed=st.integers(0, 2**16),
    lanes=st.sampled_from([2, 4]),
    window=st.integers(1, 3),
    seq_len=st.integers(2, 24),
    world=st.sampled_from([1, 2]),
    packing=st.sampled_from(["concat", "best-fit"]),
    labels=st.booleans(),
    finite=st.booleans(),
)
@SLOW
def test_each_tokens_source_is_its_data_source(
    tmp_path_factory: pytest.TempPathFactory,
    shapes,
    order,
    path,
    seed,
    lanes,
    window,
    seq_len,
    world,
    packing,
    labels,
    finite,
) -> None:
    root = tmp_path_factory.mktemp("signals")
    names = [NAMES[j] for j in order if j < len(shapes)]  # the order given: not the names' order
    written = write_sources(root, {n: shapes[NAMES.index(n)] for n in names})
    src: Any = written[names[0]] if path and len(names) == 1 else written
    want_sources = [""] if isinstance(src, str) else names
    kw: dict[str, Any] = {"seed": seed, "lanes": lanes, "window": window, "seq_len": seq_len, "packing": packing}
    kw |= {"pad_id": PAD, "labels": labels, "budget": 1 << 24} | ({"epochs": 1} if finite else {})
    refused = None
    try:
        plitzer.Loader(src, **kw).close()
    except (ConfigError, DataError) as e:  # too few tokens (or bins) for the lanes, or none at all
        refused = str(e)
    if refused is not None:
        assert "exceeds" in refused or "no tokens" in refused or "nothing" in refused, refused
        return
    for rank in range(world):
        with plitzer.Loader(src, **kw, rank=rank, world=world) as loader:
            assert loader.sources == want_sources
            steps = min(len(loader), 6) if finite else 6
            seen = [check(loader.next_batch(), want_sources) for _ in range(steps)]
            check_totals(loader, seen)


def _mixture(tmp_path: Path) -> dict[str, str]:
    rng = np.random.default_rng(3)
    shapes = {n: [rng.integers(0, 90, 12).tolist() for _ in range(4)] for n in ("math", "web", "code")}
    return write_sources(tmp_path, shapes)


def test_balanced_steps_carry_the_sources_with_their_rows(tmp_path: Path) -> None:
    src = _mixture(tmp_path)
    kw: dict[str, Any] = {"seed": 1, "lanes": 8, "window": 2, "seq_len": 64, "labels": True, "pad_id": PAD}
    for packing in ("concat", "best-fit"):
        with plitzer.Loader(src, **kw, packing=packing) as one:
            assert one.sources == ["math", "web", "code"]
            whole = [one.next_batch() for _ in range(5)]
        group = ThreadGroup(2)

        def rank(r: int, packing: str = packing, group: ThreadGroup = group) -> tuple[list[Any], Any]:
            opts = {**kw, "packing": packing, "rank": r, "world": 2, "balance": True, "microbatches": 2}
            with plitzer.Loader.in_group(group.member(r), src, **opts) as ld:
                got = [ld.next_batch() for _ in range(5)]
                return got, ld.stats

        got = run_ranks(2, rank)
        for t in range(5):
            parts = [check(got[r][0][t], ["math", "web", "code"]) for r in range(2)]
            want = check(whole[t], ["math", "web", "code"])
            assert (parts[0]["tokens"] + parts[1]["tokens"]).tolist() == want["tokens"].tolist()
            assert (parts[0]["targets"] + parts[1]["targets"]).tolist() == want["targets"].tolist()
        totals = [np.array(got[r][1].source_tokens) for r in range(2)]
        assert (totals[0] + totals[1]).tolist() == sum(w.source_tokens for w in whole).tolist()


def test_a_lone_source_and_a_mixture_of_one(tmp_path: Path) -> None:
    path = str(write_source(tmp_path / "web", 0, [[5, 9, 0, 30], [7]]))
    for src, names in ((path, [""]), ({"web": path}, ["web"])):
        with plitzer.Loader(src, lanes=2, window=1, seq_len=8, packing="best-fit", pad_id=PAD) as loader:
            assert loader.sources == names and loader.stats.source_tokens == (0,)
            b = loader.next_batch()
            assert set(np.unique(b.source_ids).tolist()) <= {-1, 0}
            seen = [check(b, names)]
            check_totals(loader, seen)
            assert loader.stats.source_targets is None


def test_selections_keep_the_numbering(tmp_path: Path) -> None:
    """``where=`` on some sources and deduplication renumber the documents: the sources follow."""
    src = _mixture(tmp_path)
    more = write_source(tmp_path / "more", 0, [[20, 30, 40]])  # a second folder of web: a list of paths
    sources: dict[str, Any] = {
        "math": {"path": src["math"], "where": "n % 3 != 1"},
        "web": [src["web"], str(more)],
        "code": {"path": src["code"], "where": "n % 2 = 0"},
    }
    for kw in ({}, {"dedupe": "tokens"}):
        with plitzer.Loader(sources, lanes=4, window=2, seq_len=32, labels=True, packing="best-fit", **kw) as ld:
            seen = [check(ld.next_batch(), ["math", "web", "code"]) for _ in range(20)]
            check_totals(ld, seen)


def test_a_replicas_follower_decodes_the_sources_without_the_index(tmp_path: Path) -> None:
    src = _mixture(tmp_path)
    for source, packing in ((src, "best-fit"), (src["web"], "concat")):
        with plitzer.Loader(source, seed=2, lanes=4, window=2, seq_len=32, labels=True, packing=packing) as loader:
            for _ in range(3):
                b = loader.next_batch()
                msg = replica.encode(b, replica.Status.of(loader, b.step + 1), b.state_after())
                got, status, _, _ = replica.decode(msg)
                assert got is not None and status.sources == loader.sources
                np.testing.assert_array_equal(got.source_ids, b.source_ids)
                assert got.source_tokens.tolist() == b.source_tokens.tolist()
                assert got.source_targets is not None and b.source_targets is not None
                assert got.source_targets.tolist() == b.source_targets.tolist()
                check(got, loader.sources if isinstance(source, dict) else [""])


def test_torch_carries_the_sources(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import plitzer.torch

    src = _mixture(tmp_path)
    kw: dict[str, Any] = {"seed": 4, "lanes": 4, "window": 2, "seq_len": 32, "labels": True, "packing": "best-fit"}
    with plitzer.Loader(src, **kw) as loader:
        want = [loader.next_batch() for _ in range(4)]
    with plitzer.torch.Dataset(src, **kw) as ds:
        assert ds.loader.sources == ["math", "web", "code"]
        for i, w in enumerate(want):
            got = ds.next_batch()
            moved = got.to("cpu")  # before source_ids is read: made when read, where the tokens are
            assert moved._source_ids is None
            if i % 2:
                got.source_ids  # noqa: B018  (read first: then `to` carries it)
                assert got.to("cpu")._source_ids is not None
            for b in (got, moved, got.to("cpu")):
                assert b.source_ids.dtype == torch.int16 and b.source_ids.shape == b.tokens.shape
                np.testing.assert_array_equal(b.source_ids.numpy(), w.source_ids)
                assert b.source_tokens.dtype == torch.int64 and b.source_tokens.tolist() == w.source_tokens.tolist()
                assert b.source_targets is not None and b.source_targets.tolist() == w.source_targets.tolist()
            if plitzer.torch._can_pin():
                pinned = got.pin_memory()
                assert pinned.source_ids.is_pinned()
            # A per-source loss: one bincount over source_ids (the README's recipe).
            loss = torch.rand(got.tokens.shape, dtype=torch.float64)
            real = got.labels != -100
            per = torch.bincount(got.source_ids[real].long(), weights=loss[real], minlength=3)
            by_hand = [float(loss[real & (got.source_ids == k)].sum()) for k in range(3)]
            np.testing.assert_allclose(per.numpy(), by_hand)


def test_grain_gives_the_sources_of_a_mixture(tmp_path: Path) -> None:
    pytest.importorskip("grain")
    import plitzer.grain

    src = _mixture(tmp_path)
    for source, labels in ((src, True), (src, False), (src["web"], True)):
        kw: dict[str, Any] = {"seed": 4, "lanes": 4, "window": 2, "seq_len": 32, "labels": labels}
        with plitzer.Loader(source, **kw) as loader:
            want = [loader.next_batch() for _ in range(3)]
        it = iter(plitzer.grain.Dataset(source, **kw))
        for w in want:
            e = next(it)
            keys = {"source_ids", "source_tokens"} | ({"source_targets"} if labels else set())
            if isinstance(source, str):  # a lone source's ids are all 0: no keys (the element is as before)
                assert not keys & set(e)
                continue
            assert keys <= set(e)
            assert e["source_ids"].dtype == np.int16
            np.testing.assert_array_equal(e["source_ids"], w.source_ids)
            assert e["source_tokens"].tolist() == w.source_tokens.tolist()
            if labels:
                assert e["source_targets"].tolist() == w.source_targets.tolist()
        it.close()
