"""``plitzer synth --text``'s data: the files it finds, their order, and passes over them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from planner.errors import ConfigError
from plitzer.tools import synth_text


def _tree(root: Path) -> None:
    # Names whose order as strings differs from their order as paths ("a-b" < "a.py" < "a/x").
    for rel in ["a/x.py", "a/b/c.md", "a.py", "a-b/y.txt", "a-b.py", "b.rst", "z/deep/er/q.py", "a/b.txt"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"text of {rel}\n" * (1 + len(rel)))
    (root / "empty.py").write_text("  \n")
    (root / "binary.txt").write_bytes(b"\xff\xfe\x00bad")
    (root / "link-dir").symlink_to(root / "a", target_is_directory=True)  # not descended, as rglob
    (root / "link-file.py").symlink_to(root / "b.rst")  # a file through a link: read, as before


def test_the_lazy_walk_is_sorted_rglob(tmp_path: Path) -> None:
    _tree(tmp_path)
    assert list(synth_text._walk(tmp_path)) == sorted(tmp_path.rglob("*"))
    found = list(synth_text.find_text([tmp_path]))
    suffixes = {".py", ".md", ".rst", ".txt"}
    keep = [p for p in sorted(tmp_path.rglob("*")) if p.is_file() and p.suffix in suffixes]
    want = [p.read_text() for p in keep if p.name not in {"empty.py", "binary.txt"}]
    assert found == want  # folders, blank files and undecodable ones dropped; a linked file read
    assert found.count((tmp_path / "b.rst").read_text()) == 2  # b.rst, and link-file.py through its link


def test_a_missing_root_finds_nothing(tmp_path: Path) -> None:
    assert list(synth_text.find_text([tmp_path / "absent"])) == []


@pytest.fixture
def tok() -> str:
    """mistral-common's SentencePiece model (the text extra's; the test extras have it)."""
    pytest.importorskip("sentencepiece")
    try:
        return synth_text.default_tokenizer()
    except ConfigError as e:
        pytest.skip(str(e))


def test_more_tokens_than_the_text_holds_takes_it_again_in_new_orders(tmp_path: Path, tok: str) -> None:
    src = tmp_path / "src"
    _tree(src)
    files, passes = synth_text.write_text(tmp_path / "out", 2_000, tokenizer=tok, roots=[src], progress=False)
    assert passes > 2
    docs = [tuple(d) for f in files for d in pq.read_table(f).column("input_ids").to_pylist()]
    assert sum(map(len, docs)) >= 2_000
    per_pass = len(list(synth_text.find_text([src])))
    first = docs[:per_pass]
    assert len(set(first)) == per_pass - 1  # each file once in a pass (b.rst twice: its link)
    second = docs[per_pass : 2 * per_pass]
    assert sorted(second) == sorted(first) and second != first  # the same documents, another order
    lengths = np.array([len(d) for d in docs[: per_pass * (passes - 1)]])
    assert (lengths > 1).all()  # each document is text then EOS


def test_no_text_is_a_clear_error(tmp_path: Path, tok: str) -> None:
    (tmp_path / "src").mkdir()
    with pytest.raises(ConfigError, match="no text files found"):
        synth_text.write_text(tmp_path / "out", 100, tokenizer=tok, roots=[tmp_path / "src"], progress=False)


def test_the_first_text_comes_before_the_rest_of_the_tree_is_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small ``synth --text`` reads a few files, not a stat of all of site-packages first."""
    _tree(tmp_path)
    listed: list[str] = []
    scandir = synth_text.os.scandir

    def counting(path: str | Path) -> object:
        listed.append(Path(path).name)
        return scandir(path)

    monkeypatch.setattr(synth_text.os, "scandir", counting)
    texts = synth_text.find_text([tmp_path])
    assert "text of a/b/c.md" in next(texts)  # path order: a/ first, a/b/ first in it
    assert listed == [tmp_path.name, "a", "b"]  # only the folders on the way to it so far
    assert len(list(texts)) == 8
    assert set(listed) == {tmp_path.name, "a", "b", "a-b", "z", "deep", "er"}
