"""One read a replica (SPEC section 19): a model-parallel group's rank 0 reads, the others receive each step.

The ranks of one tensor-, context- or pipeline-parallel group train the same rows. The
group's rank 0 (the *reader*) runs a :class:`plitzer.Loader` as any data-parallel rank does
(its listing, footers, reads and, with ``balance=True``, the deal over the readers); its
:class:`Reader` sends each step's batch to the group. The others (*followers*) never open the
source: a :class:`Follower` receives the steps and answers what a loader answers from what
the reader sent with them. Both run the step after the one handed out on a thread of their
own (:class:`plitzer.readpath.balance.Ahead`: one send and one receive a step, paired), on a
gloo group of their own over the replica's ranks (:class:`Link`), never the trainer's.

What crosses per step (:func:`encode`): tokens, labels, aligned columns, the pieces (from
which the mask, ``cu_seqlens``, ``position_ids`` and ``doc_lengths`` follow), lanes, cost,
where each piece's document is (file, row group, row, source: what ``documents()`` needs),
the reader's checkpoint part after the step, and the position after it (:class:`Status`).
A change (seek, resume, a live stage) is made by the reader and its result (or its error)
and the new position sent to the followers, which every rank of the replica calls at the
same point, as with any collective. ``state_dict()`` then gathers each rank's copy of its
reader's part over its data-parallel group, so every rank of a replica gives the same bytes.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from planner.errors import ConfigError, PlitzerError, UsageError
from plitzer import errors as plitzer_errors
from plitzer.readpath.ahead import Ahead
from plitzer.readpath.batch import Batch, Located, Tokens
from plitzer.readpath.packed import Segments
from plitzer.readpath.signals import SourceMap
from plitzer.state.settings import LoaderSettings

__all__ = ["Follower", "Link", "Reader", "ReplicaStats", "Status", "decode", "encode"]

_SEGMENTS = ("row", "length", "doc", "offset", "epoch", "window")


def _dist() -> Any:
    return sys.modules["torch.distributed"]


class Link:
    """Bytes from a replica's rank 0 to its other ranks: two broadcasts (size, bytes) on a gloo group of its own."""

    def __init__(self, group: Any) -> None:
        dist = _dist()
        ranks = dist.get_process_group_ranks(group)
        self.group = dist.new_group(ranks, backend="gloo", use_local_synchronization=True)
        self.src = int(ranks[0])
        self.rank = int(dist.get_rank(group))
        self.size = len(ranks)
        self.bytes_sent = 0
        self.bytes_received = 0

    def send(self, data: bytes) -> None:
        torch = sys.modules["torch"]
        dist = _dist()
        dist.broadcast(torch.tensor([len(data)], dtype=torch.int64), src=self.src, group=self.group)
        dist.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), src=self.src, group=self.group)
        self.bytes_sent += len(data)

    def receive(self) -> bytes:
        torch = sys.modules["torch"]
        dist = _dist()
        size = torch.empty(1, dtype=torch.int64)
        dist.broadcast(size, src=self.src, group=self.group)
        buf = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.broadcast(buf, src=self.src, group=self.group)
        self.bytes_received += len(buf)
        return bytes(buf.numpy().tobytes())


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    """A follower's figures: ``steps`` received, ``bytes_received``, ``wait_seconds`` its consumer waited for them."""

    steps: int
    bytes_received: int
    wait_seconds: float


@dataclass(frozen=True, slots=True)
class Status:
    """Where the replica stands before its next step: what a follower answers without the run.

    ``epoch_start`` and ``epoch_end``: the first step of the next step's epoch and the first of
    the epoch after it (``Run.epoch_end``); ``steps``: a finite run's steps, else None; ``sources``:
    the source names in source-number order (``loader.sources``).
    """

    step: int
    epoch: int
    steps: int | None
    lanes: int
    seq_len: int
    epoch_start: int
    epoch_end: int
    epochs: dict[str, int]  # steps_in_epoch of the next step's epoch and the one after
    sources: list[str]

    @classmethod
    def of(cls, loader: Any, step: int) -> Status:
        run = loader.run
        epoch = run.epoch_of(step)
        start = 0 if epoch <= 0 else run.epoch_end(epoch - 1)
        stage = run.at(step)[1]
        seq_len = loader.layout.at(step).seq_len
        return cls(
            step,
            epoch,
            run.steps,
            stage.lanes,
            seq_len,
            start,
            run.epoch_end(epoch),
            {str(e): run.steps_in_epoch(e) for e in (epoch, epoch + 1)},
            list(loader.sources),
        )

    @property
    def ended(self) -> bool:
        return self.steps is not None and self.step >= self.steps


