"""Checkpoints: small, typed, versioned bytes; never pickle.

Layout (all integers little-endian)::

    magic     8 bytes   b"PLTZCKPT"
    version   u32       FORMAT_VERSION
    length    u64       length of the document
    document  UTF-8     canonical JSON (sorted keys, no spaces)
    checksum  32 bytes  sha256 of everything before it

The document holds the configuration that fixes the order (seed, lanes, seq_len,
window, column, dtype, dataset fingerprint), the global step, and for each lane
it covers its position: ``[lane, epoch, window, piece, offset]``, the next token
being token ``offset`` of piece ``piece`` (an ordinal in the shuffled slice) of
the lane's slice of that window (see :class:`Position`). A lane that finished a
slice points at the start of the next window. Positions do not depend on the world
size, so a checkpoint merged from all ranks resumes on any number of ranks.

Format versions: 1 (plitzer 0.1) stored ``doc`` under the first lane rule, where a
document went whole to one lane; 2 (plitzer 0.2) stores pieces under the lockstep
rule (docs/glossary.md, "Cut"). The orders differ, so a format 1 checkpoint is
refused with both versions named, never misread.

The decoder trusts nothing: every field is type- and range-checked, sizes are
capped, and any problem is a :class:`CheckpointError`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from planner.errors import CheckpointError
from planner.stores.cache import write_atomic
from plitzer.state import steering as steer

__all__ = [
    "CONFIG_FIELDS",
    "DATASET_FIELDS",
    "FORMAT_VERSION",
    "OPTIONAL",
    "Position",
    "SETTING_FIELDS",
    "State",
    "decode",
    "encode",
    "lanes_at",
    "layout_of",
    "load_checkpoint",
    "merge",
    "package_version",
    "save_checkpoint",
]

MAGIC = b"PLTZCKPT"
FORMAT_VERSION = 2
# What each older format was, for the refusal message.
_OLDER = {1: "plitzer 0.1, whose lanes took whole documents; 0.2 cuts lanes at exact token positions"}
MAX_BYTES = 64 << 20
_HEADER = struct.Struct("<8sIQ")
_KEYS = frozenset(("config", "step", "lanes"))  # a document's keys; a steered run's adds "steering"
_SETTING = object()
_DATASET = object()
# The configuration's fields, in the order a checkpoint writes them, each with the value it is
# read as when absent; every checkpoint has the settings that fix the order (_SETTING: the
# loader's, integers) and the dataset's identity (_DATASET: the index's, strings).
# Fields of text sources (plitzer.text.source: the tokenizer's identity and the BOS/EOS
# policy), added within format 2: written only when they differ from these values
# (a checkpoint of token data is byte for byte what plitzer 0.2 wrote), and read as
# these when absent.
# Mixtures (planner.mixing.mixture) add their sources ([name, fingerprint] each) and stages
# ([start step, {source: weight}] each) the same way. Sources on the Hugging Face Hub
# add their revisions ([source without revision, commit, files digest] each,
# planner.stores.storage.revisions): not part of the dataset's identity (a checkpoint carries to
# a copy on disk), so they are compared by diff_revisions, not diff_config.
# Layout stages (planner.order.layout) add ``layout`` ([start step, lanes, seq_len] each, from
# step 0; ``lanes`` and ``seq_len`` are then the first stage's), written only when there
# is more than one.
_CONFIG: dict[str, Any] = {
    "seed": _SETTING,
    "lanes": _SETTING,
    "seq_len": _SETTING,
    "window": _SETTING,
    "column": _DATASET,
    "dtype": _DATASET,
    "fingerprint": _DATASET,
    "tokenizer": "",
    "add_bos": False,
    "add_eos": False,
    "sources": [],
    "stages": [],
    "where": "",
    "length_column": "",
    "revisions": [],
    "layout": [],
    "dedupe": "",
    "exclude": "",
    "columns": [],
    "packing": "concat",
    "pad_id": 0,
    "shuffle": True,
    "epochs": None,
}
CONFIG_FIELDS: tuple[str, ...] = tuple(_CONFIG)
SETTING_FIELDS: tuple[str, ...] = tuple(k for k, v in _CONFIG.items() if v is _SETTING)
"""The settings every checkpoint records (seed, lanes, seq_len, window), as the loader's settings name them."""
DATASET_FIELDS: tuple[str, ...] = tuple(k for k, v in _CONFIG.items() if v is _DATASET)
"""The dataset's identity every checkpoint records (column, dtype, fingerprint), as the index names it."""
OPTIONAL: dict[str, Any] = {k: v for k, v in _CONFIG.items() if v is not _SETTING and v is not _DATASET}
"""The fields a checkpoint may leave out, each with the value it is read as when absent."""
# Aligned columns (plitzer.readpath.aligned) add ``columns`` ([name, fill or null] each, sorted by
# name), written only when a run names some: a run without them writes the bytes it wrote before.
# The packing rule (planner.rules) adds ``packing`` and ``pad_id``, written only under a rule other
# than concat: a concat run's checkpoint is byte for byte what 0.5 wrote. ``shuffle`` (False) and
# ``epochs`` (SPEC section 17) are written only where set; a finite run writes its ``pad_id`` (not 0).
_INT_LIMIT = 2**63


