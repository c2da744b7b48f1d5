"""Deduplication (``dedupe=``) and exclusion lists (``exclude=``) as selections (SPEC section 14).

Datasets here carry planted duplicates (within a row group, across row groups, files
and a mixture's sources); the loader under ``dedupe=`` must give exactly the batches of
a copy written with the later duplicates removed, every row group kept in place (the
same row-group boundaries), and ``exclude=`` likewise.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import plitzer
import plitzer.selection.dedupe as dd
import plitzer.selection.dropped as dropped
import plitzer.selection.firsts as firsts
import plitzer.selection.keying as keying
from planner.errors import CheckpointError, ConfigError
from planner.mixing.mixindex import MixtureIndex
from plitzer.readpath.read import read_chunk
from plitzer.selection.keys import hash_array
from tests.conftest import tokens_of
from tests.s3_fixtures import S3Data, s3
from tests.share_fixtures import utf8_bytes

__all__ = ["s3"]

CFG: dict[str, Any] = {"seed": 3, "lanes": 4, "window": 3, "seq_len": 16}
DOCS = 12  # rows a row group


def _docs(seed: int, n: int, pool: int) -> list[tuple[list[int], str]]:
    """``n`` documents drawn from ``pool`` distinct ones: many exact repeats, some empty."""
    rng = np.random.default_rng(seed)
    base = []
    for i in range(pool):
        length = int(rng.integers(0, 30)) if i % 7 else 0
        base.append(([int(x) for x in rng.integers(1, 500, length)], f"https://site/{seed}/{i}"))
    picks = rng.integers(0, pool, n)
    return [base[int(p)] for p in picks]


def write_rows(path: Path, docs: list[tuple[list[int], str]], ids: list[int], groups: list[int]) -> None:
    """One file; ``groups`` are the row groups' sizes (a size 0 is an empty row group)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("tokens", pa.list_(pa.int32())), ("url", pa.string()), ("id", pa.int64())])
    at = 0
    with pq.ParquetWriter(path, schema) as w:
        for g in groups:
            chunk = docs[at : at + g]
            w.write_table(
                pa.table(
                    {
                        "tokens": pa.array([d[0] for d in chunk], pa.list_(pa.int32())),
                        "url": pa.array([d[1] for d in chunk], pa.string()),
                        "id": pa.array(ids[at : at + g], pa.int64()),
                    },
                    schema=schema,
                ),
                row_group_size=max(g, 1),
            )
            at += g


def make_source(root: Path, seed: int, files: int = 2, groups: int = 3, pool: int = 25, base: int = 0) -> Path:
    for f in range(files):
        n = groups * DOCS
        docs = _docs(seed * 100 + f, n, pool)
        ids = list(range(base + f * n, base + (f + 1) * n))
        write_rows(root / f"part-{f}.parquet", docs, ids, [DOCS] * groups)
    return root


def rows_of(root: Path) -> list[tuple[str, list[list[tuple[list[int], str, int]]]]]:
    out = []
    for f in sorted(root.glob("*.parquet")):
        pf = pq.ParquetFile(f)
        gs = []
        for g in range(pf.num_row_groups):
            t = pf.read_row_group(g).to_pydict()
            gs.append(list(zip(t["tokens"], t["url"], t["id"], strict=True)))
        out.append((f.name, gs))
    return out


def reference_copy(
    sources: list[Path], dst: Path, keep: Callable[[list[int], str, int], bool], key: Callable[..., Any] | None
) -> list[Path]:
    """Each source copied with the dropped rows removed, row groups kept; ``sources`` in source order."""
    seen: set[Any] = set()
    out = []
    for i, src in enumerate(sources):
        target = dst / f"s{i}"
        for name, groups in rows_of(src):
            kept_docs: list[tuple[list[int], str]] = []
            kept_ids: list[int] = []
            sizes = []
            for rows in groups:
                n = 0
                for tok, url, ident in rows:
                    if not keep(tok, url, ident):
                        continue
                    if key is not None:
                        k = key(tok, url, ident)
                        if k is not None and k in seen:
                            continue
                        if k is not None:
                            seen.add(k)
                    kept_docs.append((tok, url))
                    kept_ids.append(ident)
                    n += 1
                sizes.append(n)
            write_rows(target / name, kept_docs, kept_ids, sizes)
        out.append(target)
    return out


def by_tokens(tok: list[int], url: str, ident: int) -> Any:
    return tuple(tok)


def by_url(tok: list[int], url: str, ident: int) -> Any:
    return url


def everything(tok: list[int], url: str, ident: int) -> bool:
    return True


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_source(tmp_path_factory.mktemp("dups"), seed=1)


def same_batches(a: plitzer.Loader, b: plitzer.Loader, steps: int | None = None) -> None:
    assert a.tokens == b.tokens
    assert a.plan.index["tokens_selected"].to_list() == b.plan.index["tokens"].to_list()
    assert len(a) == len(b)
    for t in range(steps if steps is not None else len(a) + 2):
        assert tokens_of(a.next_batch()).tobytes() == tokens_of(b.next_batch()).tobytes(), f"step {t}"


@pytest.mark.parametrize("key", ["tokens", "url"])
def test_dedupe_equals_the_copy_without_later_duplicates(data: Path, tmp_path: Path, key: str) -> None:
    fn = by_tokens if key == "tokens" else by_url
    (copy,) = reference_copy([data], tmp_path, everything, fn)
    with plitzer.Loader(data, dedupe=key, **CFG) as a, plitzer.Loader(copy, **CFG) as b:
        idx = a.plan.index
        assert int(idx["rows_duplicate"].sum()) > 0
        assert (idx["rows_kept"] + idx["rows_duplicate"] + idx["rows_excluded"] == idx["rows"]).all()
        assert idx["rows_kept"].to_list() == b.plan.index["rows"].to_list()
        same_batches(a, b)


def test_planted_duplicates_within_and_across_row_groups_and_files(tmp_path: Path) -> None:
    x, y, z = [1, 2, 3], [4, 5], [6]
    write_rows(tmp_path / "d/a.parquet", [(x, "u1"), (y, "u2"), (x, "u1"), (z, "u3")], [0, 1, 2, 3], [2, 2])
    write_rows(tmp_path / "d/b.parquet", [(y, "u2"), (z, "u9"), ([7, 8], "u4")], [4, 5, 6], [3])
    ix = dd.dedupe_index(plitzer.index(tmp_path / "d"), "tokens")
    assert ix.frame["rows_duplicate"].to_list() == [0, 1, 2]  # x again; y and z again in the next file
    assert [ix.selected_rows(g).tolist() for g in range(3)] == [[0, 1], [1], [2]]
    assert ix.frame["tokens_selected"].to_list() == [5, 1, 2]
    by_url = dd.dedupe_index(plitzer.index(tmp_path / "d"), "url")
    assert by_url.frame["rows_duplicate"].to_list() == [0, 1, 1]  # u9 is new
    assert dropped.dropped_of(ix, 2, 0) == ("duplicate", ("", 0, 1))  # b.parquet row 0 is a.parquet's row 1
    assert dropped.dropped_of(ix, 0, 0) is None


