"""Text in (SPEC section 9): the loader on text gives the batches of the same data tokenized first.

Tokenizers: a real SentencePiece model shipped by mistral-common (offline, from the
installed package), a tiny ``tokenizers`` BPE trained here (as a JSON file and as a
``tokenizers.Tokenizer``), and a callable. Text: generated, plus documentation
files of the installed packages (a small sample in a fixed order).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import plitzer
from plitzer.errors import CheckpointError, ConfigError
from plitzer.text.source import load_tokenizer, text_index
from plitzer.text.tokenize import tokenize
from tests.conftest import tokens_of
from tests.share_fixtures import utf8_bytes

tokenizers = pytest.importorskip("tokenizers")
spm = pytest.importorskip("sentencepiece")

SETTINGS = {"lanes": 4, "window": 4, "seq_len": 48}


def _spm_model() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("mistral_common")
    if spec is None or not spec.submodule_search_locations:
        return None
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    models = sorted(data.glob("*.model*")) if data.is_dir() else []
    return models[-1] if models else None


def _real_texts(n: int = 60) -> list[str]:
    """Documentation files of installed packages: a small sample, in a fixed order."""
    root = Path(sysconfig.get_paths()["purelib"])
    found = []
    for p in sorted(root.glob("*/*")):
        if p.suffix in (".md", ".txt", ".rst") or p.name.startswith("LICENSE"):
            try:
                if p.is_file() and p.stat().st_size < 30_000:
                    found.append(p.read_text(encoding="utf-8", errors="replace"))
            except OSError:
                continue
        if len(found) >= n:
            break
    return found


def _generated(seed: int, n: int) -> list[str | None]:
    rng = random.Random(seed)
    words = ["the", "loader", "packs", "tokens", "déjà", "vu", "東京", "🙂", "x", "\n", "  ", "Ω", "1234"]
    docs: list[str | None] = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 40))) for _ in range(n)]
    docs[3] = None
    docs[4] = ""
    return docs


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("text")
    real = _real_texts()
    for f in range(3):
        docs = _generated(f, 150) + real[f::3]
        sub = d / f"part{f % 2}"
        sub.mkdir(exist_ok=True)
        pq.write_table(pa.table({"id": list(range(len(docs))), "text": docs}), sub / f"{f}.parquet", row_group_size=20)
    return d


@pytest.fixture(scope="module")
def bpe() -> Any:
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [t for t in _generated(99, 400) if t] + _real_texts(20)
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


def _kinds(bpe: Any, tmp: Path) -> dict[str, Any]:
    path = tmp / "bpe.json"
    bpe.save(str(path))
    kinds: dict[str, Any] = {
        "tokenizers-json": str(path),
        "tokenizers-object": bpe,
        "callable": load_tokenizer(utf8_bytes, name="bytes-v1", eos_id=256, bos_id=257, vocab_size=258),
    }
    model = _spm_model()
    if model is not None:
        kinds["sentencepiece"] = str(model)
    return kinds


KINDS = ["sentencepiece", "tokenizers-json", "tokenizers-object", "callable"]


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest, bpe: Any, tmp_path: Path) -> tuple[str, Any]:
    kinds = _kinds(bpe, tmp_path)
    if request.param not in kinds:
        pytest.skip("mistral-common is not installed: no SentencePiece model at hand (pip install mistral-common)")
    return request.param, kinds[request.param]


def _plain_loop(src: Path, dst: Path, tok: Any, *, add_eos: bool = True, add_bos: bool = False) -> Path:
    """The reference: each document's ids by calling the tokenizer, row groups kept."""
    t = load_tokenizer(tok)
    for p in sorted(src.rglob("*.parquet")):
        pf = pq.ParquetFile(p)
        out = dst / p.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        dtype = pa.uint32() if t.dtype == "uint32" else pa.int32()
        with pq.ParquetWriter(out, pa.schema([("input_ids", pa.list_(dtype))])) as w:
            for g in range(pf.num_row_groups):
                col = pf.read_row_group(g, columns=["text"]).column(0).combine_chunks()
                if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
                    texts = [None if b is None else b.decode("utf-8", "replace") for b in col.to_pylist()]
                else:
                    try:
                        texts = col.to_pylist()
                    except UnicodeDecodeError:
                        texts = [
                            None if b is None else b.decode("utf-8", "replace")
                            for b in col.view(pa.binary()).to_pylist()
                        ]
                rows = []
                for text in texts:
                    ids = t.encode([text])[0] if text else []
                    rows.append(([t.bos_id] if add_bos else []) + list(ids) + ([t.eos_id] if add_eos else []))
                w.write_table(
                    pa.table({"input_ids": pa.array(rows, pa.list_(dtype))}), row_group_size=max(1, len(rows))
                )
    return dst