def _arrays(batch: Batch) -> dict[str, NDArray[Any]]:
    segs = batch._segs()
    out: dict[str, NDArray[Any]] = {"tokens": np.asarray(batch.tokens), "lanes": np.asarray(batch.lanes)}
    if batch.labels is not None:
        out["labels"] = np.asarray(batch.labels)
    if batch.cost is not None:
        out["cost"] = np.asarray(batch.cost)
    for n, c in batch.columns.items():
        out[f"column:{n}"] = np.asarray(c)
    for f in _SEGMENTS:
        out[f"seg:{f}"] = np.asarray(getattr(segs, f), np.int64)
    return out


def encode(batch: Batch | None, status: Status, part: bytes, extra: Mapping[str, Any] | None = None) -> bytes:
    """One message: a step's batch (or None: a change's result in ``extra``), the position after it, the part."""
    head: dict[str, Any] = {"status": asdict(status), "extra": dict(extra or {}), "arrays": [], "part": len(part)}
    bufs: list[bytes] = []
    if batch is not None:
        segs = batch._segs()
        ids = np.asarray(segs.doc)[np.asarray(segs.doc) >= 0]
        files, row_group, row, sources = batch._locate(ids)
        names, codes = np.unique(np.asarray(files, dtype=object).astype(str), return_inverse=True)
        arrays = _arrays(batch)
        arrays["loc:file"] = codes.astype(np.int64)
        arrays["loc:row_group"], arrays["loc:row"] = np.asarray(row_group, np.int64), np.asarray(row, np.int64)
        head |= {"step": batch.step, "epoch": batch.epoch, "padded": batch.padded, "files": names.tolist()}
        if sources is not None:
            snames, scodes = np.unique(np.asarray(sources, dtype=object).astype(str), return_inverse=True)
            head["sources"] = snames.tolist()
            arrays["loc:source"] = scodes.astype(np.int64)
        for name, value in arrays.items():
            a = np.ascontiguousarray(value)
            head["arrays"].append([name, a.dtype.str, list(a.shape)])
            bufs.append(a.tobytes())
    header = json.dumps(head).encode()
    return b"".join([len(header).to_bytes(8, "little"), header, *bufs, part])


def decode(data: bytes) -> tuple[Batch | None, Status, bytes, dict[str, Any]]:
    """:func:`encode`'s message: the batch (its documents located as the reader located them), status, part, extra."""
    n = int.from_bytes(data[:8], "little")
    head = json.loads(data[8 : 8 + n])
    pos = 8 + n
    arrays: dict[str, NDArray[Any]] = {}
    for name, dtype, shape in head["arrays"]:
        dt = np.dtype(dtype)
        count = int(np.prod(shape)) if shape else 1
        arrays[name] = np.frombuffer(data, dt, count, pos).reshape(shape).copy()
        pos += count * dt.itemsize
    part = data[pos : pos + head["part"]]
    status = Status(**head["status"])
    if "step" not in head:
        return None, status, part, head["extra"]
    located: Located = (
        [head["files"][i] for i in arrays["loc:file"].tolist()],
        arrays["loc:row_group"],
        arrays["loc:row"],
        [head["sources"][i] for i in arrays["loc:source"].tolist()] if "sources" in head else None,
    )
    segments = Segments(**{f: arrays[f"seg:{f}"] for f in _SEGMENTS})

    def locate(ids: NDArray[np.int64]) -> Located:
        if len(ids) != len(located[1]):  # documents() asks for every real piece's document, in order
            msg = "a model-parallel non-reader locates the documents of its batch's pieces only (batch.documents())"
            raise UsageError(msg)
        return located

    batch = Batch(
        tokens=arrays["tokens"].view(Tokens),
        step=int(head["step"]),
        epoch=int(head["epoch"]),
        lanes=arrays["lanes"],
        _segments=segments,
        _locate=locate,
        _after=lambda: part,
        columns={k.split(":", 1)[1]: v.view(Tokens) for k, v in arrays.items() if k.startswith("column:")},
        padded=bool(head["padded"]),
        labels=arrays["labels"].view(Tokens) if "labels" in arrays else None,
        cost=arrays.get("cost"),
        _sources=_sources_of(head, arrays, segments, status),
    )
    return batch, status, part, head["extra"]