def test_null_keys_are_never_duplicates(tmp_path: Path) -> None:
    t = pa.table({"tokens": pa.array([[1], [2], [3], [4]], pa.list_(pa.int32())), "url": ["a", None, None, "a"]})
    pq.write_table(t, tmp_path / "n.parquet")
    ix = dd.dedupe_index(plitzer.index(tmp_path / "n.parquet"), "url")
    assert ix.selected_rows(0).tolist() == [0, 1, 2]


@pytest.mark.parametrize("where", ["id % 3 != 0", "url > 'https://site/1/1'"])
def test_where_combined_only_selected_rows_take_part(data: Path, tmp_path: Path, where: str) -> None:
    import duckdb

    con = duckdb.connect()
    keep_ids: set[int] = set()
    for f in sorted(data.glob("*.parquet")):
        keep_ids |= {int(r[0]) for r in con.sql(f"select id from read_parquet('{f}') where {where}").fetchall()}
    con.close()
    (copy,) = reference_copy([data], tmp_path, lambda t, u, i: i in keep_ids, by_tokens)
    with (
        plitzer.Loader(data, where=where, dedupe="tokens", **CFG) as a,
        plitzer.Loader(copy, **CFG) as b,
    ):
        same_batches(a, b)


def _exclusion(tmp_path: Path, data: Path, fmt: str) -> tuple[Path, set[str]]:
    urls = sorted({u for _, groups in rows_of(data) for rows in groups for _, u, _ in rows})[::3]
    table = pa.table({"url": urls})
    path = tmp_path / f"decontam.{fmt}"
    if fmt == "csv":
        pacsv.write_csv(table, path)
    else:
        pq.write_table(table, path)
    return path, set(urls)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_exclude_equals_the_copy_without_the_listed_rows(data: Path, tmp_path: Path, fmt: str) -> None:
    path, urls = _exclusion(tmp_path, data, fmt)
    (copy,) = reference_copy([data], tmp_path / "copy", lambda t, u, i: u not in urls, None)
    with plitzer.Loader(data, exclude=path, **CFG) as a, plitzer.Loader(copy, **CFG) as b:
        assert int(a.plan.index["rows_excluded"].sum()) > 0
        assert int(a.plan.index["rows_duplicate"].sum()) == 0
        same_batches(a, b)
    # An excluded row takes no part in deduplication: it never hides a later duplicate.
    (both,) = reference_copy([data], tmp_path / "both", lambda t, u, i: u not in urls, by_tokens)
    with plitzer.Loader(data, exclude=path, dedupe="tokens", **CFG) as a, plitzer.Loader(both, **CFG) as b:
        same_batches(a, b)


def test_exclude_matches_all_columns_of_a_row(tmp_path: Path) -> None:
    t = pa.table({"tokens": pa.array([[1], [2], [3]], pa.list_(pa.int32())), "url": ["a", "b", "a"], "id": [1, 2, 3]})
    pq.write_table(t, tmp_path / "d.parquet")
    pq.write_table(pa.table({"url": ["a", "b"], "id": [3, 1]}), tmp_path / "x.parquet")
    ix = dd.dedupe_index(plitzer.index(tmp_path / "d.parquet"), plitzer.Selection(exclude=tmp_path / "x.parquet"))
    assert ix.selected_rows(0).tolist() == [0, 1]  # only (a, 3) is listed
    assert dropped.dropped_of(ix, 0, 2) == ("excluded", None)


@pytest.mark.parametrize("key", ["tokens", "url"])
def test_a_pass_beyond_memory_spills_its_keys_by_bucket_and_gives_the_same_result(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    """Past SPILL_KEYS, one process spills phase 1's keys into bucket files and resolves one at a time:
    the result (counts, bitmaps, each duplicate's kept document) is the in-memory pass's, exclusions too."""
    path, _ = _exclusion(tmp_path, data, "parquet")
    web = make_source(tmp_path / "web", seed=2)
    for n, source in enumerate([data, {"web": web, "data": data}]):
        monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / f"memory-{n}"))
        if isinstance(source, Path):
            ix = plitzer.index(source)
        else:
            with plitzer.Loader(source, **CFG) as ld:
                ix = ld.index
        want = dd.dedupe_index(ix, plitzer.Selection(dedupe=key, exclude=path))
        assert int(want.frame["rows_duplicate"].sum()) > 0 and int(want.frame["rows_excluded"].sum()) > 0
        monkeypatch.setattr(firsts, "SPILL_KEYS", 7)  # a handful of keys a bucket: many buckets
        buckets: list[int] = []

        def spy(*a: Any, buckets: list[int] = buckets, real: Any = dd.resolve_spilled) -> Any:
            buckets.append(a[3].buckets)
            return real(*a)

        monkeypatch.setattr(dd, "resolve_spilled", spy)
        monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / f"spilled-{n}"))
        got = dd.dedupe_index(ix, plitzer.Selection(dedupe=key, exclude=path))
        assert buckets and buckets[0] > 8
        wants = want.parts if isinstance(want, MixtureIndex) else [want]
        gots = got.parts if isinstance(got, MixtureIndex) else [got]
        for w, g in zip(wants, gots, strict=True):
            assert g.frame.equals(w.frame)
            assert np.array_equal(g.duplicates, w.duplicates)
            assert all(np.array_equal(a, b) for a, b in zip(g.bits, w.bits, strict=True))
        monkeypatch.undo()