def package_version() -> str:
    """The installed plitzer's version (for messages; "unknown" from a bare checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("plitzer")
    except PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True, slots=True)
class Position:
    """One lane's place in its token stream, as a checkpoint stores it.

    The next token of lane ``lane`` is token ``offset`` of piece ``piece`` (its
    ordinal in the shuffled slice, docs/glossary.md "Piece") of the lane's slice of
    window ``window`` of epoch ``epoch``; ``piece`` equal to the slice's piece count
    (with offset 0) means the slice is used up.
    """

    lane: int
    epoch: int
    window: int
    piece: int
    offset: int

    FIELDS: ClassVar[tuple[str, ...]] = ("lane", "epoch", "window", "piece", "offset")


@dataclass(frozen=True, slots=True)
class State:
    """A decoded checkpoint: config, step, and positions (one row per covered lane)."""

    config: Mapping[str, Any]
    step: int
    positions: NDArray[np.int64]  # (n, 5): the fields of Position, one row per lane, sorted by lane
    steering: Mapping[str, Any] | None = None  # a steering controller's state (plitzer.state.steering), if any

    @property
    def lanes(self) -> NDArray[np.int64]:
        return self.positions[:, 0]

    def position(self, i: int) -> Position:
        """Row ``i`` of :attr:`positions` as a :class:`Position`."""
        return Position(*(int(v) for v in self.positions[i]))


def encode(state: State) -> bytes:
    doc = {
        "config": {
            k: state.config.get(k, OPTIONAL.get(k))
            for k in CONFIG_FIELDS
            if k not in OPTIONAL or state.config.get(k, OPTIONAL[k]) != OPTIONAL[k]
        },
        "step": int(state.step),
        "lanes": [[int(x) for x in row] for row in state.positions],
    }
    doc |= {} if state.steering is None else {"steering": dict(state.steering)}  # other checkpoints: same bytes
    payload = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    head = _HEADER.pack(MAGIC, FORMAT_VERSION, len(payload)) + payload
    return head + hashlib.sha256(head).digest()


def _fail(why: str) -> CheckpointError:
    return CheckpointError(f"not a valid plitzer checkpoint: {why}")


def _int(v: object, name: str, low: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not (low <= v < _INT_LIMIT):
        why = f"{name} is {v!r}, expected an integer >= {low}"
        raise _fail(why)
    return v


def decode(data: bytes | bytearray | memoryview) -> State:
    """Parse and check checkpoint bytes; any problem raises CheckpointError."""
    doc = _document(data)
    config = _config(doc["config"])
    step = _int(doc["step"], "step")
    positions = _positions(doc["lanes"], lanes_at(config, step))
    steering = steer.check(doc["steering"], step) if "steering" in doc else None
    return State(config=config, step=step, positions=positions, steering=steering)


def _document(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The checked envelope's JSON document (magic, version, length, checksum, its three keys)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        msg = f"a checkpoint is bytes, got {type(data).__name__}; pass what checkpoint() returned"
        raise CheckpointError(msg)
    data = bytes(data)
    if len(data) > MAX_BYTES:
        why = f"{len(data)} bytes exceeds the {MAX_BYTES} byte cap"
        raise _fail(why)
    if data[:2] == b"\x80\x04" or data[:1] == b"\x80":
        why = "this is a pickle; plitzer never unpickles. Save loader.checkpoint() bytes instead"
        raise _fail(why)
    if len(data) < _HEADER.size + 32 or data[:8] != MAGIC:
        why = "missing the PLTZCKPT magic (truncated, or another file)"
        raise _fail(why)
    _, version, length = _HEADER.unpack_from(data)
    _check_version(version)
    if _HEADER.size + length + 32 != len(data):
        why = f"length field says {length} bytes but {len(data) - _HEADER.size - 32} are present (truncated?)"
        raise _fail(why)
    body = data[: _HEADER.size + length]
    if hashlib.sha256(body).digest() != data[-32:]:
        why = "checksum mismatch (the bytes were damaged or edited)"
        raise _fail(why)
    try:
        doc = json.loads(body[_HEADER.size :].decode())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        why = f"unreadable document ({e})"
        raise _fail(why) from e
    if not isinstance(doc, dict) or not _KEYS <= set(doc) <= {*_KEYS, "steering"}:
        why = "document must have exactly config, step and lanes (and steering, from a steered run)"
        raise _fail(why)
    return doc


def _check_version(version: int) -> None:
    """Refuse a format this plitzer cannot resume, newer or older, with both versions named."""
    if version > FORMAT_VERSION:
        msg = (
            f"checkpoint format version {version} is newer than format {FORMAT_VERSION} of this plitzer "
            f"{package_version()}; upgrade plitzer to resume it"
        )
        raise CheckpointError(msg)
    if version < FORMAT_VERSION:
        what = _OLDER.get(version, "an older plitzer")
        msg = (
            f"checkpoint format version {version} ({what}) cannot be resumed by format {FORMAT_VERSION} of this "
            f"plitzer {package_version()}: the order changed, so the positions would be misread. Finish that run "
            "with the plitzer that wrote it, or start this one from step 0 (CHANGELOG.md, docs/compatibility.md)"
        )
        raise CheckpointError(msg)


def _config(config: object) -> dict[str, Any]:
    """The document's config, every field type- and range-checked, text sources' defaults filled in."""
    if not isinstance(config, dict) or not (set(CONFIG_FIELDS) - set(OPTIONAL) <= set(config) <= set(CONFIG_FIELDS)):
        why = f"config must have exactly {list(CONFIG_FIELDS)} (those of text sources may be left out)"
        raise _fail(why)
    config = {**OPTIONAL, **config}
    _check_text(config)
    _check_mixture(config)
    _check_layout(config)
    _check_selection(config)
    _check_rows(config)
    if not isinstance(config["shuffle"], bool):
        why = f"shuffle is {config['shuffle']!r}, expected true or false"
        raise _fail(why)
    if config["epochs"] is not None:
        _int(config["epochs"], "epochs", low=1)
    revs = config["revisions"]
    if not isinstance(revs, list) or not all(
        isinstance(x, list) and len(x) == 3 and all(isinstance(v, str) for v in x) for x in revs
    ):
        why = "revisions must list [source, commit, files digest] triples"
        raise _fail(why)
    for k in SETTING_FIELDS:
        _int(config[k], k, low=1 if k != "seed" else 0)
    for k in DATASET_FIELDS:
        if not isinstance(config[k], str):
            why = f"{k} is {config[k]!r}, expected a string"
            raise _fail(why)
    return config


def _check_text(config: Mapping[str, Any]) -> None:
    """Check the text sources' fields: the tokenizer's name, add_bos and add_eos."""
    if not isinstance(config["tokenizer"], str):
        why = f"tokenizer is {config['tokenizer']!r}, expected a string"
        raise _fail(why)
    for k in ("add_bos", "add_eos"):
        if not isinstance(config[k], bool):
            why = f"{k} is {config[k]!r}, expected true or false"
            raise _fail(why)


def _check_selection(config: Mapping[str, Any]) -> None:
    """Check the fields that choose documents: dedupe, exclude, where and length_column."""
    for k in ("dedupe", "exclude"):
        if not isinstance(config[k], str):
            why = f"{k} is {config[k]!r}, expected a string"
            raise _fail(why)
    for k in ("where", "length_column"):
        v = config[k]
        pairs = isinstance(v, list) and all(
            isinstance(x, list) and len(x) == 2 and all(isinstance(y, str) for y in x) for x in v
        )
        if not isinstance(v, str) and not pairs:
            why = f"{k} is {v!r}, expected a string or [source, string] pairs"
            raise _fail(why)


def _check_rows(config: Mapping[str, Any]) -> None:
    """Check the fields that shape a batch's rows: columns, packing and pad_id."""
    cols = config["columns"]
    if not isinstance(cols, list) or not all(
        isinstance(x, list)
        and len(x) == 2
        and isinstance(x[0], str)
        and (x[1] is None or isinstance(x[1], (bool, int, float)))
        for x in cols
    ):
        why = "columns must list [name, fill or null] pairs"
        raise _fail(why)
    if not isinstance(config["packing"], str):
        why = f"packing is {config['packing']!r}, expected a rule's name"
        raise _fail(why)
    _int(config["pad_id"], "pad_id")


