"""The loaders the benchmark compares, one :class:`Runner` each, behind one small interface.

A runner opens its loader on the Parquet files (``open(state)``: an iterator of
batches as torch tensors, resumed from ``state`` when given), saves the loader's
state with the loader's own mechanism (``save``), and, where the loader needs its
own copy of the data, makes it (``convert``). ``plitzer.bench._run_one`` runs one
runner in one mode per process; the peers (Mosaic Streaming, litdata, Grain, HF
``datasets``, ``torchdata``) are imported lazily, only inside their runner.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from plitzer.state.settings import LoaderSettings

Item = tuple[Any, Any]  # (tokens tensor, document offsets tensor or None)


def parquet_files(data: str) -> list[str]:
    p = Path(data)
    if p.is_file():
        return [str(p)]
    return [str(f) for f in sorted(p.rglob("*.parquet"), key=lambda f: f.relative_to(p).as_posix().encode())]


def token_column(files: Sequence[str], column: str | None) -> tuple[str, str]:
    """The token column's name and value type (int32 or uint32)."""
    schema = pq.read_schema(files[0])
    names = [column] if column else schema.names
    for name in names:
        t = schema.field(name).type
        if (pa.types.is_list(t) or pa.types.is_large_list(t)) and t.value_type in (pa.int32(), pa.uint32()):
            return name, str(t.value_type.to_pandas_dtype().__name__)
    msg = f"no list<int32|uint32> token column in {files[0]} (columns: {schema.names})"
    raise SystemExit(msg)


def dataset_rows(files: Sequence[str]) -> int:
    return sum(pq.read_metadata(f).num_rows for f in files)


def collate_docs(items: Sequence[Any]) -> Item:
    """A batch of documents: their tokens concatenated, plus offsets (cu_seqlens)."""
    import torch

    arrays = [np.asarray(next(iter(it.values())) if isinstance(it, dict) else it) for it in items]
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    flat = np.concatenate(arrays) if arrays else np.empty(0, dtype=np.int32)
    return torch.from_numpy(flat), torch.from_numpy(offsets)


def collate_dict(items: Sequence[Any]) -> dict[str, Any]:
    """``collate_docs`` as a dict whose first value has one entry per document.

    Mosaic's ``StreamingDataLoader`` counts the samples it yields (for its state)
    as the length of a batch's first value.
    """
    import torch

    tokens, offsets = collate_docs(items)
    return {"lengths": torch.diff(offsets), "tokens": tokens, "offsets": offsets}


def collate_arrow(table: Any) -> Item:
    """A batch that is an Arrow table of documents (or one row of a list of documents)."""
    import torch

    col = table.column(0).combine_chunks() if isinstance(table, pa.Table) else table
    if pa.types.is_list(col.type.value_type) or pa.types.is_large_list(col.type.value_type):
        col = col.flatten()
    offsets = col.offsets.to_numpy().astype(np.int64)
    flat = col.values.to_numpy()[offsets[0] : offsets[-1]]
    return torch.from_numpy(flat.copy()), torch.from_numpy(offsets - offsets[0])


class ArrowBatches:
    """A map-style dataset whose item is a whole batch: ``ds[indices]`` in Arrow format.

    This is ``datasets``' fast path (one ``take`` on the memory-mapped table per
    batch), used with a ``BatchSampler`` and ``batch_size=None``.
    """

    def __init__(self, ds: Any) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, indices: list[int]) -> Item:
        return collate_arrow(self.ds[indices])


