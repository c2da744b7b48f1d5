"""One line for every mistake: each subcommand given bad input prints one ``plitzer: error:`` line, exits 2.

Bad SQL of every DuckDB error class a query can raise, bad mixture files, bad ranges,
unreadable paths, unknown stores, bad settings, and a seeded fuzz of argument lists:
never a traceback, never another status. ``--debug`` and ``PLITZER_DEBUG=1`` show the
traceback for a bug report.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from plitzer.cli import main
from tests.conftest import SynthDataset

FLAGS = ["--lanes", "4", "--window", "2"]

# A query for each DuckDB error class a user's query can meet.
SQL = {
    "parser": "selec 1",
    "binder (column)": "select nosuch from reads",
    "binder (the window keyword)": "select window from row_groups",
    "catalog": "select * from nosuch",
    "conversion": "select 'a'::int",
    "out of range": "select 9223372036854775807::bigint + 1",
    "invalid input": "select error('boom')",
    "type mismatch": "select list_extract(1, 'x')",
    "permission": "select * from read_csv('/etc/hostname')",
}


@pytest.fixture(scope="module")
def data(synth_dataset: SynthDataset) -> Path:
    return synth_dataset(tokens=20_000, seed=5, docs_per_row_group=20, row_groups_per_file=2, mean_length=100)


@pytest.fixture(scope="module")
def bad(data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Files that are wrong in one way each."""
    d = tmp_path_factory.mktemp("bad")
    (d / "not.parquet").write_bytes(b"this is not parquet")
    (d / "syntax.toml").write_text("[sources.web\npath = 1\n")
    (d / "unknown_key.toml").write_text(f'[sources.web]\npath = "{data}"\nwieght = 2\n')
    (d / "no_path.toml").write_text("[sources.web]\nweight = 2\n")
    (d / "missing_data.toml").write_text(f'[sources.web]\npath = "{d / "nowhere"}"\n')
    (d / "empty.toml").write_text("")
    (d / "binary.toml").write_bytes(bytes(range(256)))
    (d / "a_file").write_text("x")
    _hostile_checkpoints(d)
    return {p.name: p for p in d.iterdir()}


def _signed(doc: object, *, raw: bytes | None = None) -> bytes:
    """Checkpoint bytes with a valid header and digest around ``doc`` (JSON) or ``raw``: only the content is bad."""
    import hashlib
    import json

    from plitzer.state import checkpoint as ckpt

    payload = raw if raw is not None else json.dumps(doc).encode()
    head = ckpt._HEADER.pack(ckpt.MAGIC, ckpt.FORMAT_VERSION, len(payload)) + payload
    return head + hashlib.sha256(head).digest()