def test_mixture_drops_from_a_later_source_what_an_earlier_one_has(tmp_path: Path) -> None:
    web = make_source(tmp_path / "web", seed=2)
    # curated: a subset of web (its first file) plus documents of its own
    curated = tmp_path / "curated"
    rows = [r for rows in rows_of(web)[0][1] for r in rows]
    extra = _docs(77, 12, 12)
    write_rows(
        curated / "c.parquet",
        [(t, u) for t, u, _ in rows] + extra,
        [10_000 + i for i in range(len(rows) + 12)],
        [DOCS] * (len(rows) // DOCS) + [12],
    )
    # Sources in the order given: web first, so curated's copies of web documents are dropped.
    w2, c2 = reference_copy([web, curated], tmp_path / "ref", everything, by_tokens)
    with (
        plitzer.Loader({"web": web, "curated": curated}, dedupe="tokens", **CFG) as a,
        plitzer.Loader({"web": w2, "curated": c2}, **CFG) as b,
    ):
        idx = a.plan.index
        cur = idx.filter(idx["source"] == "curated")
        assert int(cur["rows_duplicate"].sum()) >= len(rows)
        same_batches(a, b, 40)
    c3, w3 = reference_copy([curated, web], tmp_path / "ref2", everything, by_tokens)
    with (
        plitzer.Loader({"curated": curated, "web": web}, dedupe="tokens", **CFG) as a,
        plitzer.Loader({"curated": c3, "web": w3}, **CFG) as b,
    ):
        same_batches(a, b, 40)


@pytest.mark.parametrize("worlds", [(1, 2), (2, 4), (4, 1)])
def test_worlds_and_resume_at_another_world(data: Path, worlds: tuple[int, int]) -> None:
    before, after = worlds
    kw = {**CFG, "lanes": 8, "dedupe": "tokens"}
    step = 5
    with plitzer.Loader(data, **kw) as whole:
        whole.seek(step)
        want = [tokens_of(whole.next_batch()).copy() for _ in range(3)]
    parts = []
    for r in range(before):
        with plitzer.Loader(data, world=before, rank=r, **kw) as x:
            x.seek(step)
            parts.append(x.checkpoint())
    state = plitzer.merge(parts)
    got: list[list[np.ndarray]] = []
    for r in range(after):
        with plitzer.Loader(data, world=after, rank=r, **kw) as y:
            y.resume(state)
            got.append([tokens_of(y.next_batch()).copy() for _ in range(3)])
    for i in range(3):
        assert np.concatenate([g[i] for g in got]).tobytes() == want[i].tobytes()


def test_the_checkpoint_records_the_key_and_digest_and_refuses_another(data: Path, tmp_path: Path) -> None:
    path, _ = _exclusion(tmp_path, data, "parquet")
    with plitzer.Loader(data, dedupe="tokens", exclude=path, **CFG) as a:
        a.next_batch()
        state = a.checkpoint()
    import hashlib

    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    cfg = plitzer.state.checkpoint.decode(state).config  # type: ignore[attr-defined]
    assert cfg["dedupe"] == "tokens" and cfg["exclude"] == digest
    with plitzer.Loader(data, dedupe="url", exclude=path, **CFG) as b, pytest.raises(CheckpointError) as e:
        b.resume(state)
    assert "dedupe: checkpoint 'tokens', loader 'url'" in str(e.value)
    with plitzer.Loader(data, **CFG) as c, pytest.raises(CheckpointError) as e:
        c.resume(state)
    assert "'tokens'" in str(e.value) and digest in str(e.value)


def test_runs_without_dedupe_write_no_new_field(data: Path) -> None:
    with plitzer.Loader(data, **CFG) as a:
        a.next_batch()
        state = a.checkpoint()
    assert b'"dedupe"' not in state and b'"exclude"' not in state


def test_refusals(data: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'nope' is not a column"):
        plitzer.Loader(data, dedupe="nope", **CFG)
    with pytest.raises(ConfigError, match="must be 'tokens'"):
        plitzer.Loader(data, dedupe="", **CFG)
    ix = plitzer.index(data)
    with pytest.raises(ConfigError, match="must be 'tokens'"):
        dd.dedupe_index(ix, "")  # a str is the key alone
    assert dd.dedupe_index(ix, plitzer.Selection(where="score > 1")) is ix  # where= is the selection pass's
    pq.write_table(pa.table({"urll": ["x"]}), tmp_path / "bad.parquet")
    with pytest.raises(ConfigError, match="'urll' is not a column"):
        plitzer.Loader(data, exclude=tmp_path / "bad.parquet", **CFG)
    with pytest.raises(ConfigError, match="cannot read the exclusion table"):
        plitzer.Loader(data, exclude=tmp_path / "missing.parquet", **CFG)
    with pytest.raises(ConfigError, match="cannot be compared"):
        pq.write_table(pa.table({"id": ["not a number"]}), tmp_path / "ids.parquet")
        plitzer.Loader(data, exclude=tmp_path / "ids.parquet", **CFG)
    with pytest.raises(ConfigError, match="keeps no token"):
        t = pa.table({"tokens": pa.array([[1, 2]] * 4, pa.list_(pa.int32()))})
        pq.write_table(t, tmp_path / "same.parquet")
        pq.write_table(t, tmp_path / "same2.parquet")
        plitzer.Loader({"a": tmp_path / "same.parquet", "b": tmp_path / "same2.parquet"}, dedupe="tokens", **CFG)


def test_the_pass_is_cached_and_reads_only_the_key(data: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    read: list[str] = []
    real = keying.read_column

    def spy(ix: Any, rg: int, column: str, runs: Any) -> Any:
        read.append(column)
        return real(ix, rg, column, runs)

    monkeypatch.setattr(keying, "read_column", spy)
    first = dd.dedupe_index(plitzer.index(data), "url")
    assert set(read) == {"url"}
    read.clear()
    calls: list[int] = []
    monkeypatch.setattr(keying.KeyPass, "hash_rg", lambda self, p, rg, runs=None: calls.append(rg))
    again = dd.dedupe_index(plitzer.index(data), "url")
    assert calls == [] and read == []
    assert again.frame.equals(first.frame)


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_split_phase_one_and_each_resolves_only_the_keys_it_owns(
    data: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, world: int
) -> None:
    """Each rank keys its 1/world of the chunks, and resolves about 1/world of the keys: no rank holds them all."""
    from tests.share_fixtures import ThreadGroup, run_ranks

    ix = plitzer.index(data)
    chunks = keying.key_chunks([ix])
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "ranks"))
    keyed: list[int] = []
    resolved: list[int] = []
    real_hash, real_first = keying.KeyPass.hash_chunk, firsts.first_occurrences

    def spy_hash(self: Any, p: int, a: int, b: int) -> Any:
        keyed.append(a)
        return real_hash(self, p, a, b)

    def spy_first(keys: Any, *args: Any) -> Any:
        resolved.append(len(keys))
        return real_first(keys, *args)

    monkeypatch.setattr(keying.KeyPass, "hash_chunk", spy_hash)
    monkeypatch.setattr(firsts, "first_occurrences", spy_first)
    group = ThreadGroup(world)
    members = [group.member(r) for r in range(world)]
    got = run_ranks(
        world,
        lambda r: dd.dedupe_index(ix, "tokens", rank=r, world=world, exchange=members[r].all_gather),
    )
    assert sorted(keyed) == sorted(a for _, a, _ in chunks)  # every chunk keyed once, by one rank
    assert all(m.calls == world + 3 for m in members)
    keys = np.concatenate([hash_array(read_chunk(ix, rg), "t") for rg in range(ix.row_groups)])
    owned = np.bincount(firsts.owner(keys, world), minlength=world)
    assert sorted(resolved) == sorted(owned.tolist())  # each rank resolves exactly the keys it owns
    assert max(resolved) < len(keys)
    monkeypatch.undo()
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "whole"))
    whole = dd.dedupe_index(plitzer.index(data), "tokens")
    for g in got:
        assert g.frame.equals(whole.frame)
        assert np.array_equal(g.duplicates, whole.duplicates)
        assert all(np.array_equal(a, b) for a, b in zip(g.bits, whole.bits, strict=True))