def _batches(loader: plitzer.Loader, n: int) -> list[np.ndarray]:
    return [np.from_dlpack(loader.next_batch().tokens).copy() for _ in range(n)]


def _global(make: Callable[..., plitzer.Loader], world: int, n: int) -> list[np.ndarray]:
    ranks = [make(rank=r, world=world) for r in range(world)]
    try:
        parts = [_batches(r, n) for r in ranks]
    finally:
        for r in ranks:
            r.close()
    return [np.concatenate([p[i] for p in parts]) for i in range(n)]


def test_text_equals_pretokenized(kind: tuple[str, Any], text_dir: Path, tmp_path: Path) -> None:
    name, tok = kind
    plain = _plain_loop(text_dir, tmp_path / "plain", tok)
    tokenize(text_dir, tmp_path / "tok", tokenizer=tok, jobs=1, progress=False)
    with plitzer.Loader(plain, **SETTINGS) as ref_loader:
        steps = len(ref_loader) + 3  # into the second epoch
        ref = _batches(ref_loader, steps)
    with plitzer.Loader(tmp_path / "tok", **SETTINGS) as converted:
        assert all(np.array_equal(a, b) for a, b in zip(_batches(converted, steps), ref, strict=True)), name
    for world in (1, 2):
        got = _global(lambda **kw: plitzer.Loader(text_dir, tokenizer=tok, **SETTINGS, **kw), world, steps)
        assert all(np.array_equal(a, b) for a, b in zip(got, ref, strict=True)), (name, world)

    # Resume at random steps, across world sizes.
    rng = random.Random(hash(name) & 0xFFFF)
    for at in sorted(rng.sample(range(1, steps - 2), 2)):
        ranks = [plitzer.Loader(text_dir, tokenizer=tok, **SETTINGS, rank=r, world=2) for r in range(2)]
        for r in ranks:
            _batches(r, at)
        state = plitzer.merge([r.checkpoint() for r in ranks])
        for r in ranks:
            r.close()
        with plitzer.Loader(text_dir, tokenizer=tok, **SETTINGS) as again:
            again.resume(state)
            rest = _batches(again, steps - at)
        assert all(np.array_equal(a, b) for a, b in zip(rest, ref[at:], strict=True)), (name, at)


def test_checkpoint_of_another_tokenizer_or_policy_is_refused(bpe: Any, text_dir: Path, tmp_path: Path) -> None:
    kinds = _kinds(bpe, tmp_path)
    with plitzer.Loader(text_dir, tokenizer=kinds["tokenizers-json"], **SETTINGS) as a:
        a.next_batch()
        state = a.checkpoint()
    with plitzer.Loader(text_dir, tokenizer=kinds["callable"], **SETTINGS) as b, pytest.raises(CheckpointError) as e:
        b.resume(state)
    assert "tokenizer: checkpoint 'tokenizers:" in str(e.value)
    with (
        plitzer.Loader(text_dir, tokenizer=kinds["tokenizers-json"], add_eos=False, **SETTINGS) as c,
        pytest.raises(CheckpointError, match=r"add_eos: checkpoint True, loader False"),
    ):
        c.resume(state)
    with (
        plitzer.Loader(text_dir, tokenizer=kinds["tokenizers-json"], add_bos=True, **SETTINGS) as c,
        pytest.raises(CheckpointError, match=r"add_bos: checkpoint False, loader True"),
    ):
        c.resume(state)
    # The same tokenizer as an object has the same identity: it resumes.
    with plitzer.Loader(text_dir, tokenizer=kinds["tokenizers-object"], **SETTINGS) as d:
        d.resume(state)
        assert d.step == 1