def _hostile_checkpoints(d: Path) -> None:
    import pickle

    from plitzer.state import checkpoint as ckpt

    good = _signed({"config": {}, "step": 0, "lanes": []})
    (d / "truncated.ckpt").write_bytes(good[:-40])
    (d / "pickle.ckpt").write_bytes(pickle.dumps({"step": 1}))
    (d / "garbage.ckpt").write_bytes(bytes(range(256)) * 4)
    (d / "edited.ckpt").write_bytes(good[:-33] + bytes([good[-33] ^ 1]) + good[-32:])  # the digest no longer matches
    (d / "newer.ckpt").write_bytes(ckpt._HEADER.pack(ckpt.MAGIC, ckpt.FORMAT_VERSION + 1, 2) + b"{}" + bytes(32))
    (d / "not_json.ckpt").write_bytes(_signed(None, raw=b"\xff\xfe not json"))
    (d / "deep.ckpt").write_bytes(_signed(None, raw=b"[" * 200_000 + b"]" * 200_000))  # RecursionError bait
    (d / "wrong_doc.ckpt").write_bytes(_signed({"config": "x", "step": -1, "lanes": "all"}))
    (d / "huge_numbers.ckpt").write_bytes(_signed({"config": {}, "step": 10**400, "lanes": [[0, 0, 0, 0, 0]]}))
    with (d / "oversized.ckpt").open("wb") as f:  # sparse: its size alone is refused, nothing is read
        f.truncate(ckpt.MAX_BYTES + 1)


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, (argv, code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("plitzer: error: "), (argv, err)
    assert "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("kind", list(SQL))
def test_bad_sql_of_every_duckdb_class_is_one_line(kind: str, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line(capsys, ["plan", data, *FLAGS, "--sql", SQL[kind]])
    if kind.startswith(("binder", "catalog", "parser")):
        assert "window_index" in line and "row_groups" in line, line  # the fix: the tables and the column


def _cases(data: Path, bad: dict[str, Path]) -> list[list[str | Path]]:
    nowhere = data.parent / "no-such-folder"
    return [
        # unreadable paths and files that are not Parquet
        ["plan", nowhere, *FLAGS],
        ["plan", bad["not.parquet"], *FLAGS],
        ["index", nowhere],
        ["index", bad["not.parquet"]],
        ["explain", nowhere, "--step", "0", *FLAGS],
        ["locate", nowhere, "--where", "true", *FLAGS],
        ["audit", nowhere, *FLAGS],
        ["tokenize", nowhere, data.parent / "out", "--tokenizer", bad["a_file"]],
        ["tokenize", data, data.parent / "out", "--tokenizer", nowhere / "t.model"],
        # unknown stores
        ["plan", "nosuch://bucket/prefix", *FLAGS],
        ["index", "ftp://127.0.0.1/x"],
        # bad settings
        ["plan", data, "--lanes", "0", "--window", "2"],
        ["plan", data, "--lanes", "4", "--window", "2", "--world", "3"],
        ["plan", data, "--lanes", "x"],
        ["plan", data, *FLAGS, "--epoch", "nope"],
        ["plan", data, *FLAGS, "--where", "tokens > 0; select 1"],
        ["plan", data, *FLAGS, "--where", "id in (select 1)"],
        ["plan", data, *FLAGS, "--column", "nosuch"],
        ["plan", data, *FLAGS, "--nosuch-option"],
        ["explain", data, "--step", "-1", *FLAGS],
        ["explain", data, "--step", "0", "--lane", "99", *FLAGS],
        ["explain", data, *FLAGS],  # --step missing
        # bad ranges
        ["locate", data, "--where", "true", "--epochs", "3:1", *FLAGS],  # empty
        ["locate", data, "--where", "true", "--epochs", "2:2", *FLAGS],
        ["locate", data, "--where", "true", "--epochs", "a:b", *FLAGS],
        ["locate", data, "--where", "true", "--epochs", "-2", *FLAGS],
        ["locate", data, "--where", "true", "--steps", "x", *FLAGS],
        ["locate", data, "--where", "true", "--steps", "9:2", *FLAGS],
        ["locate", data, "--row", "nosuch.parquet:1", *FLAGS],
        ["locate", data, "--row", "garbage", *FLAGS],
        ["audit", data, *FLAGS, "--steps", "-5", "--out", data.parent / "audit-out"],
        # bad mixture files
        *(["plan", "--mixture", bad[name], *FLAGS] for name in bad if name.endswith(".toml")),
        ["plan", "--mixture", nowhere / "mix.toml", *FLAGS],
        ["plan", data, "--mixture", bad["syntax.toml"], *FLAGS],
        # output where it cannot go
        ["plan", data, *FLAGS, "--table", "index", "--out", bad["a_file"] / "x.csv"],
        ["synth", bad["a_file"] / "sub", "--tokens", "1000"],
        ["synth", data.parent / "synth-neg", "--tokens", "-1"],
        # bad and hostile checkpoint files (each refused naming the file), parts that are not one run's
        *(["checkpoint", bad[name]] for name in sorted(bad) if name.endswith(".ckpt")),
        ["checkpoint", bad["a_file"]],
        ["checkpoint", data],  # a folder
        ["checkpoint", nowhere / "x.ckpt"],
        ["checkpoint"],
        # no command, an unknown one
        [],
        ["nosuch"],
    ]


def test_every_subcommand_given_bad_input_prints_one_line(
    data: Path, bad: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PLITZER_DEBUG", raising=False)
    for argv in _cases(data, bad):
        try:
            _one_line(capsys, [str(a) for a in argv])
        except SystemExit as e:  # argparse's own exits go through the same one line
            code, err = e.code, capsys.readouterr().err
            assert code == 2, (argv, err)
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("plitzer: error: "), (argv, err)


def test_fuzzed_argument_lists_never_give_a_traceback(
    data: Path, bad: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seeded: commands with options and values drawn from good and bad ones; each ends 0 or with one line, 2."""
    monkeypatch.delenv("PLITZER_DEBUG", raising=False)
    rng = random.Random(47)
    commands = ["plan", "explain", "locate", "index"]
    options = ["--lanes", "--window", "--world", "--seed", "--epoch", "--step", "--lane", "--epochs", "--steps"]
    options += ["--where", "--column", "--table", "--format", "--rank", "--seq-len", "--sql", "--row"]
    values = ["0", "1", "2", "-1", "3:1", "0:2", "x", "", "1e9", "99999999999999999999", "tokens", "index"]
    values += ["select 1", "id >", "'", ";", "part-00000.parquet:0", str(bad["not.parquet"]), "csv", "nosuch"]
    for _ in range(60):
        argv = [rng.choice(commands), str(data)]
        for _ in range(rng.randrange(1, 5)):
            argv += [rng.choice(options), rng.choice(values)]
        try:
            code = main(argv)
        except SystemExit as e:
            code = int(e.code or 0)
        cap = capsys.readouterr()
        assert "Traceback" not in cap.err, (argv, cap.err)
        if code != 0:
            lines = cap.err.strip().splitlines()
            assert code == 2 and len(lines) == 1 and lines[0].startswith("plitzer: error: "), (argv, code, cap.err)


def _env(**extra: str) -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[2])
    env = {k: v for k, v in os.environ.items() if k != "PLITZER_DEBUG"}
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (env.get("PYTHONPATH"), root) if p), **extra}


def test_debug_shows_the_traceback() -> None:
    """Without: one line. With --debug, or PLITZER_DEBUG=1: the traceback, then the same line."""
    argv = [sys.executable, "-m", "plitzer", "plan", "--lanes", "4", "nosuch-folder", "--sql", "selec 1"]
    plain = subprocess.run(argv, check=False, capture_output=True, text=True, env=_env(), timeout=120)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr, plain.stderr
    assert plain.stderr.strip().splitlines() == [plain.stderr.strip()], plain.stderr
    flag = [*argv[:3], "--debug", *argv[3:]]
    for how, env in (("flag", _env()), ("env", _env(PLITZER_DEBUG="1"))):
        got = subprocess.run(
            flag if how == "flag" else argv, check=False, capture_output=True, text=True, env=env, timeout=120
        )
        assert got.returncode == 2, (how, got.stderr)
        assert "Traceback (most recent call last)" in got.stderr, (how, got.stderr)
        assert got.stderr.strip().splitlines()[-1] == plain.stderr.strip(), (how, got.stderr)


def test_checkpoint_describes_a_file_and_merges_every_rank_s_part(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import plitzer
    from plitzer.state.checkpoint import decode

    parts = []
    for rank in (0, 1):
        with plitzer.Loader(data, lanes=4, window=2, seq_len=64, rank=rank, world=2) as ld:
            ld.next_batch()
            ld.next_batch()
            path = tmp_path / f"rank-{rank}.ckpt"
            plitzer.save_checkpoint(path, ld.checkpoint())
            parts.append(path)
    assert main(["checkpoint", str(parts[0]), "--format", "csv"]) == 0
    out = capsys.readouterr().out
    assert "step,lanes,lanes_of_the_step,whole,parts" in out and "\n2,2,4,false,1," in out, out
    merged = tmp_path / "merged.ckpt"
    assert main(["checkpoint", *map(str, parts), "--out", str(merged), "--format", "csv"]) == 0
    out = capsys.readouterr().out
    assert "\n2,4,4,true,2," in out and f"wrote {merged}" in out, out
    assert "seq_len,64" in out and "lanes,4" in out, out
    assert decode(merged.read_bytes()).step == 2
    assert merged.read_bytes() == plitzer.merge([p.read_bytes() for p in parts])
    # the same part twice is not two ranks' parts: one line, naming the overlap
    line = _one_line(capsys, ["checkpoint", parts[0], parts[0]])
    assert "overlap" in line, line
    line = _one_line(capsys, ["checkpoint", tmp_path / "nosuch.ckpt"])
    assert "nosuch.ckpt" in line, line


def test_every_bad_checkpoint_file_is_refused_naming_it_and_what_is_wrong(
    bad: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    why = {
        "truncated.ckpt": "truncated",
        "pickle.ckpt": "never unpickles",
        "garbage.ckpt": "magic",
        "edited.ckpt": "checksum mismatch",
        "newer.ckpt": "upgrade plitzer",
        "not_json.ckpt": "unreadable document",
        "deep.ckpt": "unreadable document",
        "wrong_doc.ckpt": "config must have exactly",
        "huge_numbers.ckpt": "config must have exactly",
        "oversized.ckpt": "byte cap",
    }
    assert sorted(why) == sorted(n for n in bad if n.endswith(".ckpt"))
    for name, reason in why.items():
        line = _one_line(capsys, ["checkpoint", bad[name]])
        assert name in line and reason in line, (name, line)
