"""Hostile checkpoints, atomic saves, lifecycle, and what the code never does."""

from __future__ import annotations

import ast
import json
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import plitzer
from plitzer.state import checkpoint as ckpt
from tests.conftest import SynthDataset

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data(synth_dataset: SynthDataset) -> Path:
    d = synth_dataset(tokens=150_000, seed=2, docs_per_row_group=40, row_groups_per_file=4, mean_length=120)
    return d


CFG = {"seed": 1, "lanes": 8, "window": 2, "seq_len": 64}


@pytest.fixture(scope="module")
def good_state(data: Path) -> bytes:
    with plitzer.Loader(data, **CFG) as ld:
        for _ in range(7):
            ld.next_batch()
        return ld.checkpoint()


@given(st.binary(max_size=400))
def test_random_bytes_only_ever_raise_checkpoint_error(blob: bytes) -> None:
    with pytest.raises(plitzer.CheckpointError):
        ckpt.decode(blob)


@given(data=st.data())
def test_mutated_checkpoints_only_ever_raise_checkpoint_error(good_state: bytes, data: st.DataObject) -> None:
    b = bytearray(good_state)
    kind = data.draw(st.sampled_from(["flip", "truncate", "extend", "splice"]))
    if kind == "flip":
        i = data.draw(st.integers(0, len(b) - 1))
        b[i] ^= data.draw(st.integers(1, 255))
    elif kind == "truncate":
        b = b[: data.draw(st.integers(0, len(b) - 1))]
    elif kind == "extend":
        b += data.draw(st.binary(min_size=1, max_size=50))
    else:
        i = data.draw(st.integers(0, len(b)))
        b[i:i] = data.draw(st.binary(min_size=1, max_size=20))
    with pytest.raises(plitzer.CheckpointError):
        ckpt.decode(bytes(b))


def _forge(doc: object, version: int = ckpt.FORMAT_VERSION) -> bytes:
    """A checkpoint with a valid envelope around any document."""
    import hashlib

    payload = json.dumps(doc).encode()
    head = struct.pack("<8sIQ", b"PLTZCKPT", version, len(payload)) + payload
    return head + hashlib.sha256(head).digest()


def test_well_formed_but_hostile_documents_are_refused(good_state: bytes, data: Path) -> None:
    doc = json.loads(good_state[20:-32])
    bad_docs = [
        [],
        {"config": doc["config"], "step": -1, "lanes": doc["lanes"]},
        {"config": doc["config"], "step": 2**70, "lanes": doc["lanes"]},
        {"config": doc["config"], "step": "3", "lanes": doc["lanes"]},
        {"config": doc["config"], "step": 1, "lanes": [[0, 0, 0, 0]]},
        {"config": doc["config"], "step": 1, "lanes": [[1, 0, 0, 0, 0], [0, 0, 0, 0, 0]]},
        {"config": doc["config"], "step": 1, "lanes": [[99, 0, 0, 0, 0]]},
        {"config": {**doc["config"], "lanes": True}, "step": 1, "lanes": doc["lanes"]},
        {"config": {**doc["config"], "extra": 1}, "step": 1, "lanes": doc["lanes"]},
        {**doc, "more": 1},
    ]
    for bad in bad_docs:
        with pytest.raises(plitzer.CheckpointError):
            ckpt.decode(_forge(bad))
    # Positions past the data are refused when the loader places them.
    far = {**doc, "lanes": [[k, 0, 0, 10**6, 0] for k in range(8)]}
    with plitzer.Loader(data, **CFG) as ld:
        ld.resume(_forge(far))
        with pytest.raises(plitzer.CheckpointError, match="past its slice"):
            ld.next_batch()
    with plitzer.Loader(data, **CFG) as ld, pytest.raises(plitzer.CheckpointError, match="window 99 is out of range"):
        ld.resume(_forge({**doc, "lanes": [[k, 0, 99, 0, 0] for k in range(8)]}))


def test_versions_and_pickles(good_state: bytes) -> None:
    doc = json.loads(good_state[20:-32])
    with pytest.raises(plitzer.CheckpointError, match="upgrade plitzer"):
        ckpt.decode(_forge(doc, version=ckpt.FORMAT_VERSION + 1))
    with pytest.raises(plitzer.CheckpointError, match=r"format version 0 .* format 2 of this plitzer"):
        ckpt.decode(_forge(doc, version=0))
    # A plitzer 0.1 checkpoint (format 1, the first lane rule) is refused naming both
    # versions and the plitzer that wrote it, never misread as a lockstep position.
    with pytest.raises(plitzer.CheckpointError, match=r"format version 1 \(plitzer 0\.1.*format 2 of this plitzer"):
        ckpt.decode(_forge(doc, version=1))

    class Boom:
        def __reduce__(self) -> tuple[object, ...]:
            return (os.system, ("echo pwned > /dev/null",))

    for proto in (2, 4, 5):
        with pytest.raises(plitzer.CheckpointError, match="pickle"):
            ckpt.decode(pickle.dumps(Boom(), protocol=proto))
    with pytest.raises(plitzer.CheckpointError, match="byte cap"):
        ckpt.decode(b"PLTZCKPT" + b"\0" * (ckpt.MAX_BYTES + 1))
    with pytest.raises(plitzer.CheckpointError, match="bytes"):
        ckpt.decode("not bytes")  # type: ignore[arg-type]


def test_checkpoint_is_small_canonical_and_stable(good_state: bytes) -> None:
    assert good_state[:8] == b"PLTZCKPT"
    assert len(good_state) < 1024
    again = ckpt.encode(ckpt.decode(good_state))
    assert again == good_state


