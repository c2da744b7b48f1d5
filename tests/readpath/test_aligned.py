"""Aligned columns (SPEC section 13): per-token values packed with exactly the tokens' cuts.

The column values of every dataset here are a known function of (document, position): a
document's global number ``g`` (files in order, row groups, rows) and the token's position
``j`` in it give ``weight = g * 4096 + j`` (float64, exact) and ``loss_mask = (g + j) % 3 == 0``.
Every packed row is checked against ``batch.documents()``: each piece's values must be the
function at the piece's own document positions, so the check needs no second packer.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import plitzer
from plitzer.state import checkpoint as ckpt
from tests.share_fixtures import char_tokenizer

MASK_MOD = 3


def weight_of(g: int, j: np.ndarray) -> np.ndarray:
    return (g * 4096 + j).astype(np.float64)


def mask_of(g: int, j: np.ndarray) -> np.ndarray:
    return (g + j) % MASK_MOD == 0


def write_aligned(
    root: Path,
    files: list[list[list[int]]],
    *,
    row_group_size: int = 3,
    with_columns: bool = True,
    extra: dict[str, Any] | None = None,
) -> dict[tuple[str, int, int], int]:
    """Write ``files`` (each a list of documents); return (file name, row group, row) -> document number."""
    root.mkdir(parents=True, exist_ok=True)
    ids: dict[tuple[str, int, int], int] = {}
    g = 0
    for f, docs in enumerate(files):
        name = f"part-{f:03d}.parquet"
        cols: dict[str, Any] = {"input_ids": pa.array(docs, pa.list_(pa.int32()))}
        weights, masks = [], []
        for i, d in enumerate(docs):
            j = np.arange(len(d))
            weights.append(weight_of(g + i, j).tolist())
            masks.append(mask_of(g + i, j).tolist())
            ids[(name, i // row_group_size, i % row_group_size)] = g + i
        if with_columns:
            cols["weight"] = pa.array(weights, pa.list_(pa.float64()))
            cols["loss_mask"] = pa.array(masks, pa.list_(pa.bool_()))
        cols.update(extra or {})
        g += len(docs)
        pq.write_table(pa.table(cols), root / name, row_group_size=row_group_size)
    return ids


def check_batch(batch: plitzer.Batch, ids: dict[tuple[str, int, int], int], docs_by_id: dict[int, list[int]]) -> None:
    """Every piece of every row: tokens and columns are the document's at the piece's own positions."""
    tokens = np.asarray(batch.tokens)
    mask, weight = np.asarray(batch.columns["loss_mask"]), np.asarray(batch.columns["weight"])
    assert mask.dtype == np.bool_ and weight.dtype == np.float64
    assert mask.shape == tokens.shape == weight.shape
    for r in batch.documents().iter_rows(named=True):
        g = ids[(os.path.basename(r["file"]), r["row_group"], r["row"])]
        j = np.arange(r["token_offset"], r["token_offset"] + r["length"])
        row, a, b = r["batch_row"], r["start"], r["start"] + r["length"]
        assert tokens[row, a:b].tolist() == [docs_by_id[g][x] for x in j]
        assert (weight[row, a:b] == weight_of(g, j)).all()
        assert (mask[row, a:b] == mask_of(g, j)).all()


def run_ranks(
    path: Path, steps: int, world: int, state: bytes | None = None, **kw: Any
) -> Iterator[list[plitzer.Batch]]:
    ranks = [plitzer.Loader(path, rank=r, world=world, **kw) for r in range(world)]
    try:
        if state is not None:
            for ld in ranks:
                ld.resume(state)
        for _ in range(steps):
            yield [ld.next_batch() for ld in ranks]
    finally:
        for ld in ranks:
            ld.close()


documents = st.lists(st.lists(st.integers(0, 999), min_size=0, max_size=30), min_size=4, max_size=40)


@settings(max_examples=12, deadline=None)
@given(
    files=st.lists(documents, min_size=1, max_size=3),
    world=st.sampled_from([1, 2, 4]),
    other=st.sampled_from([1, 2, 4]),
    window=st.integers(1, 3),
    seq_len=st.sampled_from([3, 8, 17, 150]),
    stage=st.sampled_from([None, (3, 8, 5), (2, 4, 40)]),
    seed=st.integers(0, 3),
    steps=st.integers(2, 8),
    at=st.integers(1, 4),
)
def test_every_column_value_is_at_its_tokens_own_document_position(
    files: list[list[list[int]]],
    world: int,
    other: int,
    window: int,
    seq_len: int,
    stage: tuple[int, int, int] | None,
    seed: int,
    steps: int,
    at: int,
) -> None:
    total = sum(len(d) for docs in files for d in docs)
    if total < 8:
        files = [[*files[0], list(range(8))]]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data"
        ids = write_aligned(path, files)
        flat = [d for docs in files for d in docs]
        docs_by_id = dict(enumerate(flat))
        lanes: Any = 4
        seq: Any = seq_len
        if stage is not None:  # a layout stage: lanes and seq_len change at a step (inside a window or at its edge)
            s, b, n = stage
            lanes, seq = [(0, 4), (s, b)], [(0, seq_len), (s, n)]
        kw = {"seed": seed, "lanes": lanes, "window": window, "seq_len": seq, "budget": 1 << 26}
        cols = ["loss_mask", "weight"]
        plain = list(run_ranks(path, steps, world, **kw))
        aligned = list(run_ranks(path, steps, world, columns=cols, **kw))
        for p_step, a_step in zip(plain, aligned, strict=True):
            for p, a in zip(p_step, a_step, strict=True):
                # Naming columns changes no token; every column value sits at its token's document position.
                assert np.array_equal(np.asarray(p.tokens), np.asarray(a.tokens))
                check_batch(a, ids, docs_by_id)
        # Resume at another world: the checkpoint's positions are those of the run without columns.
        at = min(at, steps)
        ranks = [plitzer.Loader(path, rank=r, world=world, columns=cols, **kw) for r in range(world)]
        bare = [plitzer.Loader(path, rank=r, world=world, **kw) for r in range(world)]
        for _ in range(at):
            for ld in [*ranks, *bare]:
                ld.next_batch()
        state = plitzer.merge([ld.checkpoint() for ld in ranks])
        bare_state = plitzer.merge([ld.checkpoint() for ld in bare])
        assert np.array_equal(ckpt.decode(state).positions, ckpt.decode(bare_state).positions)
        for ld in [*ranks, *bare]:
            ld.close()
        resumed = list(run_ranks(path, steps - at + 1, other, state=state, columns=cols, **kw))
        full = list(run_ranks(path, steps + 1, 1, **kw))
        for i, got in enumerate(resumed):
            want = np.asarray(full[at + i][0].tokens)
            assert np.array_equal(np.concatenate([np.asarray(b.tokens) for b in got]), want)
            for b in got:
                check_batch(b, ids, docs_by_id)


@pytest.fixture(scope="module")
def sft(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[tuple[str, int, int], int], dict[int, list[int]]]:
    rng = np.random.default_rng(3)
    files = [[rng.integers(0, 1000, int(rng.integers(0, 25))).tolist() for _ in range(30)] for _ in range(3)]
    path = tmp_path_factory.mktemp("sft")
    ids = write_aligned(path, files, row_group_size=7)
    return path, ids, dict(enumerate(d for docs in files for d in docs))


def test_bool_columns_export_by_dlpack_and_numpy_writable(sft: tuple[Path, Any, Any]) -> None:
    path, ids, docs = sft
    with plitzer.Loader(path, lanes=4, window=2, seq_len=16, columns=["loss_mask", "weight"]) as ld:
        for b in ld:
            m = b.columns["loss_mask"]
            assert np.from_dlpack(m).dtype == np.bool_
            assert np.from_dlpack(m).shape == b.tokens.shape
            assert m.flags.writeable
            assert pa.array(m).type == pa.list_(pa.bool_(), 16)
            check_batch(b, ids, docs)
            m[0, 0] = not m[0, 0]  # the step owns its memory: writing it is allowed


def test_column_order_is_the_given_one_and_config_records_names(sft: tuple[Path, Any, Any]) -> None:
    path, _, _ = sft
    with plitzer.Loader(path, lanes=4, window=2, seq_len=16, columns=["weight", "loss_mask"]) as ld:
        b = ld.next_batch()
        assert list(b.columns) == ["weight", "loss_mask"]
        assert ld.config["columns"] == [["loss_mask", None], ["weight", None]]
        assert "loss_mask=bool" in repr(b)
    with plitzer.Loader(path, lanes=4, window=2, seq_len=16) as ld:
        assert "columns" not in ld.config
        assert ld.next_batch().columns == {}
        # A run without columns writes no columns field: its bytes are those of a run before the feature.
        state = ld.checkpoint()
        assert b"columns" not in state


def test_resume_under_other_columns_is_refused_naming_both(sft: tuple[Path, Any, Any]) -> None:
    path, _, _ = sft
    with plitzer.Loader(path, lanes=4, window=2, seq_len=16, columns=["loss_mask"]) as ld:
        ld.next_batch()
        state = ld.checkpoint()
    with (
        plitzer.Loader(path, lanes=4, window=2, seq_len=16, columns={"loss_mask": 0, "weight": 0.0}) as other,
        pytest.raises(plitzer.CheckpointError, match=r"columns: checkpoint \[\['loss_mask', None\]\], loader"),
    ):
        other.resume(state)
    with (
        plitzer.Loader(path, lanes=4, window=2, seq_len=16) as bare,
        pytest.raises(plitzer.CheckpointError, match=r"columns: checkpoint \[\['loss_mask', None\]\], loader \[\]"),
    ):
        bare.resume(state)


def test_a_row_whose_length_differs_is_a_data_error_naming_file_row_group_row_and_lengths(tmp_path: Path) -> None:
    docs = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10], [11, 12]]
    masks = [[True] * 3, [True] * 2, [True] * 4, [True, False], [False] * 2]  # row 3 has 2 values for 1 token
    pq.write_table(
        pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32())), "loss_mask": pa.array(masks)}),
        tmp_path / "a.parquet",
        row_group_size=2,
    )
    with (
        plitzer.Loader(tmp_path, lanes=2, window=4, seq_len=3, columns=["loss_mask"]) as ld,
        pytest.raises(
            plitzer.DataError,
            match=r"a\.parquet, row group 1, row 1: column 'loss_mask' holds 2 values but the token list 1 tokens",
        ) as e,
    ):
        for _ in range(10):
            ld.next_batch()
    assert e.value.row_group == 1 and e.value.row == 1


def test_a_null_row_beside_tokens_is_a_data_error(tmp_path: Path) -> None:
    docs = [[1, 2, 3], [4, 5], None, [6]]
    masks = [[1, 1, 1], None, None, [0]]
    pq.write_table(
        pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32())), "labels": pa.array(masks, pa.list_(pa.int8()))}),
        tmp_path / "a.parquet",
    )
    with (
        plitzer.Loader(tmp_path, lanes=2, window=1, seq_len=3, columns=["labels"]) as ld,
        pytest.raises(plitzer.DataError, match=r"row 1: column 'labels' holds null but the token list 2 tokens"),
    ):
        ld.next_batch()


def test_a_null_row_where_the_tokens_are_null_is_an_empty_document(tmp_path: Path) -> None:
    docs = [[1, 2, 3], None, [4, 5, 6, 7, 8]]
    labels = [[7, 8, 9], None, [1, 2, 3, 4, 5]]
    pq.write_table(
        pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32())), "labels": pa.array(labels, pa.list_(pa.int16()))}),
        tmp_path / "a.parquet",
    )
    with plitzer.Loader(tmp_path, lanes=1, window=1, seq_len=8, columns=["labels"]) as ld:
        b = ld.next_batch()
        assert b.columns["labels"].dtype == np.int16
        got = dict(zip(np.asarray(b.tokens)[0].tolist(), np.asarray(b.columns["labels"])[0].tolist(), strict=True))
        assert got == {1: 7, 2: 8, 3: 9, 4: 1, 5: 2, 6: 3, 7: 4, 8: 5}


def test_a_column_that_is_not_a_list_of_numbers_is_a_config_error_listing_candidates(tmp_path: Path) -> None:
    pq.write_table(
        pa.table(
            {
                "input_ids": pa.array([[1, 2], [3]], pa.list_(pa.int32())),
                "score": pa.array([0.5, 0.7]),
                "words": pa.array([["a", "b"], ["c"]]),
                "loss_mask": pa.array([[True, False], [True]]),
            }
        ),
        tmp_path / "a.parquet",
    )
    for bad in ("score", "words"):
        with pytest.raises(
            plitzer.ConfigError, match=rf"column '{bad}' is .*not a list of bool, integer or float.*\['loss_mask'\]"
        ):
            plitzer.Loader(tmp_path, lanes=1, window=1, seq_len=2, columns=[bad])
    with pytest.raises(plitzer.ConfigError, match=r"has no column 'nope' \(its aligned candidates: \['loss_mask'\]\)"):
        plitzer.Loader(tmp_path, lanes=1, window=1, seq_len=2, columns=["nope"])
    with pytest.raises(plitzer.ConfigError, match="is the token column"):
        plitzer.Loader(tmp_path, lanes=1, window=1, seq_len=2, columns=["input_ids"])
    with pytest.raises(plitzer.ConfigError, match="names 'loss_mask' twice"):
        plitzer.Loader(tmp_path, lanes=1, window=1, seq_len=2, columns=["loss_mask", "loss_mask"])
    with pytest.raises(plitzer.ConfigError, match="a fill value is a bool, int or float"):
        plitzer.Loader(tmp_path, lanes=1, window=1, seq_len=2, columns={"loss_mask": "yes"})
    with pytest.raises(plitzer.ConfigError, match="does not fit the column's dtype bool"):
        plitzer.Loader(tmp_path, lanes=1, window=1, seq_len=2, columns={"loss_mask": 2})


@pytest.fixture(scope="module")
def mix(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mix")
    rng = np.random.default_rng(5)
    chat = [[rng.integers(0, 1000, int(rng.integers(1, 20))).tolist() for _ in range(20)] for _ in range(2)]
    write_aligned(root / "chat", chat, row_group_size=5)
    web = [[rng.integers(0, 1000, int(rng.integers(1, 20))).tolist() for _ in range(25)] for _ in range(2)]
    write_aligned(root / "web", web, row_group_size=5, with_columns=False)
    prose = root / "prose"
    prose.mkdir()
    pq.write_table(
        pa.table({"text": ["hello world", "a b c d", "aligned columns"] * 10}), prose / "t.parquet", row_group_size=6
    )
    return {"chat": root / "chat", "web": root / "web", "prose": prose}


def test_a_mixture_source_without_a_listed_column_is_refused_naming_it(mix: dict[str, Path]) -> None:
    sources = {"chat": str(mix["chat"]), "web": str(mix["web"])}
    with pytest.raises(
        plitzer.ConfigError, match=r"source 'web' \(.*\) has no column 'loss_mask'.*columns=\{'loss_mask': 0\}"
    ):
        plitzer.Loader(sources, lanes=4, window=2, seq_len=16, columns=["loss_mask"])


def test_the_fill_in_a_mixture(mix: dict[str, Path]) -> None:
    sources = {"chat": str(mix["chat"]), "web": str(mix["web"])}
    kw: dict[str, Any] = {"lanes": 4, "window": 2, "seq_len": 16}
    with (
        plitzer.Loader(sources, columns={"loss_mask": 0, "weight": -1.5}, **kw) as ld,
        plitzer.Loader(sources, **kw) as bare,
    ):
        seen = set()
        for b in ld:
            assert np.array_equal(np.asarray(b.tokens), np.asarray(bare.next_batch().tokens))
            m, w = np.asarray(b.columns["loss_mask"]), np.asarray(b.columns["weight"])
            assert m.dtype == np.bool_ and w.dtype == np.float64
            for r in b.documents().iter_rows(named=True):
                seen.add(r["source"])
                a, e = r["start"], r["start"] + r["length"]
                if r["source"] == "web":
                    assert not m[r["batch_row"], a:e].any()
                    assert (w[r["batch_row"], a:e] == -1.5).all()
                else:
                    assert (w[r["batch_row"], a:e] >= 0).all()
        assert seen == {"chat", "web"}
        assert ld.config["columns"] == [["loss_mask", 0], ["weight", -1.5]]


def test_text_sources_take_fills_only(mix: dict[str, Path]) -> None:

    tok = char_tokenizer()
    sources = {"chat": str(mix["chat"]), "prose": {"path": str(mix["prose"]), "tokenizer": tok}}
    with pytest.raises(plitzer.ConfigError, match=r"source 'prose'.* is text.*take fills only"):
        plitzer.Loader(sources, lanes=2, window=2, seq_len=8, columns=["loss_mask"])
    with plitzer.Loader(sources, lanes=2, window=2, seq_len=8, columns={"loss_mask": False}) as ld:
        for b in ld:
            m = np.asarray(b.columns["loss_mask"])
            for r in b.documents().iter_rows(named=True):
                if r["source"] == "prose":
                    assert not m[r["batch_row"], r["start"] : r["start"] + r["length"]].any()


def test_the_budget_counts_the_column_bytes(sft: tuple[Path, Any, Any]) -> None:
    from planner.order.epoch import row_group_counts
    from plitzer.loader import budget_floor

    path, _, _ = sft
    ix = plitzer.Loader(path, lanes=4, window=2, seq_len=16).index
    tok, rows, _ = row_group_counts(ix)
    alone, _ = budget_floor(tok, rows, lanes=4, window=2, seq_len=16)
    both, _ = budget_floor(tok, rows, lanes=4, window=2, seq_len=16, column_bytes=9)  # bool 1 + float64 8
    assert (both - alone) % (2 * 9) == 0
    assert both > alone
    with pytest.warns(plitzer.PerformanceWarning):
        plitzer.Loader(path, lanes=4, window=2, seq_len=16, budget=alone).close()  # tokens alone fit
    with pytest.raises(plitzer.ConfigError, match=f"up to {both:,} bytes"):
        plitzer.Loader(path, lanes=4, window=2, seq_len=16, budget=alone, columns=["loss_mask", "weight"])
    with plitzer.Loader(path, lanes=4, window=2, seq_len=16, budget=both * 2, columns=["loss_mask", "weight"]) as ld:
        for _ in ld:
            pass
        assert ld.stats.overruns == 0
        assert ld.stats.peak_bytes <= both * 2


def test_selected_rows_take_their_own_column_values(sft: tuple[Path, Any, Any]) -> None:
    path, ids, docs = sft
    with plitzer.Loader(
        path, lanes=2, window=2, seq_len=8, where="len(weight) > 5", columns=["loss_mask", "weight"]
    ) as ld:
        for b in ld:
            check_batch(b, ids, docs)


def test_torch_carries_the_columns_as_tensors(sft: tuple[Path, Any, Any]) -> None:
    torch = pytest.importorskip("torch")
    import plitzer.torch

    path, _, _ = sft
    with plitzer.torch.Dataset(path, lanes=4, window=2, seq_len=16, columns=["loss_mask", "weight"]) as ds:
        for b in ds:
            m, w = b.columns["loss_mask"], b.columns["weight"]
            assert m.dtype == torch.bool and w.dtype == torch.float64
            assert m.shape == b.tokens.shape == w.shape
            assert torch.equal(m, torch.from_numpy(np.asarray(b.source.columns["loss_mask"])))
            moved = b.to("cpu")
            assert set(moved.columns) == {"loss_mask", "weight"}
            assert torch.equal(moved.columns["weight"], w)
        state = ds.state_dict()
    with plitzer.torch.Dataset(path, lanes=4, window=2, seq_len=16, world=2, rank=1, columns=["loss_mask"]) as other:
        with pytest.raises(plitzer.CheckpointError, match="columns: checkpoint"):
            other.load_state_dict(state)


def test_grain_carries_the_columns_as_element_keys(sft: tuple[Path, Any, Any]) -> None:
    pytest.importorskip("grain")
    import plitzer.grain

    path, _, _ = sft
    ds = plitzer.grain.Dataset(path, lanes=4, window=2, seq_len=16, columns={"loss_mask": 0, "weight": 0.0})
    it = iter(ds)
    with plitzer.Loader(path, lanes=4, window=2, seq_len=16, columns=["loss_mask", "weight"]) as ld:
        for _ in range(5):
            e = next(it)
            b = ld.next_batch()
            assert e["loss_mask"].dtype == np.bool_ and e["weight"].dtype == np.float64
            assert np.array_equal(e["tokens"], np.asarray(b.tokens))
            assert np.array_equal(e["loss_mask"], np.asarray(b.columns["loss_mask"]))
            assert np.array_equal(e["weight"], np.asarray(b.columns["weight"]))


def test_the_cli_takes_columns_and_shows_them(
    mix: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from plitzer.cli import main

    chat = str(mix["chat"])
    assert main(["plan", chat, "--lanes", "4", "--window", "2", "--columns", "loss_mask,weight"]) == 0
    assert "columns=loss_mask,weight" in capsys.readouterr().out
    args = ["explain", chat, "--lanes", "4", "--window", "2", "--seq-len", "16", "--step", "1"]
    assert main([*args, "--columns", "loss_mask,weight", "--format", "csv"]) == 0
    out = capsys.readouterr().out
    assert "loss_mask_sum" in out and "weight_sum" in out
    # A mixture file's columns: a table of fills, so the web source (no columns) takes them.
    toml = tmp_path / "mix.toml"
    toml.write_text(
        f'[sources.chat]\npath = "{chat}"\n[sources.web]\npath = "{mix["web"]}"\n[columns]\nloss_mask = 0\n'
    )
    assert main(["plan", "--mixture", str(toml), "--lanes", "4", "--window", "2"]) == 0
    assert "columns=loss_mask(fill 0)" in capsys.readouterr().out
    toml.write_text(f'columns = ["loss_mask"]\n[sources.chat]\npath = "{chat}"\n[sources.web]\npath = "{mix["web"]}"\n')
    assert (
        main(["explain", "--mixture", str(toml), "--lanes", "4", "--window", "2", "--seq-len", "16", "--step", "0"])
        != 0
    )
    err = capsys.readouterr().err
    assert "source 'web'" in err and "has no column 'loss_mask'" in err
    with pytest.raises(SystemExit):
        main([*args, "--columns", "loss_mask=yes"])
    assert "not a bool, int or float" in capsys.readouterr().err


def test_plan_records_the_columns(mix: dict[str, Path]) -> None:
    p = plitzer.plan(str(mix["chat"]), lanes=4, window=2, columns={"weight": 0.0, "loss_mask": False})
    assert p.columns == [["loss_mask", False], ["weight", 0.0]]
    assert "columns=loss_mask(fill False),weight(fill 0.0)" in repr(p)
    assert plitzer.plan(str(mix["chat"]), lanes=4, window=2).columns == []


def test_plan_locate_and_audit_refuse_a_column_the_data_lacks_as_the_loader_does(
    mix: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An audit must not approve a run the loader then refuses: every entry point checks ``columns=``."""
    from plitzer.cli import main

    web = str(mix["web"])  # no aligned columns
    with pytest.raises(plitzer.ConfigError, match=r"has no column 'loss_mask'.*columns=\{'loss_mask': 0\}"):
        plitzer.plan(web, lanes=4, window=2, columns=["loss_mask"])
    base = [web, "--lanes", "4", "--window", "2", "--seq-len", "16", "--columns", "loss_mask"]
    for command in (["plan"], ["locate", "--where", "true"], ["audit", "--out", str(tmp_path / "a.html")]):
        assert main([*command[:1], *base, *command[1:]]) == 2, command
        assert "has no column 'loss_mask'" in capsys.readouterr().err
    # With a fill the column is the fill's, everywhere.
    assert plitzer.plan(web, lanes=4, window=2, columns={"loss_mask": 0}).columns == [["loss_mask", 0]]


