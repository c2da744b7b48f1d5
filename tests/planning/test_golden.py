"""A saved reference output: the order and the first batches must match everywhere.

The dataset is defined by integer arithmetic (no random generator), so the same
bytes are written on every OS and numpy version. Regenerate only on purpose
(an intended change of order is a breaking change): PLITZER_REGEN_GOLDEN=1.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

import planner
import plitzer
from tests.conftest import docs_by_row_group, write_dataset
from tests.reference import epoch_windows, lane_streams

GOLDEN = Path(__file__).parents[1] / "golden" / "order.json"


def golden_docs() -> list[list[list[list[int]]]]:
    files = []
    tok = 0
    for f in range(3):
        rgs = []
        for g in range(4 + f):
            docs = []
            for d in range((f * 5 + g * 3) % 7 + 1):
                n = (f * 7 + g * 3 + d * 5) % 23 if (f + g + d) % 6 else 0
                docs.append([(tok + i) * 2654435761 % 50257 for i in range(n)])
                tok += n
            rgs.append(docs)
        files.append(rgs)
    return files


@pytest.fixture(scope="module")
def golden_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("golden")
    write_dataset(d, golden_docs())
    return d


def compute(root: Path) -> dict[str, object]:
    ix = planner.index(root)
    out: dict[str, object] = {"fingerprint": ix.fingerprint, "plans": {}, "batches": {}}
    for seed in (0, 12345, 2**64 - 1):
        p = planner.plan(ix, seed=seed, lanes=4, window=3, world=2)
        for epoch in range(3):
            rg = p.row_groups(epoch)
            reads = p.reads(epoch)
            out["plans"][f"{seed}/{epoch}"] = {  # type: ignore[index]
                "order": [f"{f}:{g}" for f, g in zip(rg["file"], rg["row_group"], strict=True)],
                "cuts": p.lanes(epoch)["token_start"].to_list(),
                "reads": [
                    f"{w}/{r}/{f}:{g}"
                    for w, r, f, g in zip(
                        reads["window_index"], reads["rank"], reads["file"], reads["row_group"], strict=True
                    )
                ],
            }
        with plitzer.Loader(ix, seed=seed, lanes=4, window=3, seq_len=16) as ld:
            out["batches"][str(seed)] = [  # type: ignore[index]
                hashlib.sha256(np.from_dlpack(ld.next_batch().tokens).tobytes()).hexdigest()[:16] for _ in range(12)
            ]
    return out


def test_golden_order_and_batches(golden_dir: Path) -> None:
    got = compute(golden_dir)
    if os.environ.get("PLITZER_REGEN_GOLDEN") == "1":  # only on purpose: an intended change of order
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    if not GOLDEN.exists():
        pytest.fail(f"{GOLDEN} is missing: restore it from git (PLITZER_REGEN_GOLDEN=1 writes it anew)")
    want = json.loads(GOLDEN.read_text())
    assert got == want


def test_golden_agrees_with_the_reference_model(golden_dir: Path) -> None:
    """The saved order is the spec's: the naive model reproduces it."""
    want = json.loads(GOLDEN.read_text())
    docs = docs_by_row_group(golden_docs())
    names = [f"f{f:03d}.parquet:{g}" for f in range(3) for g in range(4 + f)]
    for seed in (0, 12345, 2**64 - 1):
        for epoch in range(3):
            order = [names[i] for w in epoch_windows(len(names), seed, 3, epoch) for i in w]
            assert want["plans"][f"{seed}/{epoch}"]["order"] == order
        streams = lane_streams(docs, seed, 4, 3, 12)
        batches = [
            hashlib.sha256(
                np.array([[t for t, *_ in s[k * 16 : (k + 1) * 16]] for s in streams], dtype=np.int32).tobytes()
            ).hexdigest()[:16]
            for k in range(12)
        ]
        assert want["batches"][str(seed)] == batches
