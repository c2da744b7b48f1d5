"""``plitzer tokenize`` from and to every store: local disk, S3 (moto), GCS and Azure (emulators), from the Hub.

The same text files tokenized store to store give the same token columns as disk
to disk, the rerun skips every complete output wherever it lies, the command line
takes URLs with credentials from the usual variables, and the Ray engine reads and
writes object stores too.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import plitzer
from plitzer.cli import main
from plitzer.text.tokenize import tokenize
from tests.cloud_fixtures import CloudData, azure, gcs
from tests.conftest import tokens_of
from tests.hub_server import HubData, hub
from tests.s3_fixtures import S3Data, s3

__all__ = ["azure", "gcs", "hub", "s3"]  # the fixtures, imported for pytest

tokenizers = pytest.importorskip("tokenizers")

WORDS = ["the", "of", "and", "a", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are", "as"]


def _texts(seed: int, n: int) -> list[str | None]:
    rng = random.Random(seed)
    out: list[str | None] = []
    for i in range(n):
        if i % 17 == 5:
            out.append(None if i % 2 else "")
        else:
            out.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 60))))
    return out


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([t for t in _texts(0, 300) if t], trainer=trainer)
    path = tmp_path_factory.mktemp("tok") / "bpe.json"
    tok.save(str(path))
    return str(path)


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("text")
    (d / "sub").mkdir()
    for f, rel in enumerate(["a.parquet", "sub/b.parquet", "sub/c.parquet"]):
        pq.write_table(pa.table({"text": _texts(f + 1, 120)}), d / rel, row_group_size=40)
    return d


@pytest.fixture(scope="module")
def reference(text_dir: Path, model: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ref")
    tokenize(text_dir, out, tokenizer=model, jobs=1, progress=False)
    return out


def _tables(read: Iterator[tuple[str, bytes]]) -> dict[str, pa.Table]:
    import io

    return {rel: pq.read_table(io.BytesIO(data)) for rel, data in read}


def _local_files(d: Path) -> Iterator[tuple[str, bytes]]:
    for p in sorted(d.rglob("*.parquet")):
        yield p.relative_to(d).as_posix(), p.read_bytes()


class _Remote:
    """A store's bucket as tokenize sees it: a root URL, its options, its files."""

    def __init__(self, root: str, options: dict[str, Any], fs: Any) -> None:
        self.root, self.opts, self.fs = root, options, fs

    def upload(self, local: Path, prefix: str) -> str:
        for rel, data in _local_files(local):
            self.fs.pipe_file(f"{self.root}/{prefix}/{rel}", data)
        return f"{self.root}/{prefix}"

    def files(self, url: str) -> Iterator[tuple[str, bytes]]:
        base = self.fs._strip_protocol(url).rstrip("/")
        for path in sorted(self.fs.find(url)):
            if path.endswith(".parquet"):
                yield path[len(base) + 1 :], self.fs.cat_file(path)


def _remotes(s3: S3Data, gcs: CloudData, azure: CloudData) -> dict[str, _Remote]:
    import s3fs

    from tests.s3_fixtures import KEY, REGION, SECRET

    s3_fs = s3fs.S3FileSystem(
        key=KEY,
        secret=SECRET,
        client_kwargs={"endpoint_url": s3.server.endpoint, "region_name": REGION},
        skip_instance_cache=True,
    )
    return {
        "s3": _Remote(f"s3://{s3.bucket}", s3.options(), s3_fs),
        "gcs": _Remote(f"gs://{gcs.bucket}", gcs.options(), gcs.fs()),
        "azure": _Remote(f"az://{azure.bucket}", azure.options(), azure.fs()),
    }


_run = iter(range(1_000_000))


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("src", "dst"), [("s3", "gcs"), ("gcs", "azure"), ("azure", "s3"), ("local", "azure")])
def test_tokenize_between_stores(
    s3: S3Data,
    gcs: CloudData,
    azure: CloudData,
    text_dir: Path,
    model: str,
    reference: Path,
    src: str,
    dst: str,
    tmp_path: Path,
) -> None:
    stores = _remotes(s3, gcs, azure)
    n = next(_run)
    src_url = str(text_dir) if src == "local" else stores[src].upload(text_dir, f"text-{n}")
    src_opts = None if src == "local" else stores[src].opts
    dst_url = f"{stores[dst].root}/tok-{n}"
    r = tokenize(
        src_url,
        dst_url,
        tokenizer=model,
        jobs=2 if src == "s3" else 1,  # a process pool once: workers reopen the storages
        progress=False,
        storage_options=src_opts,
        dst_storage_options=stores[dst].opts,
    )
    assert (r.written, r.skipped) == (3, 0)
    want = _tables(_local_files(reference))
    got = _tables(stores[dst].files(dst_url))
    assert sorted(got) == sorted(want) == ["a.parquet", "sub/b.parquet", "sub/c.parquet"]
    for rel, table in want.items():
        assert got[rel]["input_ids"].equals(table["input_ids"]), rel
    assert r.tokens == sum(sum(len(x) for x in t["input_ids"].to_pylist()) for t in want.values())
    # The rerun sees every output complete, wherever it lies.
    again = tokenize(
        src_url,
        dst_url,
        tokenizer=model,
        jobs=1,
        progress=False,
        storage_options=src_opts,
        dst_storage_options=stores[dst].opts,
    )
    assert (again.written, again.skipped) == (0, 3)
    # And the loader reads the tokenized dataset where it was written.
    with (
        plitzer.Loader(dst_url, storage_options=stores[dst].opts, lanes=4, window=2, seq_len=64) as remote,
        plitzer.Loader(reference, lanes=4, window=2, seq_len=64) as disk,
    ):
        for _ in range(5):
            assert tokens_of(remote.next_batch()).tobytes() == tokens_of(disk.next_batch()).tobytes()