def test_a_live_layout_change_keeps_the_columns_aligned(sft: tuple[Path, Any, Any]) -> None:
    path, ids, docs = sft
    with plitzer.Loader(path, lanes=4, window=2, seq_len=16, columns=["loss_mask", "weight"]) as ld:
        for _ in range(3):
            check_batch(ld.next_batch(), ids, docs)
        ld.set_layout(lanes=2, seq_len=40)
        for _ in range(len(ld)):
            b = ld.next_batch()
            assert b.columns["weight"].shape == b.tokens.shape
            check_batch(b, ids, docs)


def test_dtypes_of_sources_are_promoted_and_half_floats_kept(tmp_path: Path) -> None:
    for name, typ in (("a", pa.int8()), ("b", pa.int32())):
        d = tmp_path / name
        d.mkdir()
        docs = [[1, 2, 3], [4, 5], [6, 7, 8, 9]] * 4
        pq.write_table(
            pa.table(
                {
                    "input_ids": pa.array(docs, pa.list_(pa.int32())),
                    "labels": pa.array([[-t for t in x] for x in docs], pa.list_(typ)),
                    "half": pa.array([[t / 2 for t in x] for x in docs], pa.list_(pa.float16())),
                }
            ),
            d / "p.parquet",
            row_group_size=3,
        )
    sources = {"a": str(tmp_path / "a"), "b": str(tmp_path / "b")}
    with plitzer.Loader(sources, lanes=2, window=2, seq_len=5, columns=["labels", "half"]) as ld:
        for b in ld:
            t = np.asarray(b.tokens)
            assert b.columns["labels"].dtype == np.int32 and b.columns["half"].dtype == np.float16
            assert (np.asarray(b.columns["labels"]) == -t).all()
            assert (np.asarray(b.columns["half"]) == (t / 2).astype(np.float16)).all()