def _positions(rows: object, b: int) -> NDArray[np.int64]:
    """The lane positions, [lane, epoch, window, piece, offset] rows, checked against ``b`` lanes."""
    if not isinstance(rows, list) or not rows or len(rows) > b:
        why = f"lanes must list 1..{b} lane positions"
        raise _fail(why)
    for row in rows:
        if not isinstance(row, list) or len(row) != 5:
            why = "each lane position is [lane, epoch, window, piece, offset]"
            raise _fail(why)
        for v, name in zip(row, Position.FIELDS, strict=True):
            _int(v, name)
    positions = np.array(rows, dtype=np.int64).reshape(-1, 5)
    lanes = positions[:, 0]
    if np.any(np.diff(lanes) <= 0) or lanes[-1] >= b:
        why = "lane numbers must be increasing and below lanes"
        raise _fail(why)
    return positions


def _check_mixture(config: Mapping[str, Any]) -> None:
    sources, stages = config["sources"], config["stages"]
    ok = isinstance(sources, list) and all(
        isinstance(x, list) and len(x) == 2 and all(isinstance(v, str) for v in x) for x in sources
    )
    if not ok:
        why = "sources must list [name, fingerprint] pairs"
        raise _fail(why)
    ok = isinstance(stages, list) and all(
        isinstance(x, list)
        and len(x) == 2
        and not isinstance(x[0], bool)
        and isinstance(x[0], int)
        and x[0] >= 0
        and isinstance(x[1], dict)
        and all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in x[1].items())
        for x in stages
    )
    if not ok:
        why = "stages must list [start step, {source: weight}] pairs"
        raise _fail(why)