def _sources_of(head: dict[str, Any], arrays: dict[str, NDArray[Any]], segs: Segments, status: Status) -> SourceMap:
    """The source number of each real piece's document, from where the reader located it (no index here)."""
    names = tuple(status.sources)
    docs = segs.doc[segs.doc >= 0]  # the located documents, in order
    if "sources" not in head:  # one source: every document is source 0
        return SourceMap.of_documents(names, docs, np.zeros(len(docs), np.int64), mixed=False)
    number = np.array([names.index(n) for n in head["sources"]], np.int64)
    return SourceMap.of_documents(names, docs, number[arrays["loc:source"]], mixed=True)


def _error_of(extra: Mapping[str, Any]) -> BaseException | None:
    """The reader's error of a change, raised on the followers as the same plitzer class (else a ConfigError)."""
    got = extra.get("error")
    if got is None:
        return None
    kind = getattr(plitzer_errors, got[0], None)
    cls = kind if isinstance(kind, type) and issubclass(kind, PlitzerError) else ConfigError
    return cls(got[1])


class _Run:
    """What a follower knows of the run: the next step's epoch and its bounds (from the reader's status)."""

    def __init__(self, replica: Follower) -> None:
        self._r = replica

    @property
    def steps(self) -> int | None:
        return self._r.status.steps

    def epoch_of(self, step: int) -> int:
        s = self._r.status
        if step == s.step or s.epoch_start <= step < s.epoch_end:
            return s.epoch
        raise UsageError(_UNKNOWN.format(what=f"the epoch of step {step}"))

    def epoch_end(self, epoch: int) -> int:
        s = self._r.status
        if epoch == s.epoch:
            return s.epoch_end
        if epoch == s.epoch - 1:
            return s.epoch_start
        raise UsageError(_UNKNOWN.format(what=f"where epoch {epoch} ends"))


_UNKNOWN = (
    "{what} is not known on a model-parallel non-reader (replicas=): it holds its reader's position, "
    "the next step's epoch and its bounds; ask the replica's rank 0"
)


class Follower:
    """A replica's rank other than 0: a loader's answers, from the steps its reader sends (SPEC section 19)."""

    def __init__(self, link: Link, settings: LoaderSettings) -> None:
        self.link = link
        self.settings = settings
        self._ahead: Ahead[Batch] = Ahead(self._receive)
        self._steps, self._waited = 0, 0.0
        _, self.status, self.part, _ = decode(link.receive())  # the reader's position at construction
        self.run = _Run(self)

    def _receive(self, step: int) -> Batch:
        batch, status, part, _ = decode(self.link.receive())
        assert batch is not None and batch.step == step, "the reader sends the steps in order"
        self._pending = (status, part)
        return batch

    @property
    def step(self) -> int:
        return self.status.step

    @property
    def epoch(self) -> int:
        return self.status.epoch

    @property
    def ended(self) -> bool:
        return self.status.ended

    @property
    def seq_len(self) -> int:
        return self.status.seq_len

    @property
    def lanes(self) -> int:
        return self.status.lanes

    def steps_in_epoch(self, epoch: int) -> int:
        got = self.status.epochs.get(str(epoch))
        if got is None:
            raise UsageError(_UNKNOWN.format(what=f"the steps of epoch {epoch}"))
        return got

    @property
    def sources(self) -> list[str]:
        """The source names in source-number order (the reader's ``loader.sources``)."""
        return list(self.status.sources)

    @property
    def stats(self) -> ReplicaStats:
        """What this rank received: steps, bytes, and how long its consumer waited for a step (SPEC section 19)."""
        return ReplicaStats(self._steps, self.link.bytes_received, self._waited)

    def next_batch(self) -> Batch:
        if self.ended:
            msg = f"this run (epochs=) ended at step {self.step}: iter(loader) or seek(0) starts it again"
            raise UsageError(msg)
        t = self.step
        t0 = time.perf_counter()
        batch = self._ahead.take(t)
        self._waited += time.perf_counter() - t0
        self._steps += 1
        self.status, self.part = self._pending
        if not self.ended:
            self._ahead.start(t + 1)
        return batch

    def checkpoint(self) -> bytes:
        return self.part

    def _change(self) -> Any:
        self._ahead.settle()
        _, self.status, self.part, extra = decode(self.link.receive())
        error = _error_of(extra)
        if error is not None:
            raise error
        return extra.get("result")

    def seek(self, step: int) -> None:
        self._change()

    def resume(self, state: bytes) -> None:
        self._change()

    def set_weights(self, weights: Mapping[str, Any] | None, at_step: int | None = None) -> int:
        return int(self._change())

    def set_layout(self, lanes: int | None = None, seq_len: int | None = None, at_step: int | None = None) -> int:
        return int(self._change())

    def close(self) -> None:
        self._ahead.settle(timeout=60.0)