def test_a_ranks_error_in_phase_one_is_raised_on_every_rank(
    data: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No rank waits in an exchange that the failed one never joins: each raises the failed rank's error."""
    from planner.errors import DataError
    from tests.share_fixtures import ThreadGroup, run_ranks

    ix = plitzer.index(data)
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "c"))
    real = keying.KeyPass.hash_chunk

    def fail_first(self: Any, p: int, a: int, b: int) -> Any:
        if a == 0:  # rank 0's first chunk
            raise DataError("chunk 0: damaged (planted)")
        return real(self, p, a, b)

    monkeypatch.setattr(keying.KeyPass, "hash_chunk", fail_first)
    group = ThreadGroup(2)

    def one(r: int) -> Any:
        try:
            return dd.dedupe_index(ix, "tokens", rank=r, world=2, exchange=group.member(r).all_gather)
        except DataError as e:
            return e

    got = run_ranks(2, one)
    assert all(isinstance(g, DataError) and "planted" in str(g) for g in got)


def test_in_process_ranks_share_the_cache(data: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "c"))
    frames = [dd.dedupe_index(plitzer.index(data), "url", rank=r, world=4).frame for r in range(4)]
    assert all(f.equals(frames[0]) for f in frames)


def test_text_sources(tmp_path: Path) -> None:
    from plitzer.text.tokenizer import load_tokenizer

    words = ["alpha beta", "gamma", "alpha beta", "delta epsilon zeta", "gamma", "eta"]
    t = pa.table({"text": words * 3, "url": [f"u{i % 5}" for i in range(18)]})
    pq.write_table(t, tmp_path / "t.parquet", row_group_size=5)
    tok = load_tokenizer(utf8_bytes, name="bytes-v1", eos_id=0)
    kw = {**CFG, "tokenizer": tok, "text_column": "text"}
    seen: set[Any] = set()
    kept_text: list[str] = []
    sizes = []
    for g in range(4):
        n = 0
        for w in (words * 3)[g * 5 : (g + 1) * 5]:
            if w not in seen:
                seen.add(w)
                kept_text.append(w)
                n += 1
        sizes.append(n)
    copy = tmp_path / "copy"
    copy.mkdir()
    with pq.ParquetWriter(copy / "t.parquet", pa.schema([("text", pa.string())])) as w:
        at = 0
        for s in sizes:
            w.write_table(pa.table({"text": pa.array(kept_text[at : at + s], pa.string())}), row_group_size=max(s, 1))
            at += s
    with plitzer.Loader(tmp_path / "t.parquet", dedupe="tokens", **kw) as a, plitzer.Loader(copy, **kw) as b:
        same_batches(a, b)
    with plitzer.Loader(tmp_path / "t.parquet", dedupe="text", **kw) as a, plitzer.Loader(copy, **kw) as b:
        same_batches(a, b)
    with pytest.raises(ConfigError, match="length_column='n' with a text source"):
        plitzer.Loader(tmp_path / "t.parquet", dedupe="url", length_column="n", **kw)


def test_s3_source_and_exclusion_table(s3: S3Data, tmp_path: Path) -> None:
    local = Path(s3.local["synth"])
    opts = s3.options()
    cfg = {"seed": 7, "lanes": 8, "window": 3, "seq_len": 96}
    with (
        plitzer.Loader(local, dedupe="token_count", **cfg) as disk,  # type: ignore[arg-type]
        plitzer.Loader(s3.url["synth"], dedupe="token_count", storage_options=opts, **cfg) as remote,  # type: ignore[arg-type]
    ):
        assert int(disk.plan.index["rows_duplicate"].sum()) > 0
        assert remote.plan.index["rows_kept"].to_list() == disk.plan.index["rows_kept"].to_list()
        for t in range(min(len(disk), 20)):
            assert tokens_of(disk.next_batch()).tobytes() == tokens_of(remote.next_batch()).tobytes(), f"step {t}"


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_an_exclusion_table_on_s3(s3: S3Data, tmp_path: Path, fmt: str) -> None:
    import io

    local = Path(s3.local["synth"])
    ids = list(range(0, 400, 7))
    table = pa.table({"id": pa.array(ids, pa.int64())})
    buf = io.BytesIO()
    if fmt == "csv":
        pacsv.write_csv(table, buf)
    else:
        pq.write_table(table, buf)
    s3.client().put_object(Bucket=s3.bucket, Key=f"lists/decontam.{fmt}", Body=buf.getvalue())
    (tmp_path / f"decontam.{fmt}").write_bytes(buf.getvalue())
    cfg = {"seed": 7, "lanes": 8, "window": 3, "seq_len": 96}
    url = f"s3://{s3.bucket}/lists/decontam.{fmt}"
    with (
        plitzer.Loader(local, exclude=tmp_path / f"decontam.{fmt}", **cfg) as disk,  # type: ignore[arg-type]
        plitzer.Loader(local, exclude=url, storage_options=s3.options(), **cfg) as remote,  # type: ignore[arg-type]
    ):
        assert int(disk.plan.index["rows_excluded"].sum()) == len(ids)
        assert remote.config["exclude"] == disk.config["exclude"]
        for t in range(min(len(disk), 10)):
            assert tokens_of(disk.next_batch()).tobytes() == tokens_of(remote.next_batch()).tobytes(), f"step {t}"