def layout_of(config: Mapping[str, Any]) -> list[list[int]]:
    """A configuration's layout stages ``[[start, lanes, seq_len], ...]`` (one stage when it has none)."""
    rows = config.get("layout") or []
    return [list(r) for r in rows] if rows else [[0, int(config["lanes"]), int(config["seq_len"])]]


def lanes_at(config: Mapping[str, Any], step: int) -> int:
    """The lanes of the layout stage in force at ``step``."""
    return int([r for r in layout_of(config) if r[0] <= step][-1][1])


def _check_layout(config: Mapping[str, Any]) -> None:
    rows = config["layout"]
    ok = isinstance(rows, list) and all(
        isinstance(r, list) and len(r) == 3 and all(isinstance(v, int) and not isinstance(v, bool) for v in r)
        for r in rows
    )
    if ok and rows:
        ok = rows[0][0] == 0 and all(r[1] >= 1 and r[2] >= 1 for r in rows)
        ok = ok and all(b[0] > a[0] for a, b in itertools.pairwise(rows))
        ok = ok and [rows[0][1], rows[0][2]] == [config["lanes"], config["seq_len"]]
    if not ok:
        why = (
            "layout must list [start step, lanes, seq_len] stages from step 0, steps increasing, "
            "the first one's lanes and seq_len those of the configuration"
        )
        raise _fail(why)