class Reader:
    """A replica's rank 0: its loader's steps, each sent to the replica's other ranks as it is made.

    The step after the one handed out is made (and sent) ahead, so the loader's own cursor may
    be one step on; what this says (``step``, ``checkpoint()``) is the position of the next step
    handed out, as a follower says it.
    """

    def __init__(self, link: Link, loader: Any) -> None:
        self.link = link
        self.loader = loader
        self._ahead: Ahead[Batch] = Ahead(self._send)
        self._next: int = int(loader.step)
        self.part: bytes = bytes(loader.checkpoint())
        self._pending: bytes = b""
        self.link.send(encode(None, Status.of(loader, self._next), self.part))

    def __getattr__(self, name: str) -> Any:  # the rest is the loader's (plan, stats, index, ...)
        return getattr(self.loader, name)

    def _send(self, step: int) -> Batch:
        batch: Batch = self.loader.next_batch()
        assert batch.step == step
        part = batch.state_after()
        self.link.send(encode(batch, Status.of(self.loader, step + 1), part))
        self._pending = part
        return batch

    @property
    def settings(self) -> LoaderSettings:
        return self.loader.settings  # type: ignore[no-any-return]

    @property
    def step(self) -> int:
        return self._next

    @property
    def epoch(self) -> int:
        return int(self.loader.run.epoch_of(self._next))

    @property
    def ended(self) -> bool:
        steps = self.loader.run.steps
        return steps is not None and self._next >= steps

    @property
    def seq_len(self) -> int:
        return int(self.loader.layout.at(self._next).seq_len)

    @property
    def lanes(self) -> int:
        return int(self.loader.run.at(self._next)[1].lanes)

    def next_batch(self) -> Batch:
        if self.ended:
            msg = f"this run (epochs=) ended at step {self._next}: iter(loader) or seek(0) starts it again"
            raise UsageError(msg)
        t = self._next
        batch = self._ahead.take(t)
        self._next, self.part = t + 1, self._pending
        if not self.ended:
            self._ahead.start(t + 1)
        return batch

    def checkpoint(self) -> bytes:
        return self.part

    def _change(self, change: Callable[[], Any]) -> Any:
        """Make a change on the loader at the handed-out position; send its result (or error) and the new position."""
        self._ahead.settle()
        extra: dict[str, Any] = {}
        failed: BaseException | None = None
        try:
            if self.loader.step != self._next:  # the step made ahead was dropped: back to the handed-out one
                self.loader.seek(self._next)
            extra["result"] = change()
        except PlitzerError as e:
            failed = e
            extra["error"] = [type(e).__name__, str(e)]
        self._next = int(self.loader.step)
        self.part = bytes(self.loader.checkpoint())
        self.link.send(encode(None, Status.of(self.loader, self._next), self.part, extra))
        if failed is not None:
            raise failed
        return extra.get("result")

    def seek(self, step: int) -> None:
        self._change(lambda: self.loader.seek(step))

    def resume(self, state: bytes) -> None:
        self._change(lambda: self.loader.resume(state))

    def set_weights(self, weights: Mapping[str, Any] | None, at_step: int | None = None) -> int:
        return int(self._change(lambda: self.loader.set_weights(weights, at_step)))

    def set_layout(self, lanes: int | None = None, seq_len: int | None = None, at_step: int | None = None) -> int:
        return int(self._change(lambda: self.loader.set_layout(lanes, seq_len, at_step)))

    def close(self) -> None:
        self._ahead.settle(timeout=60.0)
        self.loader.close()