def test_cli_takes_dedupe_and_exclude(data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from plitzer.cli import main

    sql = "select sum(rows_duplicate) as d, sum(rows_excluded) as x from index"
    path, _ = _exclusion(tmp_path, data, "csv")
    args = ["plan", str(data), "--dedupe", "tokens", "--exclude", str(path), "--lanes", "4", "--window", "3"]
    assert main([*args, "--sql", sql, "--format", "csv"]) == 0
    d, x = (int(v) for v in capsys.readouterr().out.splitlines()[1].split(","))
    with plitzer.Loader(data, dedupe="tokens", exclude=path, **CFG) as a:
        assert d == int(a.plan.index["rows_duplicate"].sum()) > 0
        assert x == int(a.plan.index["rows_excluded"].sum()) > 0


def test_cli_index_reports_the_pass(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from plitzer.cli import main

    assert main(["index", str(data), "--dedupe", "url", "--no-lengths", "--format", "csv"]) == 0
    out = capsys.readouterr().out
    assert "documents_duplicate" in out
    assert main(["index", str(data), "--engine", "ray"]) != 0
    assert "--dedupe" in capsys.readouterr().err


@pytest.mark.ray
@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_pass_runs_on_ray_ahead_of_the_job(data: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tests.share_fixtures import ray_with_caches

    with ray_with_caches(tmp_path, monkeypatch):
        ix = plitzer.index(data)
        assert keying.dedupe_on_ray(ix, "tokens", source=str(data)) == len(keying.key_chunks([ix]))
    calls: list[int] = []
    monkeypatch.setattr(keying.KeyPass, "hash_rg", lambda self, p, rg, runs=None: calls.append(rg))
    got = dd.dedupe_index(ix, "tokens")
    assert calls == []  # the Ray tasks' keys are in this cache folder
    monkeypatch.undo()
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "fresh"))
    assert dd.dedupe_index(plitzer.index(data), "tokens").frame.equals(got.frame)


def test_locate_says_a_dropped_document_was_dropped_and_which_was_kept(tmp_path: Path) -> None:
    x, y = [1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15]
    docs = [(x, "u1"), (y, "u2"), ([20 + i for i in range(9)], "u3"), (x, "u4"), ([30] * 12, "u5"), (y, "u6")]
    write_rows(tmp_path / "d/a.parquet", docs, [0, 1, 2, 3, 4, 5], [3, 3])
    pq.write_table(pa.table({"url": ["u5"]}), tmp_path / "x.parquet")
    kw = {"seed": 0, "lanes": 2, "window": 2, "seq_len": 8, "dedupe": "tokens", "exclude": tmp_path / "x.parquet"}
    got = plitzer.locate(tmp_path / "d", "id >= 2", **kw)  # type: ignore[arg-type]
    gone = got.filter(got["dropped"].is_not_null()).sort("row_group", "row")
    assert gone.select("row_group", "row", "dropped").rows() == [(1, 0, "duplicate"), (1, 1, "excluded"),
                                                                 (1, 2, "duplicate")]  # fmt: skip
    assert gone.select("kept_file", "kept_row_group", "kept_row").rows()[0] == ("a.parquet", 0, 0)
    assert gone.select("kept_row_group", "kept_row").rows()[2] == (0, 1)
    assert gone["step"].is_null().all()
    seen = got.filter(got["dropped"].is_null())
    assert set(seen.select("row_group", "row").unique().rows()) == {(0, 2)}  # id 2, kept
    # batch.documents() names the rows of the original files
    with plitzer.Loader(tmp_path / "d", **kw) as a:  # type: ignore[arg-type]
        rows = set()
        for _ in range(len(a)):
            rows |= set(a.next_batch().documents().select("row_group", "row").unique().rows())
    assert rows == {(0, 0), (0, 1), (0, 2)}


def test_cli_locate_says_dropped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from plitzer.cli import main

    x = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    write_rows(tmp_path / "d/a.parquet", [(x, "u1"), ([5] * 12, "u2"), (x, "u3")], [0, 1, 2], [3])
    args = ["locate", str(tmp_path / "d"), "--where", "id = 2", "--dedupe", "tokens", "--lanes", "2"]
    assert main([*args, "--window", "2", "--seq-len", "8"]) == 0
    out = capsys.readouterr().out
    assert "a.parquet row group 0 row 2: dropped as a duplicate (--dedupe) of a.parquet row group 0 row 0" in out


def test_audit_says_what_dedupe_would_drop_and_what_it_dropped(data: Path) -> None:
    kw = {**CFG, "lanes": 4}
    from plitzer.audit import audit

    plain = audit(data, **kw)  # type: ignore[arg-type]
    note = plain.notes["Duplicate documents"]
    dup = plain.tables["duplicates"]
    would = dup.height - dup["group"].n_unique()
    assert f"dedupe='tokens' would drop those {would:,} later copies" in note
    run = audit(data, dedupe="tokens", **kw)  # type: ignore[arg-type]
    table = run.tables["deduplication"]
    with plitzer.Loader(data, dedupe="tokens", **CFG) as a:
        dropped = int(a.plan.index["rows_duplicate"].sum())
    assert int(table["rows_duplicate"].sum()) == dropped
    assert f"dropped {dropped:,} duplicates" in run.notes["Duplicate documents"]
    # the empty documents aside, what the run dropped is what the audit said it would drop
    empties = sum(1 for _, gs in rows_of(data) for rows in gs for t, _, _ in rows if not t)
    assert would <= dropped <= would + empties


def test_a_job_keys_each_chunk_once_with_one_exchange(
    data: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tests.share_fixtures import ThreadGroup, assert_ranks_make_the_whole, run_ranks

    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "job"))
    world = 2
    group = ThreadGroup(world)
    keyed: list[int] = []
    real = keying.KeyPass.hash_chunk

    def spy(self: Any, p: int, a: int, b: int) -> Any:
        keyed.append(a)
        return real(self, p, a, b)

    monkeypatch.setattr(keying.KeyPass, "hash_chunk", spy)
    kw = {**CFG, "lanes": 8, "dedupe": "url"}
    members = [group.member(r) for r in range(world)]
    loaders = run_ranks(world, lambda r: plitzer.Loader.in_group(members[r], data, rank=r, world=world, **kw))
    try:
        assert sorted(keyed) == sorted(c[1] for c in keying.key_chunks([plitzer.index(data)]))  # each chunk once
        monkeypatch.undo()
        monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "alone"))
        with plitzer.Loader(data, **kw) as whole:
            assert_ranks_make_the_whole(loaders, whole, 6)
    finally:
        for x in loaders:
            x.close()


@pytest.mark.parametrize("bucket_rows", [1 << 22, 7, 1])
def test_first_occurrences_bucket_by_bucket(bucket_rows: int) -> None:
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 40, (500, 2)).astype(np.uint64)  # many repeats
    drop, kept = firsts.first_occurrences(keys, bucket_rows)
    first: dict[tuple[int, int], int] = {}
    want_drop, want_kept = [], []
    for i, (a, b) in enumerate(keys.tolist()):
        if (a, b) in first:
            want_drop.append(i)
            want_kept.append(first[(a, b)])
        else:
            first[(a, b)] = i
    assert drop.tolist() == want_drop and kept.tolist() == want_kept