def test_pin_memory_carries_the_columns(sft: tuple[Path, Any, Any]) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("pinned memory needs an accelerator")
    import plitzer.torch

    path, _, _ = sft
    with plitzer.torch.Dataset(path, lanes=4, window=2, seq_len=16, columns=["loss_mask"]) as ds:
        b = next(iter(ds))
        pinned = b.pin_memory()
        assert pinned.columns["loss_mask"].is_pinned()
        assert torch.equal(pinned.columns["loss_mask"], b.columns["loss_mask"])
        on = b.to("cuda")
        assert on.columns["loss_mask"].device.type == "cuda"


def test_explain_and_the_audit_show_the_columns(sft: tuple[Path, Any, Any]) -> None:
    path, ids, _ = sft
    kw: dict[str, Any] = {"lanes": 4, "window": 2, "seq_len": 16}
    got = plitzer.explain(path, 2, columns=["loss_mask", "weight"], **kw)
    with plitzer.Loader(path, columns=["loss_mask", "weight"], **kw) as ld:
        ld.seek(2)
        b = ld.next_batch()
        want = b.documents()
    assert got["loss_mask_sum"].to_list() == want["loss_mask_sum"].to_list()
    assert got["weight_sum"].to_list() == want["weight_sum"].to_list()
    # Each piece's sum is the sum of the known function over the piece's own positions.
    for r in want.iter_rows(named=True):
        g = ids[(os.path.basename(r["file"]), r["row_group"], r["row"])]
        j = np.arange(r["token_offset"], r["token_offset"] + r["length"])
        assert r["loss_mask_sum"] == int(mask_of(g, j).sum())
        assert r["weight_sum"] == float(weight_of(g, j).sum())
    from plitzer.audit import audit

    report = audit(path, columns={"loss_mask": 0, "weight": None}, **kw)
    assert report.tables["settings"]["columns"].to_list() == ["loss_mask (fill 0), weight"]
    assert "columns" not in audit(path, **kw).tables["settings"].columns