def test_empty_null_long_and_invalid_utf8(tmp_path: Path) -> None:
    tok = load_tokenizer(utf8_bytes, name="bytes-v1", eos_id=256, bos_id=257, vocab_size=258)
    long_doc = "long " * 400  # 2000 tokens: more than a whole window of this dataset
    raw = [b"ok", b"\xed\xa0\x80 lone surrogate", None, b"", b"\xff\xfe bad", long_doc.encode(), b"caf\xc3\xa9"]
    d = tmp_path / "text"
    d.mkdir()
    # A binary column, and a string column holding invalid UTF-8 as other tools can write it.
    pq.write_table(pa.table({"text": pa.array(raw * 3, pa.binary())}), d / "a.parquet", row_group_size=3)
    pq.write_table(
        pa.table({"text": pa.array(raw * 3, pa.binary()).view(pa.string())}), d / "b.parquet", row_group_size=4
    )
    ix = text_index(d, tokenizer=tok, add_bos=True)
    arr = ix.read_tokens(0)
    assert arr.to_pylist()[:3] == [
        [257, *b"ok", 256],
        [257, *"\ufffd\ufffd\ufffd lone surrogate".encode(), 256],
        [257, 256],
    ]
    no_specials = text_index(d, tokenizer=tok, add_eos=False)
    assert int(no_specials.frame["empty_docs"].sum()) == 2 * 3 * 2  # null and "" are empty documents
    assert no_specials.read_tokens(1).to_pylist()[0] == []
    settings = {"lanes": 2, "window": 2, "seq_len": 32}
    ref_dir = _plain_loop(d, tmp_path / "plain", tok, add_bos=True)
    with plitzer.Loader(ref_dir, **settings) as ref, plitzer.Loader(d, tokenizer=tok, add_bos=True, **settings) as got:
        n = len(ref) + 2
        assert all(np.array_equal(a, b) for a, b in zip(_batches(got, n), _batches(ref, n), strict=True))


def test_uint32_vocabulary(tmp_path: Path) -> None:
    big = load_tokenizer(
        lambda texts: [[3_000_000_000 + len(w) for w in t.split()] for t in texts],
        name="big-v1",
        eos_id=4_000_000_000,
        vocab_size=2**32,
    )
    d = tmp_path / "text"
    d.mkdir()
    pq.write_table(pa.table({"text": ["a bb ccc"] * 50}), d / "a.parquet", row_group_size=10)
    tokenize(d, tmp_path / "tok", tokenizer=big, jobs=1, progress=False)
    assert pq.read_schema(tmp_path / "tok" / "a.parquet").field("input_ids").type == pa.list_(pa.uint32())
    with (
        plitzer.Loader(d, tokenizer=big, lanes=2, window=2, seq_len=8) as a,
        plitzer.Loader(tmp_path / "tok", lanes=2, window=2, seq_len=8) as b,
    ):
        x, y = a.next_batch(), b.next_batch()
        assert np.from_dlpack(x.tokens).dtype == np.uint32
        assert np.array_equal(np.from_dlpack(x.tokens), np.from_dlpack(y.tokens))


def test_tokenizer_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="callable"):
        load_tokenizer(utf8_bytes)
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    with pytest.raises(ConfigError, match="not a Hugging Face tokenizers JSON"):
        load_tokenizer(str(bad))
    nothing = load_tokenizer(utf8_bytes, name="bytes-v1")
    d = tmp_path / "t"
    d.mkdir()
    pq.write_table(pa.table({"body": ["x"]}), d / "a.parquet")
    with pytest.raises(ConfigError, match="EOS"):
        text_index(d, tokenizer=nothing, text_column="body")
    with pytest.raises(ConfigError, match="no text column 'text'"):
        text_index(d, tokenizer=nothing, add_eos=False)


def test_plan_tables_on_text(bpe: Any, text_dir: Path) -> None:
    import planner

    ix = text_index(text_dir, tokenizer=bpe)
    plan = planner.plan(ix, lanes=4, window=4, world=2)
    rg = plan.row_groups(0)
    assert int(rg["tokens"].sum()) == ix.tokens
    assert plan.sql("select count(*) n from reads", epochs=[0])["n"][0] >= ix.row_groups


def _write_many(d: Path, files: int, docs: int) -> None:
    real = _real_texts()
    for f in range(files):
        texts = [t for t in _generated(f, docs) if t] + real
        pq.write_table(pa.table({"text": texts}), d / f"{f:02d}.parquet", row_group_size=50)