def test_keys_tell_lists_apart_by_order_length_and_value() -> None:
    from plitzer.selection.keys import hash_array

    arr = pa.array([[1, 2], [2, 1], [1, 2, 0], [1, 2], [], [0], [], None], pa.list_(pa.int32()))
    k = hash_array(arr)
    rows = [tuple(r) for r in k.tolist()]
    assert rows[0] == rows[3] and rows[4] == rows[6]
    assert len({rows[i] for i in (0, 1, 2, 4, 5)}) == 5
    s = hash_array(pa.array(["ab", "ba", "ab", "", "a"]))
    assert tuple(s[0]) == tuple(s[2]) and len({tuple(r) for r in s.tolist()}) == 4


def _reference_key(row: np.ndarray) -> tuple[int, int]:
    """A row's two lanes by the formula of plitzer.selection.keys, written again on its own (NumPy, uint64)."""

    def mix(x: np.ndarray) -> np.ndarray:
        x = x.copy()
        with np.errstate(over="ignore"):
            x ^= x >> np.uint64(30)
            x *= np.uint64(0xBF58476D1CE4E5B9)
            x ^= x >> np.uint64(27)
            x *= np.uint64(0x94D049BB133111EB)
            x ^= x >> np.uint64(31)
        return x

    out = []
    for seed in (0x9E3779B97F4A7C15, 0xD1B54A32D192ED03):
        s, n = np.uint64(seed), len(row)
        with np.errstate(over="ignore"):
            terms = mix(row.astype(np.int64).view(np.uint64) ^ mix(np.arange(n, dtype=np.uint64) + s))
            total = terms.sum(dtype=np.uint64) + mix(np.array([n], np.uint64) + s)[0]
        out.append(int(mix(np.array([total], np.uint64))[0]))
    return out[0], out[1]


def test_keys_of_documents_longer_than_the_kept_positions_follow_the_formula() -> None:
    # Positions' terms are kept for documents of up to 2**20 tokens; a longer one's are made
    # for the call: its key is the same, before and after the kept table, and kept small.
    rng = np.random.default_rng(5)
    long = rng.integers(0, 1 << 17, (1 << 20) + 5).astype(np.int32)
    rows = [np.array([3, 1, 2], np.int32), long, np.array([], np.int32), long[:70_000]]
    arr = pa.array([r.tolist() for r in rows], pa.list_(pa.int32()))
    first = hash_array(arr)
    assert [tuple(k) for k in first.tolist()] == [_reference_key(r) for r in rows]
    assert np.array_equal(hash_array(arr[::-1]), first[::-1])


def test_first_occurrences_with_equal_first_lanes() -> None:
    keys = np.array([[5, 1], [5, 2], [5, 1], [7, 0], [5, 2], [5, 3]], np.uint64)
    drop, kept = firsts.first_occurrences(keys)
    assert drop.tolist() == [2, 4] and kept.tolist() == [0, 1]


def test_mixture_file_takes_dedupe_and_exclude(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from plitzer.cli import main
    from plitzer.tools.mixfile import mixture_settings, read_mixture

    a = make_source(tmp_path / "a", seed=4, files=1)
    b = make_source(tmp_path / "b", seed=4, files=1, base=1000)  # the same documents: all dropped from b
    c = make_source(tmp_path / "c", seed=5, files=1, base=2000)
    toml = tmp_path / "mix.toml"
    toml.write_text(
        f'dedupe = "tokens"\n[sources.c]\npath = "{c}"\n[sources.a]\npath = "{a}"\n[sources.b]\npath = "{b}"\n'
    )
    sources, _ = read_mixture(str(toml))
    assert list(sources) == ["c", "a", "b"] and mixture_settings(str(toml)) == {"dedupe": "tokens"}
    with pytest.raises(ConfigError, match="source 'b' keeps no token"):
        plitzer.Loader(sources, **mixture_settings(str(toml)), **CFG)
    toml.write_text(f'dedupe = "tokens"\n[sources.c]\npath = "{c}"\n[sources.a]\npath = "{a}"\n')
    sql = "select source, sum(rows_duplicate) as d from index group by source order by source"
    assert main(["plan", "--mixture", str(toml), "--lanes", "4", "--window", "3", "--sql", sql, "--format", "csv"]) == 0
    out = capsys.readouterr().out.splitlines()
    with plitzer.Loader({"c": c, "a": a}, dedupe="tokens", **CFG) as loader:
        idx = loader.plan.index
        want = [f"{s},{int(idx.filter(idx['source'] == s)['rows_duplicate'].sum())}" for s in ("a", "c")]
        state = loader.checkpoint()
    assert out[1:] == want
    with plitzer.Loader({"c": c, "a": a}, **CFG) as plain, pytest.raises(CheckpointError, match="dedupe"):
        plain.resume(state)
    bad = tmp_path / "bad.toml"
    bad.write_text(f'dedupe = 3\n[sources.c]\npath = "{c}"\n')
    with pytest.raises(ConfigError, match="must be a string"):
        mixture_settings(str(bad))


def test_a_job_over_a_mixture_keeps_the_order_given(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tests.share_fixtures import ThreadGroup, assert_ranks_make_the_whole, run_ranks

    web = make_source(tmp_path / "web", seed=6, files=1)
    rows = [r for rows in rows_of(web)[0][1] for r in rows]
    curated = tmp_path / "curated"
    write_rows(curated / "c.parquet", [(t, u) for t, u, _ in rows] + _docs(9, 12, 12),
               [5000 + i for i in range(len(rows) + 12)], [DOCS] * (len(rows) // DOCS) + [12])  # fmt: skip
    sources = {"web": web, "curated": curated}  # web first: curated's copies are dropped
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "job"))
    group = ThreadGroup(2)
    members = [group.member(r) for r in range(2)]
    kw = {**CFG, "lanes": 8, "dedupe": "tokens"}
    loaders = run_ranks(2, lambda r: plitzer.Loader.in_group(members[r], sources, rank=r, world=2, **kw))
    try:
        idx = loaders[0].plan.index
        assert int(idx.filter(idx["source"] == "web")["rows_duplicate"].sum()) < len(rows)
        assert int(idx.filter(idx["source"] == "curated")["rows_duplicate"].sum()) >= len(rows)
        monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "alone"))
        with plitzer.Loader(sources, **kw) as whole:
            assert_ranks_make_the_whole(loaders, whole, 5)
    finally:
        for x in loaders:
            x.close()