_WRITER = """
import sys, plitzer
path, good, other = sys.argv[1], open(sys.argv[2], 'rb').read(), open(sys.argv[3], 'rb').read()
print('ready', flush=True)
i = 0
while True:
    plitzer.save_checkpoint(path, good if i % 2 else other)
    i += 1
"""


def test_save_checkpoint_survives_sigkill(tmp_path: Path, good_state: bytes, data: Path) -> None:
    with plitzer.Loader(data, **CFG) as ld:
        other = ld.checkpoint()
    (tmp_path / "a").write_bytes(good_state)
    (tmp_path / "b").write_bytes(other)
    target = tmp_path / "ckpt.bin"
    plitzer.save_checkpoint(target, other)
    rng = np.random.default_rng(0)
    for _ in range(5):
        p = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(target), str(tmp_path / "a"), str(tmp_path / "b")],
            stdout=subprocess.PIPE,
        )
        assert p.stdout is not None
        p.stdout.readline()
        time.sleep(float(rng.uniform(0.01, 0.08)))
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        got = plitzer.load_checkpoint(target)  # whole and valid, one of the two
        assert got in (good_state, other)


def test_close_stops_threads_and_with_block(data: Path) -> None:
    before = {t.ident for t in threading.enumerate()}
    with plitzer.Loader(data, **CFG) as ld:
        ld.next_batch()
        assert any(t.name.startswith("plitzer") for t in threading.enumerate())
    leaked = [t for t in threading.enumerate() if t.ident not in before and t.name.startswith("plitzer")]
    assert not leaked
    with pytest.raises(plitzer.UsageError, match="closed"):
        ld.next_batch()


def test_abandoned_loader_is_collected(data: Path) -> None:
    import gc
    import weakref

    ld = plitzer.Loader(data, **CFG)
    ld.next_batch()
    ref = weakref.ref(ld)
    del ld
    gc.collect()
    assert ref() is None
    time.sleep(0.05)
    assert not [t for t in threading.enumerate() if t.name.startswith("plitzer-scan")]


def test_interrupted_step_leaves_a_usable_checkpoint(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with plitzer.Loader(data, **CFG) as ref:
        want = [np.from_dlpack(ref.next_batch().tokens).copy() for _ in range(60)]
    with plitzer.Loader(data, **CFG) as ld:
        for _ in range(5):
            ld.next_batch()
        real = ld._schedule.get
        calls = {"n": 0}

        def flaky(run: object, unit: int) -> object:
            calls["n"] += 1
            if calls["n"] == 1:
                raise KeyboardInterrupt
            return real(run, unit)  # type: ignore[arg-type]

        monkeypatch.setattr(ld._schedule, "get", flaky)
        hit = False
        for t in range(5, 60):
            try:
                got = np.from_dlpack(ld.next_batch().tokens)
            except KeyboardInterrupt:
                hit = True
                state = ld.checkpoint()
                with plitzer.Loader(data, **CFG) as other:
                    other.resume(state)
                    np.testing.assert_array_equal(np.from_dlpack(other.next_batch().tokens), want[t])
                got = np.from_dlpack(ld.next_batch().tokens)  # and the same loader goes on
            np.testing.assert_array_equal(got, want[t])
        assert hit


def test_two_loaders_in_one_process_do_not_interfere(data: Path) -> None:
    with plitzer.Loader(data, **CFG) as a, plitzer.Loader(data, **{**CFG, "seed": 2}) as b:
        xa = [np.from_dlpack(a.next_batch().tokens).copy() for _ in range(6)]
        xb = [np.from_dlpack(b.next_batch().tokens).copy() for _ in range(6)]
    with plitzer.Loader(data, **CFG) as a2:
        for x in xa:
            np.testing.assert_array_equal(np.from_dlpack(a2.next_batch().tokens), x)
    assert not all(np.array_equal(x, y) for x, y in zip(xa, xb, strict=True))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_after_start_is_refused(data: Path) -> None:
    code = f"""
import os, sys, plitzer
ld = plitzer.Loader({str(data)!r}, seed=1, lanes=8, window=2, seq_len=64)
ld.next_batch()
pid = os.fork()
if pid == 0:
    try:
        ld.next_batch()
    except plitzer.UsageError as e:
        os._exit(0 if 'fork' in str(e) else 3)
    os._exit(4)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""
    r = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], check=False, timeout=60, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr


def test_source_never_loads_untrusted_data() -> None:
    """No eval/exec, pickle.load(s), marshal or torch.load (but with weights_only=True) in the packages."""
    import importlib

    bad = []
    for pkg in ("planner", "plitzer"):
        # The package as imported: the checkout, or the installed wheel.
        folder = Path(importlib.import_module(pkg).__file__ or "").parent
        files = sorted(folder.rglob("*.py"))
        assert len(files) > 5, folder
        for path in files:
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Call):
                    f = node.func
                    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                    owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
                    safe = owner == "torch" and any(
                        k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                        for k in node.keywords
                    )
                    if name in ("eval", "exec") or (
                        owner in ("pickle", "marshal", "torch") and name in ("load", "loads") and not safe
                    ):
                        bad.append(f"{path.relative_to(folder.parent)}:{node.lineno} {owner}.{name}")
    assert not bad, bad


def test_checkpoint_paths_are_relative(good_state: bytes, data: Path) -> None:
    assert str(data).encode() not in good_state
    assert b"/" not in good_state[20:-32] or b"s3://" not in good_state