def _tree(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_a_worker_tokenizes_each_run_with_its_own_tokenizer(tmp_path: Path) -> None:
    """A Ray worker process serves run after run: the second run's tokenizer is used, not the first's kept."""
    import plitzer.text.tokenize as tk

    pq.write_table(pa.table({"text": ["ab", "cde"]}), tmp_path / "a.parquet")
    got = []
    for n, value in enumerate((7, 9)):
        tok = load_tokenizer(lambda texts, v=value: [[v] * len(t) for t in texts], name=f"fill-{value}", eos_id=0)
        dst = tmp_path / f"out{n}.parquet"
        job = tk._Job(str(tmp_path / "a.parquet"), str(dst), "a.parquet", "text", "ids", False, True, 0, 1, version="0")
        tk._ray_job(tok.identity, tok.spec, job)  # in this process, as a Ray worker runs it
        got.append(pq.read_table(dst)["ids"].to_pylist())
    assert got == [[[7, 7, 0], [7, 7, 7, 0]], [[9, 9, 0], [9, 9, 9, 0]]]


def test_tokenize_killed_and_rerun(bpe: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    _write_many(src, files=8, docs=300)
    model = tmp_path / "bpe.json"
    bpe.save(str(model))
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    cmd = [sys.executable, "-m", "plitzer", "tokenize", str(src), "", "--tokenizer", str(model), "--jobs", "1"]
    subprocess.run([*cmd[:5], str(whole), *cmd[6:]], check=True, capture_output=True)
    p = subprocess.Popen([*cmd[:5], str(killed), *cmd[6:]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and p.poll() is None:
        if killed.exists() and any(killed.glob("*.parquet")):
            break
        time.sleep(0.005)
    assert p.poll() is None, "the run ended before it could be killed"
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert 1 <= len(list(killed.glob("*.parquet"))) < 8
    done = subprocess.run([*cmd[:5], str(killed), *cmd[6:]], check=True, capture_output=True, text=True)
    assert "already complete" in done.stdout
    got = {k: v for k, v in _tree(killed).items() if not k.startswith(".")}
    assert got == _tree(whole)
    # A third run writes nothing.
    again = subprocess.run([*cmd[:5], str(killed), *cmd[6:]], check=True, capture_output=True, text=True)
    assert again.stdout.startswith("wrote 0 files (8 already complete)")


@pytest.fixture(name="local_ray")
def _local_ray() -> Any:
    """The process's one Ray runtime (tests/share_fixtures.py)."""
    from tests.share_fixtures import local_ray

    return local_ray()


@pytest.mark.ray
@pytest.mark.e2e
@pytest.mark.slow
def test_tokenize_on_ray(local_ray: Any, bpe: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    _write_many(src / "sub", files=3, docs=100)
    model = tmp_path / "bpe.json"
    bpe.save(str(model))
    a = tokenize(src, tmp_path / "local", tokenizer=str(model), jobs=1, progress=False)
    b = tokenize(src, tmp_path / "ray", tokenizer=str(model), engine="ray", progress=False)
    assert (a.written, b.written, a.tokens) == (3, 3, b.tokens)
    assert _tree(tmp_path / "local") == _tree(tmp_path / "ray")
    assert os.path.exists(tmp_path / "ray" / "sub" / "00.parquet")


def test_synth_text_writes_real_text_shards(tmp_path: Path) -> None:
    """plitzer synth --text: real text under a folder, a real tokenizer, large row groups,
    every document ending with EOS, and the loader reads it."""
    pytest.importorskip("mistral_common")
    from plitzer.tools.synth_text import default_tokenizer, write_text

    src = Path(plitzer.__file__).parent  # real text: plitzer's own sources
    files, passes = write_text(tmp_path / "t", 30_000, roots=[src], row_group_tokens=8_000, progress=False)
    tok = load_tokenizer(default_tokenizer())
    table = pq.read_table(files)
    lengths = [len(x) for x in table["input_ids"].to_pylist()]
    assert sum(lengths) >= 30_000 and passes >= 1
    assert all(doc[-1] == tok.eos_id for doc in table["input_ids"].to_pylist())
    md = pq.read_metadata(files[0])
    assert md.num_row_groups >= 1 and md.row_group(0).num_rows >= 1
    assert max(lengths) > 20 * min(lengths)  # lengths spread widely, as real documents do
    with plitzer.Loader(tmp_path / "t", lanes=4, window=2, seq_len=256) as ld:
        assert tokens_of(ld.next_batch()).shape == (4, 256)