def test_more_refusals(data: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'nope' is not a column of source 'a'"):
        plitzer.Loader({"a": data, "b": data}, dedupe="nope", **CFG)
    pq.write_table(pa.table({"tokens": [1]}), tmp_path / "tok.parquet")
    with pytest.raises(ConfigError, match="'tokens' is not a column"):  # the token column is not a listed column
        plitzer.Loader(data, exclude=tmp_path / "tok.parquet", **CFG)
    t = pa.table({"tokens": pa.array([[1], [2]], pa.list_(pa.int32())), "s": [{"a": 1}, {"a": 1}]})
    pq.write_table(t, tmp_path / "struct.parquet")
    with pytest.raises(ConfigError, match="compare strings, binary, numbers"):
        plitzer.Loader(tmp_path / "struct.parquet", dedupe="s", **CFG)
    (tmp_path / "bad.csv").write_text("url,id\na,1,extra\n")
    with pytest.raises(plitzer.errors.DataError, match="not a readable Parquet or CSV"):
        plitzer.Loader(data, exclude=tmp_path / "bad.csv", **CFG)


@pytest.mark.parametrize("how", ["url+where", "exclude", "mixture"])
def test_resume_at_another_world_under_each_kind(data: Path, tmp_path: Path, how: str) -> None:
    path, _ = _exclusion(tmp_path, data, "csv")
    source: Any = data
    kw: dict[str, Any] = {**CFG, "lanes": 8}
    if how == "url+where":
        kw.update(dedupe="url", where="id % 4 != 1")
    elif how == "exclude":
        kw.update(exclude=path, dedupe="tokens")
    else:
        other = make_source(tmp_path / "other", seed=3, files=1)  # its empty documents are in data too
        source = {"z": data, "a": other}
        kw.update(dedupe="tokens")
    step = 4
    with plitzer.Loader(source, **kw) as whole:
        whole.seek(step)
        want = [tokens_of(whole.next_batch()).copy() for _ in range(2)]
    parts = []
    for r in range(2):
        with plitzer.Loader(source, world=2, rank=r, **kw) as x:
            x.seek(step)
            parts.append(x.checkpoint())
    state = plitzer.merge(parts)
    got: list[list[np.ndarray]] = []
    for r in range(4):
        with plitzer.Loader(source, world=4, rank=r, **kw) as y:
            y.resume(state)
            got.append([tokens_of(y.next_batch()).copy() for _ in range(2)])
    for i in range(2):
        assert np.concatenate([g[i] for g in got]).tobytes() == want[i].tobytes()


_DIST_WORKER = """
import json, sys
import torch.distributed as dist
import plitzer.selection.keying as keying
import plitzer.torch

rank, world, port, data, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
keyed = []
real = keying.KeyPass.hash_chunk
keying.KeyPass.hash_chunk = lambda self, p, a, b: (keyed.append(a), real(self, p, a, b))[1]
ds = plitzer.torch.Dataset(data, dedupe="tokens", seed=3, lanes=4, window=3, seq_len=16, threads=1)
batch = next(iter(ds))
json.dump({"keyed": keyed, "tokens": batch.tokens.numpy().tolist()}, open(out, "w"))
dist.destroy_process_group()
"""


@pytest.mark.timeout(180)
def test_torch_distributed_ranks_each_key_their_share(data: Path, tmp_path: Path) -> None:
    """Each rank (its own cache folder) keys its 1/world of the row groups; all_gather_object shares the keys."""
    pytest.importorskip("torch")
    from tests.share_fixtures import gloo_ranks

    got = gloo_ranks(_DIST_WORKER, data, tmp_path)
    chunks = keying.key_chunks([plitzer.index(data)])
    for r in range(2):
        assert sorted(got[r]["keyed"]) == sorted(a for c, (_, a, _) in enumerate(chunks) if c * 2 // len(chunks) == r)
    with plitzer.Loader(data, dedupe="tokens", **CFG) as ref:
        want = tokens_of(ref.next_batch())
    assert np.concatenate([np.array(g["tokens"]) for g in got]).tolist() == want.tolist()


def test_plitzer_plan_takes_dedupe_and_exclude(data: Path, tmp_path: Path) -> None:
    path, _ = _exclusion(tmp_path, data, "parquet")
    p = plitzer.plan(data, dedupe="tokens", exclude=path, lanes=4, window=3)
    with plitzer.Loader(data, dedupe="tokens", exclude=path, **CFG) as a:
        assert p.index["rows_kept"].to_list() == a.plan.index["rows_kept"].to_list()
        assert p.tokens == a.tokens
    sql = p.sql("select sum(rows_duplicate) as d, sum(rows_excluded) as x from index")
    assert sql["d"][0] > 0 and sql["x"][0] > 0


# -- length_column: the dropped rows' tokens counted without decoding them -----------------


def _with_counts(src: Path, dst: Path, *, wrong: bool = False) -> Path:
    """``src``'s files with a ``token_count`` column of each row's tokens.

    ``wrong``: in the first file's row group 1, a row whose url came before (dropped by ``dedupe="url"``)
    swaps counts with a kept row of another count: the same sum, wrong rows.
    """
    dst.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    for f in sorted(src.glob("*.parquet")):
        pf = pq.ParquetFile(f)
        with pq.ParquetWriter(dst / f.name, pf.schema_arrow.append(pa.field("token_count", pa.int32()))) as w:
            for g in range(pf.num_row_groups):
                t = pf.read_row_group(g)
                counts = pa.compute.list_value_length(t["tokens"]).fill_null(0).to_numpy().astype(np.int32)
                urls = t["url"].to_pylist()
                dup = np.zeros(len(urls), bool)
                for r, u in enumerate(urls):
                    dup[r] = u in seen
                    seen.add(u)
                if wrong and g == 1 and f.name == "part-0.parquet":
                    i = int(np.flatnonzero(dup)[0])
                    j = int(np.flatnonzero(~dup & (counts != counts[i]))[0])
                    counts[[i, j]] = counts[[j, i]]
                w.write_table(t.append_column("token_count", pa.array(counts, pa.int32())))
    return dst


@pytest.mark.parametrize("how", [{"dedupe": "url"}, {"exclude": "table"}, {"dedupe": "url", "where": "id % 5 <> 1"}])
def test_a_length_column_counts_the_dropped_tokens_without_the_token_column(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: dict[str, str]
) -> None:
    """``length_column=`` beside a column key or an exclusion: the same selection and batches, no token chunk
    decoded by the pass (phase 2 counts the dropped rows' tokens from the column)."""
    src = _with_counts(data, tmp_path / "counted")
    kw = dict(how)
    if kw.get("exclude") == "table":
        rows = pq.read_table(src, columns=["url"]).column(0).to_pylist()[::3]
        pq.write_table(pa.table({"url": rows}), tmp_path / "x.parquet")
        kw["exclude"] = str(tmp_path / "x.parquet")
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "plain"))
    with plitzer.Loader(src, **kw, **CFG) as loader:
        want = [tokens_of(loader.next_batch()).copy() for _ in range(len(loader))]
        want_frame = loader.plan.dataset.frame
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "counted-cache"))
    import plitzer.selection.result as result

    def no_tokens(*a: object, **k: object) -> None:
        raise AssertionError("the pass decoded a token chunk to count dropped tokens")

    monkeypatch.setattr(result, "stream_tokens", no_tokens)
    with plitzer.Loader(src, length_column="token_count", **kw, **CFG) as loader:
        got = [tokens_of(loader.next_batch()).copy() for _ in range(len(loader))]
        frame = loader.plan.dataset.frame
    cols = ["rows_selected", "tokens_selected", "empty_docs_selected", "rows_duplicate", "rows_excluded"]
    assert frame.select(cols).equals(want_frame.select(cols))
    assert int(frame["rows_duplicate"].sum() + frame["rows_excluded"].sum()) > 0
    assert len(got) == len(want)
    for t, (a, b) in enumerate(zip(want, got, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"step {t}")


def test_a_length_column_that_miscounts_is_named(data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A column whose row group sum is wrong is refused by the pass; one right in sum but wrong by row, at the read:
    both name the file, the row group and the fix."""
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "c"))
    src = _with_counts(data, tmp_path / "counted")
    with pytest.raises(plitzer.DataError, match=r"part-0\.parquet.*row group 0.*sums to .* drop length_column="):
        plitzer.Loader(src, dedupe="url", length_column="id", **CFG)
    with pytest.raises(ConfigError, match=r"length_column='url' is string, not an integer"):
        plitzer.Loader(src, dedupe="url", length_column="url", **CFG)
    with pytest.raises(ConfigError, match=r"length_column='nope' is not a column .* available columns: url, id"):
        plitzer.Loader(src, dedupe="url", length_column="nope", **CFG)
    with pytest.raises(ConfigError, match=r"length_column='token_count' without where=, dedupe= or exclude="):
        plitzer.Loader(src, length_column="token_count", **CFG)
    negative = tmp_path / "negative"
    negative.mkdir()
    t = pq.read_table(src / "part-0.parquet")
    counts = t["token_count"].to_numpy().copy()
    counts[[0, 1]] = [counts[0] + counts[1] + 1, -1]
    pq.write_table(
        t.set_column(t.schema.get_field_index("token_count"), "token_count", pa.array(counts)),
        negative / "a.parquet",
        row_group_size=len(counts),
    )
    with pytest.raises(plitzer.DataError, match=r"a\.parquet, row group 0, row 1: length_column='token_count' is -1"):
        plitzer.Loader(negative, dedupe="url", length_column="token_count", **CFG)
    bad = _with_counts(data, tmp_path / "swapped", wrong=True)
    with (
        pytest.raises(plitzer.DataError, match=r"row group 1.*length_column='token_count' does not hold"),
        plitzer.Loader(bad, dedupe="url", length_column="token_count", **CFG) as loader,
    ):
        for _ in range(len(loader)):
            loader.next_batch()


def test_a_length_column_in_the_cli_and_a_mixtures_sources(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``plitzer index --dedupe url --length-column token_count``, and a mixture source's own ``length_column``
    (given with its ``where``, which it serves too)."""
    from plitzer.cli import main

    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "c"))
    a = _with_counts(make_source(tmp_path / "a", seed=4, files=1), tmp_path / "a-counted")
    b = _with_counts(make_source(tmp_path / "b", seed=6, files=1, base=1000), tmp_path / "b-counted")
    assert main(["index", str(a), "--dedupe", "url", "--length-column", "token_count", "--format", "csv"]) == 0
    assert "documents_duplicate" in capsys.readouterr().out
    assert main(["index", str(a), "--length-column", "token_count"]) != 0
    assert "--dedupe" in capsys.readouterr().err
    with plitzer.Loader({"a": {"path": str(a), "where": "id >= 0"}, "b": b}, dedupe="url", **CFG) as loader:
        want = [tokens_of(loader.next_batch()).copy() for _ in range(len(loader))]
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "c2"))
    import plitzer.selection.result as result

    decoded: list[object] = []
    real = result.stream_tokens
    monkeypatch.setattr(result, "stream_tokens", lambda ix, rg, run: decoded.append(ix) or real(ix, rg, run))
    sources = {"a": {"path": str(a), "where": "id >= 0", "length_column": "token_count"}, "b": str(b)}
    with plitzer.Loader(sources, dedupe="url", **CFG) as loader:
        got = [tokens_of(loader.next_batch()).copy() for _ in range(len(loader))]
        parts = {ix.source for ix in decoded}
    assert str(b) in " ".join(parts) and str(a) not in " ".join(parts)  # b's dropped rows decoded, a's counted
    for t, (x, y) in enumerate(zip(want, got, strict=True)):
        np.testing.assert_array_equal(x, y, err_msg=f"step {t}")


def test_the_duplicates_table_is_read_when_asked_not_held(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loader holds no per-dropped-row table: locate and the audit read it from the pass's cache entry when asked
    (the same table as one kept in memory where the cache cannot be written); gone from the cache, it is a clear
    error, not a wrong answer."""
    import shutil

    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "c"))
    ix = dd.dedupe_index(plitzer.index(data), "url")
    assert ix.dropped.held is None and "duplicates" not in vars(ix)  # nothing read yet
    table = ix.duplicates
    assert len(table) == int(ix.frame["rows_duplicate"].sum()) > 0 and table.shape[1] == 5
    unwritable = tmp_path / "ro"
    unwritable.mkdir()
    monkeypatch.setenv("PLITZER_CACHE", str(unwritable))
    monkeypatch.setattr(dd, "save_arrays", lambda *a, **k: None)  # the cache keeps nothing
    held = dd.dedupe_index(plitzer.index(data), "url")
    assert held.dropped.held is not None
    np.testing.assert_array_equal(held.duplicates, table)
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "c"))
    later = dd.dedupe_index(plitzer.index(data), "url")
    shutil.rmtree(tmp_path / "c")
    with pytest.raises(plitzer.DataError, match="no longer in the cache"):
        _ = later.duplicates