class Runner:
    """A loader under test: open (optionally from a state), iterate, save."""

    docs = True  # items are documents (False: fixed-length packed rows)
    row_digests = False  # packed rows: compare streams row by row (False: whole batches)
    padded: int | None = None  # padding tokens delivered so far, where the loader pads

    modules: tuple[str, ...] = ("torch",)

    def __init__(self, args: argparse.Namespace) -> None:
        for name in self.modules:  # imported before anything is timed
            importlib.import_module(name)
        self.args = args
        self.files = parquet_files(args.data)
        self.column, self.dtype = token_column(self.files, args.column)
        self.rows = dataset_rows(self.files)
        self.work = Path(args.work)

    def convert(self) -> int:
        """Make the loader's own copy; return its bytes."""
        return 0

    def batches_per_epoch(self) -> int:
        return int(-(-self.rows // self.args.batch))

    def open(self, state: bytes | None) -> Iterator[Item]:
        raise NotImplementedError

    def save(self) -> bytes:
        raise NotImplementedError


class PyarrowRunner(Runner):
    """The ceiling: decode the token column of every file with pyarrow's threads."""

    modules = ("torch", "pyarrow.dataset")  # pq.read_table imports it (and pandas) on first use

    def batches_per_epoch(self) -> int:
        return len(self.files)

    def open(self, state: bytes | None) -> Iterator[Item]:
        pa.set_cpu_count(self.args.workers)
        pa.set_io_thread_count(self.args.workers)

        def gen() -> Iterator[Item]:
            # One item per file, counted, not copied: (tokens, documents).
            for f in self.files:
                col = pq.read_table(f, columns=[self.column], use_threads=True).column(0)
                yield sum(len(c.values) for c in col.chunks), len(col)

        return gen()


class PyarrowRowGroupsRunner(PyarrowRunner):
    """The other ceiling: every row group's token column on ``--workers`` threads.

    ``ParquetFile(f, metadata=cached footer, pre_buffer=True).read_row_group(g,
    columns=[col], use_threads=False)``, as a loader reading row groups does; on some
    data this decodes faster than ``read_table`` per file, so the harness takes the
    faster of the two as its reference (a ratio against a slower decode flatters).
    """

    def batches_per_epoch(self) -> int:
        return sum(pq.read_metadata(f).num_row_groups for f in self.files)

    def open(self, state: bytes | None) -> Iterator[Item]:
        from concurrent.futures import ThreadPoolExecutor

        footers = [pq.read_metadata(f) for f in self.files]
        groups = [(i, g) for i, md in enumerate(footers) for g in range(md.num_row_groups)]

        def decode(ig: tuple[int, int]) -> tuple[int, int]:
            i, g = ig
            pf = pq.ParquetFile(self.files[i], metadata=footers[i], pre_buffer=True)
            col = pf.read_row_group(g, columns=[self.column], use_threads=False).column(0)
            return sum(len(c.values) for c in col.chunks), len(col)

        def gen() -> Iterator[Item]:
            with ThreadPoolExecutor(self.args.workers) as pool:
                yield from pool.map(decode, groups)

        return gen()


class PlitzerRunner(Runner):
    docs = False
    modules = ("torch", "plitzer")

    def batches_per_epoch(self) -> int:
        """Batches in the loader's current epoch (after ``open``)."""
        return self.epoch_batches

    def open(self, state: bytes | None) -> Iterator[Item]:
        import torch

        import plitzer

        a = self.args
        self.loader = plitzer.Loader.from_settings(a.data, loader_settings(a))
        if state is not None:
            self.loader.resume(state)
        self.epoch_batches = self.loader.step + len(self.loader)

        def gen() -> Iterator[Item]:
            for batch in self.loader:
                yield torch.from_numpy(np.from_dlpack(batch.tokens)), None

        return gen()

    def save(self) -> bytes:
        return self.loader.checkpoint()

    def peak_bytes(self) -> int:
        return self.loader.peak_bytes


def loader_settings(args: argparse.Namespace) -> LoaderSettings:
    """The loader's settings of the harness's options: those named as run parameters, ``--workers`` its threads.

    ``--world`` is the window mode's (rank 0's share of a plan), not the loader's: it reads every lane.
    """
    from planner.parameters import PARAMETERS
    from plitzer.state.settings import LoaderSettings

    given = {p.name: getattr(args, p.name) for p in PARAMETERS if p.name != "world" and hasattr(args, p.name)}
    return LoaderSettings.of(caller="plitzer.bench.runners.loader_settings", **given, threads=args.workers)


class MosaicRunner(Runner):
    """MosaicML Streaming: MDS shards (zstd) from ``MDSWriter``, ``StreamingDataset`` + ``StreamingDataLoader``."""

    modules = ("torch", "streaming", "streaming.base.util")

    @property
    def mds(self) -> Path:
        return self.work / "mosaic-mds"

    def convert(self) -> int:
        streaming = importlib.import_module("streaming")
        shutil.rmtree(self.mds, ignore_errors=True)
        columns = {self.column: f"ndarray:{self.dtype}"}
        with streaming.MDSWriter(out=str(self.mds), columns=columns, compression="zstd") as writer:
            for f in self.files:
                pf = pq.ParquetFile(f)
                for g in range(pf.num_row_groups):
                    col = pf.read_row_group(g, columns=[self.column]).column(0).combine_chunks()
                    offsets = col.offsets.to_numpy()
                    values = col.values.to_numpy()
                    for i in range(len(offsets) - 1):
                        writer.write({self.column: values[offsets[i] : offsets[i + 1]]})
        return dir_bytes(self.mds)

    def open(self, state: bytes | None) -> Iterator[Item]:
        streaming = importlib.import_module("streaming")
        util = importlib.import_module("streaming.base.util")
        util.clean_stale_shared_memory()
        a = self.args
        ds = streaming.StreamingDataset(
            local=str(self.mds), shuffle=True, shuffle_seed=a.seed, batch_size=a.batch, num_canonical_nodes=1
        )
        if state is not None:
            ds.load_state_dict(json.loads(state))
        self.dl = streaming.StreamingDataLoader(ds, batch_size=a.batch, num_workers=a.workers, collate_fn=collate_dict)
        return ((b["tokens"], b["offsets"]) for b in self.dl)

    def save(self) -> bytes:
        return json.dumps(self.dl.state_dict()).encode()


def _tokens_of_row_group(item: tuple[str, int], column: str) -> Iterator[Any]:
    """litdata's ``optimize`` function: the documents of one row group, as int32 tensors."""
    import torch

    path, group = item
    col = pq.ParquetFile(path).read_row_group(group, columns=[column]).column(0).combine_chunks()
    offsets = col.offsets.to_numpy()
    values = col.values.to_numpy(zero_copy_only=False)
    for i in range(len(offsets) - 1):
        yield torch.from_numpy(np.array(values[offsets[i] : offsets[i + 1]], dtype=np.int32))


class LitdataRunner(Runner):
    """litdata: ``optimize`` the token column into its chunks, then ``StreamingDataset`` with
    ``TokensLoader(block_size=seq_len + 1)`` (as its README recommends), ``shuffle=True``, and
    ``StreamingDataLoader`` (batches of ``lanes`` blocks, ``--workers`` workers)."""

    docs = False
    row_digests = True
    modules = ("torch", "litdata")

    @property
    def out(self) -> Path:
        return self.work / "litdata-chunks"

    @property
    def block(self) -> int:
        return int(self.args.seq_len) + 1

    def convert(self) -> int:
        import functools

        litdata = importlib.import_module("litdata")
        shutil.rmtree(self.out, ignore_errors=True)
        inputs = [(f, g) for f in self.files for g in range(pq.ParquetFile(f).num_row_groups)]
        litdata.optimize(
            fn=functools.partial(_tokens_of_row_group, column=self.column),
            inputs=inputs,
            output_dir=str(self.out),
            # The README's chunk size for TokensLoader: a whole number of blocks per chunk.
            chunk_size=self.block * 8012,
            item_loader=litdata.TokensLoader(),
            num_workers=self.args.workers,
            # With the default start method ("spawn" here) optimize wrote an index.json with
            # no chunks and raised nothing (verbose=False); "fork" wrote them.
            start_method=None,
            verbose=False,
            mode="overwrite",
        )
        index = json.loads((self.out / "index.json").read_text())
        if not index.get("chunks"):
            msg = f"litdata.optimize wrote no chunks into {self.out}"
            raise SystemExit(msg)
        return dir_bytes(self.out)

    def _dataset(self) -> Any:
        litdata = importlib.import_module("litdata")
        return litdata.StreamingDataset(
            input_dir=str(self.out),
            item_loader=litdata.TokensLoader(block_size=self.block),
            shuffle=True,
            drop_last=True,
            seed=self.args.seed,
        )

    def kept_tokens(self) -> tuple[int, int]:
        """(tokens in the chunks, tokens in whole blocks): each chunk's tail shorter than a block is never read."""
        index = json.loads((self.out / "index.json").read_text())
        dims = [int(c["dim"]) for c in index["chunks"]]
        return sum(dims), sum(d // self.block * self.block for d in dims)

    def batches_per_epoch(self) -> int:
        return len(self.dl) if hasattr(self, "dl") else int(-(-len(self._dataset()) // self.args.lanes))

    def open(self, state: bytes | None) -> Iterator[Item]:
        litdata = importlib.import_module("litdata")
        a = self.args
        self.dl = litdata.StreamingDataLoader(self._dataset(), batch_size=a.lanes, num_workers=a.workers)
        if state is not None:
            self.dl.load_state_dict(_load_state(state))
        return ((b, None) for b in self.dl)

    def save(self) -> bytes:
        return _dump_state(self.dl.state_dict())


class GrainRunner(Runner):
    """Grain: ``ParquetIterDataset`` over the files as they are (their order permuted by the
    seed), a window shuffle of documents, ``ConcatThenSplitIterDataset`` packing to ``seq_len``,
    batches of ``lanes`` rows, a thread prefetch; resumed from the iterator's ``get_state()``.

    ``ParquetIterDataset`` takes no column selection: it reads every column of each row group
    and turns each into NumPy (``to_numpy``) before the first ``map`` can drop them.
    Concat-then-split, not first-fit: it is the one of Grain's packers that pads nothing and
    cuts documents at sequence edges, as plitzer does, so both deliver every token once.
    """

    docs = False
    row_digests = True
    modules = ("torch", "grain", "pyarrow.parquet")
    window = 1000  # documents per shuffle window (the hf-stream runner's buffer)

    def batches_per_epoch(self) -> int:
        return int(-(-self.tokens() // (self.args.lanes * self.args.seq_len)))

    def tokens(self) -> int:
        import plitzer

        return int(plitzer.index(self.args.data, column=self.column).tokens)

    def _pipeline(self) -> Any:
        grain = importlib.import_module("grain")
        a = self.args
        files = [self.files[i] for i in np.random.default_rng(a.seed).permutation(len(self.files))]
        column = self.column
        ds = grain.experimental.ParquetIterDataset(files)
        ds = ds.map(lambda row: {"tokens": np.asarray(row[column], dtype=np.int32)})
        ds = grain.experimental.WindowShuffleIterDataset(ds, window_size=self.window, seed=a.seed)
        ds = grain.experimental.ConcatThenSplitIterDataset(ds, length_struct={"tokens": a.seq_len})
        ds = ds.batch(a.lanes)
        return grain.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=max(1, a.workers))

    def open(self, state: bytes | None) -> Iterator[Item]:
        import torch

        self.it = iter(self._pipeline())
        if state is not None:
            self.it.set_state(json.loads(state))
        self.padded = 0

        def gen() -> Iterator[Item]:
            for b in self.it:
                # Concat-then-split pads only the last row of the epoch (segment id 0).
                self.padded = (self.padded or 0) + int(np.count_nonzero(b["tokens_segment_ids"] == 0))
                yield torch.from_numpy(b["tokens"]), None

        return gen()

    def save(self) -> bytes:
        return json.dumps(self.it.get_state()).encode()


def _stateful_dataloader() -> Any:
    """torchdata's StatefulDataLoader, or None where torchdata is missing."""
    try:
        return importlib.import_module("torchdata.stateful_dataloader").StatefulDataLoader
    except ImportError:
        return None


class HfRunner(Runner):
    """``load_dataset("parquet")`` (an Arrow copy), ``.shuffle(seed)``, batches of ``ds[indices]``."""

    modules = ("torch", "datasets", "torchdata.stateful_dataloader")

    @property
    def cache(self) -> Path:
        return self.work / "hf-cache"

    def _load(self) -> Any:
        datasets = importlib.import_module("datasets")
        datasets.disable_progress_bars()
        return datasets.load_dataset("parquet", data_files=self.files, split="train", cache_dir=str(self.cache))

    def convert(self) -> int:
        shutil.rmtree(self.cache, ignore_errors=True)
        self._load()
        return dir_bytes(self.cache)

    def open(self, state: bytes | None) -> Iterator[Item]:
        import torch.utils.data as tud

        a = self.args
        ds = self._load().select_columns([self.column]).shuffle(seed=a.seed, keep_in_memory=True)
        ds = ds.with_format("arrow")
        sampler = tud.BatchSampler(tud.SequentialSampler(range(len(ds))), batch_size=a.batch, drop_last=False)
        loader_cls = _stateful_dataloader()
        if loader_cls is None:
            if state is not None:
                msg = "no resume: torchdata's StatefulDataLoader is not installed"
                raise SystemExit(msg)
            loader_cls = tud.DataLoader
        self.dl = loader_cls(ArrowBatches(ds), batch_size=None, sampler=sampler, num_workers=a.workers)
        if state is not None:
            self.dl.load_state_dict(_load_state(state))
        return iter(self.dl)

    def save(self) -> bytes:
        if not hasattr(self.dl, "state_dict"):
            msg = "no resume: torchdata's StatefulDataLoader is not installed"
            raise SystemExit(msg)
        return _dump_state(self.dl.state_dict())


class HfStreamRunner(Runner):
    """``load_dataset("parquet", streaming=True)``, a 1,000-document shuffle buffer, ``.batch()``."""

    buffer = 1000
    modules = ("torch", "datasets", "torchdata.stateful_dataloader")

    def batches_per_epoch(self) -> int:
        return int(-(-self.rows // self.args.batch))

    def open(self, state: bytes | None) -> Iterator[Item]:
        datasets = importlib.import_module("datasets")
        datasets.disable_progress_bars()
        a = self.args
        ids = datasets.load_dataset("parquet", data_files=self.files, split="train", streaming=True)
        ids = ids.select_columns([self.column]).shuffle(seed=a.seed, buffer_size=self.buffer)
        ids = ids.batch(a.batch).with_format("arrow")
        loader_cls = _stateful_dataloader()
        workers = min(a.workers, ids.num_shards)
        if a.mode in {"save", "resume"}:
            # datasets 5.2 + torchdata 0.11 fail to restore the state of several workers whose
            # shards are uneven (IndexError in IterableDataset.load_state_dict): resume in-process.
            workers = 0
        if loader_cls is None:
            import torch.utils.data as tud

            loader_cls = tud.DataLoader
            workers = 0  # IterableDataset.state_dict() is only reachable in this process
            self.ids = ids
        self.dl = loader_cls(ids, batch_size=None, num_workers=workers, collate_fn=collate_arrow)
        if state is not None:
            got = _load_state(state)
            if hasattr(self.dl, "load_state_dict"):
                self.dl.load_state_dict(got)
            else:
                ids.load_state_dict(got)
        return iter(self.dl)

    def save(self) -> bytes:
        if hasattr(self.dl, "state_dict"):
            return _dump_state(self.dl.state_dict())
        return _dump_state(self.ids.state_dict())


def _dump_state(state: object) -> bytes:
    """A peer's loader state as bytes, with torch's tensor format (no pickle of code)."""
    import io

    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def _load_state(data: bytes) -> Any:
    """Read back what ``_dump_state`` wrote; ``weights_only`` refuses anything but data."""
    import io

    import torch

    return torch.load(io.BytesIO(data), weights_only=True)


RUNNERS: dict[str, type[Runner]] = {
    "pyarrow": PyarrowRunner,
    "pyarrow-rg": PyarrowRowGroupsRunner,
    "plitzer": PlitzerRunner,
    "litdata": LitdataRunner,
    "grain": GrainRunner,
    "mosaic": MosaicRunner,
    "hf": HfRunner,
    "hf-stream": HfStreamRunner,
}


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