@pytest.mark.timeout(120)
def test_tokenize_and_text_sources_read_the_hub(
    hub: HubData, text_dir: Path, model: str, reference: Path, tmp_path: Path
) -> None:
    """Text on the Hub: tokenized to disk as from disk, and read by the loader with a tokenizer as from disk."""
    from tests.hub_server import files_of

    hub.server.commit("plitzer/text", files_of(text_dir, "text"))
    url = "hf://datasets/plitzer/text/text"
    r = tokenize(url, tmp_path / "tok", tokenizer=model, jobs=1, progress=False, storage_options=hub.options())
    assert (r.written, r.skipped) == (3, 0)
    want, got = _tables(_local_files(reference)), _tables(_local_files(tmp_path / "tok"))
    assert sorted(got) == sorted(want)
    for rel, table in want.items():
        assert got[rel]["input_ids"].equals(table["input_ids"]), rel
    again = tokenize(url, tmp_path / "tok", tokenizer=model, jobs=1, progress=False, storage_options=hub.options())
    assert (again.written, again.skipped) == (0, 3)
    settings = {"text_column": "text", "tokenizer": model, "lanes": 4, "window": 2, "seq_len": 64}
    with (
        plitzer.Loader(url, storage_options=hub.options(), **settings) as remote,
        plitzer.Loader(text_dir, **settings) as disk,
    ):
        for _ in range(5):
            assert tokens_of(remote.next_batch()).tobytes() == tokens_of(disk.next_batch()).tobytes()


@pytest.mark.timeout(120)
def test_tokenize_command_line_with_urls_and_variables(
    s3: S3Data,
    azure: CloudData,
    text_dir: Path,
    model: str,
    reference: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tests.s3_fixtures import KEY, REGION, SECRET

    stores = _remotes(s3, azure, azure)
    n = next(_run)
    src_url = stores["s3"].upload(text_dir, f"cli-{n}")
    dst_url = f"az://{azure.bucket}/cli-{n}"
    for k, v in {
        "AWS_ENDPOINT_URL": s3.server.endpoint,
        "AWS_ACCESS_KEY_ID": KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": REGION,
        "AZURE_STORAGE_CONNECTION_STRING": azure.server.connection_string,  # type: ignore[union-attr]
    }.items():
        monkeypatch.setenv(k, v)
    assert main(["tokenize", src_url, dst_url, "--tokenizer", model, "--jobs", "1"]) == 0
    assert "wrote 3 files (0 already complete)" in capsys.readouterr().out
    got = _tables(stores["azure"].files(dst_url))
    for rel, table in _tables(_local_files(reference)).items():
        assert got[rel]["input_ids"].equals(table["input_ids"]), rel


@pytest.fixture(name="local_ray")
def _local_ray() -> Any:
    """The process's one Ray runtime (tests/share_fixtures.py)."""
    from tests.share_fixtures import local_ray

    return local_ray()


@pytest.mark.ray
@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_tokenize_on_ray_between_stores(
    local_ray: Any, s3: S3Data, gcs: CloudData, azure: CloudData, text_dir: Path, model: str, reference: Path
) -> None:
    stores = _remotes(s3, gcs, azure)
    n = next(_run)
    src_url = stores["gcs"].upload(text_dir, f"ray-{n}")
    dst_url = f"s3://{s3.bucket}/ray-tok-{n}"
    r = tokenize(
        src_url,
        dst_url,
        tokenizer=model,
        engine="ray",
        progress=False,
        storage_options=gcs.options(),
        dst_storage_options=s3.options(),
    )
    assert r.written == 3
    got = _tables(stores["s3"].files(dst_url))
    for rel, table in _tables(_local_files(reference)).items():
        assert got[rel]["input_ids"].equals(table["input_ids"]), rel