def test_long_documents_take_the_direct_gather(tmp_path: Path) -> None:
    """Sub-pieces of 128 tokens and more are gathered step-major directly (not the short-row transpose)."""
    rng = np.random.default_rng(9)
    files = [[rng.integers(0, 1000, int(rng.integers(150, 700))).tolist() for _ in range(12)] for _ in range(2)]
    ids = write_aligned(tmp_path, files, row_group_size=4)
    docs = dict(enumerate(d for f in files for d in f))
    for world in (1, 2):
        kw: dict[str, Any] = {"lanes": 4, "window": 2, "seq_len": 256, "columns": ["loss_mask", "weight"]}
        for step in run_ranks(tmp_path, 6, world, **kw):
            for b in step:
                check_batch(b, ids, docs)


def test_explain_and_the_audit_index_a_mixtures_text_source_as_the_loader_does(mix: dict[str, Path]) -> None:
    import polars as pl

    from plitzer.audit import audit
    from tests.share_fixtures import char_tokenizer

    tok = char_tokenizer()
    sources = {"chat": str(mix["chat"]), "prose": {"path": str(mix["prose"]), "tokenizer": tok}}
    cfg = {"lanes": 2, "window": 2, "seq_len": 8, "seed": 3}
    with plitzer.Loader(sources, **cfg) as ld:
        run = [ld.next_batch().documents() for _ in range(6)]
    for t in (0, 5):
        got = plitzer.explain(sources, t, **cfg)
        assert got.drop("step").equals(run[t].drop("batch_row")), t
    report = audit(sources, **cfg)
    srcs = report.tables["sources"]
    assert srcs["name"].to_list() == ["chat", "prose"]
    texts = ["hello world", "a b c d", "aligned columns"] * 10  # the prose source, counted by its tokenizer
    assert srcs.filter(pl.col("name") == "prose")["tokens"].item() == sum(len(t) + 1 for t in texts)  # chars + EOS
