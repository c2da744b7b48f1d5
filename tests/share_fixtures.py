"""Helpers of the one-index-per-job tests: a collective of threads, a counting tokenizer, a text dataset.

:class:`ThreadGroup` is a :class:`plitzer.state.share.Collective` whose ranks are threads
of this process (a barrier and a list): the sharing logic runs in one process, fast,
without torch. :class:`CharTokenizer` tokenizes characters and counts the texts it was
given (per thread group rank where the caller says which). :func:`gloo_ranks` runs a worker
script as real ``torch.distributed`` ranks, each with its own cache folder.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "CharTokenizer",
    "ThreadGroup",
    "assert_ranks_make_the_whole",
    "gloo_ranks",
    "local_ray",
    "ray_with_caches",
    "nonempty_texts",
    "run_ranks",
    "write_text",
]


class ThreadGroup:
    """``world`` threads as one process group; :meth:`member` is rank ``r``'s view of it."""

    def __init__(self, world: int) -> None:
        self.world = world
        self._barrier = threading.Barrier(world, timeout=60)
        self._slots: list[Any] = [None] * world

    def member(self, rank: int) -> Member:
        return Member(self, rank)

    def gather(self, rank: int, value: Any) -> list[Any]:
        self._slots[rank] = value
        self._barrier.wait()
        out = list(self._slots)
        self._barrier.wait()  # nobody writes the next round's value before all have read this one
        return out


class Member:
    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self._group = group
        self.rank = rank
        self.world = group.world
        self.calls = 0

    def broadcast(self, value: Any) -> Any:
        self.calls += 1
        return self._group.gather(self.rank, value)[0]

    def all_gather(self, value: Any) -> list[Any]:
        self.calls += 1
        return self._group.gather(self.rank, value)


def run_ranks(world: int, fn: Callable[[int], Any]) -> list[Any]:
    """``fn(rank)`` on ``world`` threads at once; the results in rank order (a thread's error is raised)."""
    out: list[Any] = [None] * world
    errors: list[BaseException] = []

    def one(r: int) -> None:
        try:
            out[r] = fn(r)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return out


def gloo_ranks(script: str, data: Path, tmp_path: Path, *, world: int = 2, timeout: float = 150) -> list[Any]:
    """Run ``script`` (Python source) as ``world`` gloo ranks, each with its own cache folder; what each wrote.

    The script's arguments are ``rank world port data out``: it joins the group at
    ``tcp://127.0.0.1:port`` and writes a JSON value to ``out``. The processes start from
    tests/prefork.py's zygote; each must end with status 0 within ``timeout`` seconds.
    """
    from tests import prefork
    from tests.net import free_port

    path = tmp_path / "worker.py"
    path.write_text(script)
    port, root = str(free_port()), Path(__file__).parents[1]
    procs = []
    for r in range(world):
        env = {**os.environ, "PLITZER_CACHE": str(tmp_path / f"cache-{r}"), "PYTHONPATH": str(root)}
        args = [sys.executable, str(path), str(r), str(world), port, str(data), str(tmp_path / f"out-{r}.json")]
        procs.append(prefork.Popen(args, env=env))
    for p in procs:
        assert p.wait(timeout=timeout) == 0
    return [json.loads((tmp_path / f"out-{r}.json").read_text()) for r in range(world)]


def assert_ranks_make_the_whole(ranks: Sequence[Any], whole: Any, steps: int) -> None:
    """Each of ``steps`` steps: the ranks' batches, concatenated in rank order, are the one-process run's batch."""
    from tests.conftest import tokens_of

    for t in range(steps):
        want = tokens_of(whole.next_batch())
        got = np.concatenate([tokens_of(x.next_batch()) for x in ranks])
        assert got.tobytes() == want.tobytes(), f"step {t}"


def local_ray() -> Any:
    """The test process's local Ray runtime (2 CPUs, no dashboard), started by the first test that asks and
    left to Ray's own shutdown at exit: each start cost 10-20 CPU s (raylet, GCS, workers), five times in
    the e2e run. Its workers' cache is a folder of their own, apart from every test's (``PLITZER_CACHE``);
    skips without Ray."""
    import tempfile

    import pytest

    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'plitzer[ray]')")
    if not ray.is_initialized():
        workers = tempfile.mkdtemp(prefix="plitzer-ray-workers-")
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PLITZER_CACHE": workers}},
        )
    return ray


@contextmanager
def ray_with_caches(tmp_path: Path, monkeypatch: Any) -> Iterator[Any]:
    """:func:`local_ray`, this process's cache a folder of the test's own (``tmp_path / "cache"``), apart from
    the Ray workers'; skips without Ray."""
    ray = local_ray()
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    yield ray


def utf8_bytes(texts: list[str]) -> list[list[int]]:
    """A tokenizer of UTF-8 bytes (ids 0..255; module level, so other processes can run it)."""
    return [list(t.encode()) for t in texts]


def chars(texts: list[str]) -> list[list[int]]:
    """A tokenizer of characters (ids 0..996; module level: ``plitzer tokenize`` may run it in other processes)."""
    return [[ord(c) % 997 for c in t] for t in texts]


def char_tokenizer() -> Any:
    """:func:`chars` as plitzer's tokenizer ``chars-v1`` (EOS 997)."""
    from plitzer.text.source import load_tokenizer

    return load_tokenizer(chars, name="chars-v1", eos_id=997, vocab_size=998)


class CharTokenizer:
    """A callable tokenizer (one id per character, 1..255; EOS 0) that counts the texts it tokenized."""

    eos_id = 0
    vocab_size = 256

    def __init__(self, tokenizer_id: str = "chars-v1") -> None:
        self.tokenizer_id = tokenizer_id
        self.texts = 0
        self._lock = threading.Lock()

    def __call__(self, texts: list[str]) -> list[list[int]]:
        with self._lock:
            self.texts += len(texts)
        return [[1 + (ord(c) % 255) for c in t] for t in texts]


def write_text(d: Path, *, files: int = 6, row_groups: int = 3, docs: int = 12, seed: int = 0) -> Path:
    """A small text dataset: ``files`` files of ``row_groups`` row groups of ``docs`` documents (some empty)."""
    rng = random.Random(seed)
    words = ["the", "loader", "packs", "tokens", "x", "déjà", "vu"]
    d.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        texts = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 30))) for _ in range(row_groups * docs)]
        texts[1] = ""
        table = pa.table({"text": pa.array(texts, pa.string()), "id": list(range(len(texts)))})
        pq.write_table(table, d / f"part-{f:03d}.parquet", row_group_size=docs)
    return d


def nonempty_texts(d: Path) -> int:
    """The documents of a text dataset that a tokenizer is given (an empty text is not tokenized)."""
    return sum(1 for f in sorted(d.rglob("*.parquet")) for t in pq.read_table(f)["text"].to_pylist() if t)