def merge(parts: Iterable[bytes]) -> bytes:
    """One global checkpoint from every rank's part.

    Refuses parts that disagree (configuration or step), overlap, or leave lanes
    out, naming what differs.

    Examples
    --------
    >>> import plitzer, tempfile
    >>> d = tempfile.mkdtemp(); _ = plitzer.synth.write(d, tokens=50_000, seed=4)
    >>> ranks = [plitzer.Loader(d, lanes=4, window=2, seq_len=64, rank=r, world=2) for r in (0, 1)]
    >>> state = plitzer.merge([r.checkpoint() for r in ranks])
    >>> plitzer.merge([ranks[0].checkpoint()])
    Traceback (most recent call last):
    ...
    planner.errors.CheckpointError: checkpoint parts miss lanes [2, 3] (2 of 4); pass the parts of every rank
    >>> for r in ranks:
    ...     r.close()
    """
    states = [decode(p) for p in parts]
    if not states:
        msg = "merge() needs at least one checkpoint part"
        raise CheckpointError(msg)
    first = states[0]
    for i, s in enumerate(states[1:], 1):
        diffs = [
            f"{k}: part 0 {first.config[k]!r}, part {i} {s.config[k]!r}"
            for k in CONFIG_FIELDS
            if first.config[k] != s.config[k]
        ]
        if s.step != first.step:
            diffs.append(f"step: part 0 {first.step}, part {i} {s.step}")
        if s.steering != first.steering:
            diffs.append(f"steering: part 0 {first.steering!r}, part {i} {s.steering!r}")
        if diffs:
            msg = "checkpoint parts disagree, so they are not from one run at one step: " + "; ".join(diffs)
            raise CheckpointError(msg)
    positions = np.concatenate([s.positions for s in states])
    positions = positions[np.argsort(positions[:, 0], kind="stable")]
    lanes = positions[:, 0]
    dup = np.unique(lanes[1:][np.diff(lanes) == 0])
    if len(dup):
        msg = f"checkpoint parts overlap: lanes {dup[:10].tolist()} appear in more than one part"
        raise CheckpointError(msg)
    b = lanes_at(first.config, first.step)
    missing = np.setdiff1d(np.arange(b), lanes)
    if len(missing):
        msg = (
            f"checkpoint parts miss lanes {missing[:10].tolist()}{' ...' if len(missing) > 10 else ''} "
            f"({len(missing)} of {b}); pass the parts of every rank"
        )
        raise CheckpointError(msg)
    return encode(State(first.config, first.step, positions, first.steering))


def save_checkpoint(path: str | os.PathLike[str], state: bytes) -> None:
    """Write checkpoint bytes atomically: temp file, fsync, rename, fsync the folder.

    A crash at any moment leaves either the previous file or the new one, whole.

    Examples
    --------
    >>> import plitzer, tempfile, os
    >>> d = tempfile.mkdtemp(); _ = plitzer.synth.write(d, tokens=50_000, seed=4)
    >>> with plitzer.Loader(d, lanes=4, window=2, seq_len=64) as loader:
    ...     _ = loader.next_batch()
    ...     plitzer.save_checkpoint(os.path.join(d, "data.ckpt"), loader.checkpoint())
    >>> with plitzer.Loader(d, lanes=4, window=2, seq_len=64) as again:
    ...     again.resume(plitzer.load_checkpoint(os.path.join(d, "data.ckpt")))
    ...     again.step
    1
    """
    decode(state)  # never write something that cannot be resumed
    write_atomic(path, state, durable=True)


def load_checkpoint(path: str | os.PathLike[str]) -> bytes:
    """Read checkpoint bytes written by :func:`save_checkpoint` (checked)."""
    p = Path(path)
    size = p.stat().st_size
    if size > MAX_BYTES:
        why = f"{p}: {size} bytes exceeds the {MAX_BYTES} byte cap"
        raise _fail(why)
    data = p.read_bytes()
    decode(data)
    return data
