"""The clients' edges: each entry point refuses what the others refuse, with the same words.

``pad_id`` is checked once (:func:`planner.rules.check_pad_id`) against the batches' token
dtype at construction and plan time, by the Loader, ``plitzer.plan``, the command line,
``plitzer.torch`` and ``plitzer.grain``; ``plitzer plan --packing best-fit`` needs
``--seq-len`` as ``plitzer.plan`` needs ``seq_len=``; the help names every kind of source and
the token column's real default; synth names its token column as asked; the audit's padding
floor is a fraction of the floor's own bins.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import planner
import plitzer
import plitzer.synth
from planner.catalog.column import TOKEN_NAMES
from planner.errors import ConfigError
from plitzer.audit import audit, tables
from plitzer.cli import main
from tests.conftest import write_dataset

KW = {"lanes": 2, "window": 2, "seq_len": 16}


def _docs(n: int = 6) -> list[list[list[list[int]]]]:
    """One file of ``n`` row groups of three documents (5, 9 and 12 tokens)."""
    return [
        [
            [[(g * 31 + d * 7 + i) % 1000 for i in range(length)] for d, length in enumerate((5, 9, 12))]
            for g in range(n)
        ]
    ]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("edges")
    write_dataset(d, _docs())
    return d


def _refused(what: str, value: int, dtype: str) -> str:
    return f"pad_id={value} does not fit the batches: column 'tokens' of {what} gives {dtype} token batches"


@pytest.mark.parametrize("packing", ["best-fit", "concat"])
def test_the_loader_refuses_a_pad_id_its_batches_cannot_hold(data: Path, packing: str) -> None:
    """2**31 in int32 batches: a ConfigError at construction (was numpy's OverflowError at the first batch)."""
    epochs = {"epochs": 1} if packing == "concat" else {}  # a finite run pads its end with pad_id
    with pytest.raises(ConfigError, match=r"0\.\.2147483647") as e:
        plitzer.Loader(data, packing=packing, pad_id=2**31, **epochs, **KW)
    assert str(e.value).startswith(_refused(str(data), 2**31, "int32"))
    with plitzer.Loader(data, packing=packing, pad_id=2**31 - 1, **epochs, **KW) as ld:  # the largest that fits
        assert int(np.from_dlpack(ld.next_batch().tokens).max()) <= 2**31 - 1


def test_uint32_batches_hold_pad_ids_up_to_2_32(tmp_path: Path) -> None:
    write_dataset(tmp_path, _docs(), dtype="uint32")
    with plitzer.Loader(tmp_path, packing="best-fit", pad_id=2**32 - 1, **KW) as ld:
        assert ld.next_batch().tokens.dtype == np.uint32
    with pytest.raises(ConfigError, match=r"gives uint32 token batches, which hold 0\.\.4294967295"):
        plitzer.Loader(tmp_path, packing="best-fit", pad_id=2**32, **KW)


@pytest.mark.parametrize("pad_id", [-1, 2**31])
def test_plan_refuses_what_the_loader_refuses(data: Path, pad_id: int) -> None:
    """``plitzer.plan`` accepted any pad_id (-1 planned without a word)."""
    with pytest.raises(ConfigError) as planned:
        plitzer.plan(data, packing="best-fit", pad_id=pad_id, **KW)
    with pytest.raises(ConfigError) as loaded:
        plitzer.Loader(data, packing="best-fit", pad_id=pad_id, **KW)
    assert str(planned.value) == str(loaded.value)
    assert f"pad_id={pad_id} " in str(planned.value) and "pad or EOS id" in str(planned.value)


def test_a_mixture_names_its_columns(data: Path) -> None:
    with pytest.raises(ConfigError, match=r"column 'a=tokens,b=tokens' of .* gives int32"):
        plitzer.plan({"a": data, "b": data}, packing="best-fit", pad_id=2**31, **KW)


@pytest.mark.parametrize("command", ["plan", "explain", "audit"])
def test_the_command_line_refuses_a_pad_id(
    data: Path, command: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``plitzer plan --pad-id -1`` exited 0."""
    more = {"explain": ["--step", "0"], "audit": ["--out", str(tmp_path / "a.html")]}.get(command, [])
    for pad in ("-1", str(2**31)):
        argv = [command, str(data), "--packing", "best-fit", "--pad-id", pad, "--lanes", "2", "--window", "2"]
        assert main([*argv, "--seq-len", "16", *more]) != 0
        assert f"pad_id={pad} " in capsys.readouterr().err


def test_the_torch_dataset_refuses_a_pad_id_at_construction(data: Path) -> None:
    torch_adapter = pytest.importorskip("plitzer.torch")
    with pytest.raises(ConfigError, match=re.escape(_refused(str(data), 2**31, "int32"))):
        torch_adapter.Dataset(data, packing="best-fit", pad_id=2**31, **KW)


def test_the_grain_dataset_refuses_a_pad_id_before_its_first_element(data: Path) -> None:
    """Its sign at construction; its range when the iterator opens the data, never at a batch."""
    grain_adapter = pytest.importorskip("plitzer.grain")
    with pytest.raises(ConfigError, match="pad_id=-1 is negative"):
        grain_adapter.Dataset(data, packing="best-fit", pad_id=-1, **KW)
    dataset = grain_adapter.Dataset(data, packing="best-fit", pad_id=2**31, **KW)
    with pytest.raises(ConfigError, match=re.escape(_refused(str(data), 2**31, "int32"))):
        iter(dataset)


def test_plan_best_fit_needs_seq_len_on_the_command_line(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It planned at 2048 without a word, where ``plitzer.plan`` refuses: now the same refusal."""
    with pytest.raises(ConfigError) as api:
        plitzer.plan(data, packing="best-fit", lanes=2, window=2)
    assert main(["plan", str(data), "--packing", "best-fit", "--lanes", "2", "--window", "2"]) != 0
    assert str(api.value) in capsys.readouterr().err
    assert main(["plan", str(data), "--lanes", "2", "--window", "2", "--table", "steps"]) == 0  # concat: 2048
    assert main(["plan", str(data), "--packing", "best-fit", "--seq-len", "16", "--lanes", "2"]) == 0


def test_a_mixture_file_s_best_fit_needs_seq_len_too(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mix = tmp_path / "mix.toml"
    mix.write_text(f'packing = "best-fit"\n[sources.a]\npath = "{data}"\n[sources.b]\npath = "{data}"\n')
    assert main(["plan", "--mixture", str(mix), "--lanes", "2", "--window", "2"]) != 0
    assert "give seq_len= too" in capsys.readouterr().err
    assert main(["plan", "--mixture", str(mix), "--lanes", "2", "--window", "2", "--seq-len", "16"]) == 0


def test_plan_help_names_the_sources_and_the_column_default(capsys: pytest.CaptureFixture[str]) -> None:
    """The help named no Arrow source, and a column default (list<int32|uint32>) the README contradicts."""
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for kind in ("Parquet", ".parquet", "save_to_disk", ".arrow", "s3://", "hf://", "https://"):
        assert kind in text, kind
    assert "named input_ids, tokens or token_ids, else the only integer-list column" in text
    assert TOKEN_NAMES == ("input_ids", "tokens", "token_ids")  # the code's rule, which the README says
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    assert "integer-list column named `input_ids`, `tokens` or `token_ids`" in readme
    assert "else the only integer-list column" in readme


def test_synth_names_its_token_column(tmp_path: Path) -> None:
    """The same tokens under ``input_ids`` (the README's mixture source), found without column=."""
    plitzer.synth.write(tmp_path / "a", tokens=20_000, seed=4, docs_per_row_group=30)
    plitzer.synth.write(tmp_path / "b", tokens=20_000, seed=4, docs_per_row_group=30, column="input_ids")
    assert planner.index(tmp_path / "b").column == "input_ids"
    with plitzer.Loader(tmp_path / "a", **KW) as a, plitzer.Loader(tmp_path / "b", **KW) as b:
        for _ in range(5):
            assert np.array_equal(np.from_dlpack(a.next_batch().tokens), np.from_dlpack(b.next_batch().tokens))
    with pytest.raises(ValueError, match="metadata"):
        plitzer.synth.write(tmp_path / "c", tokens=100, column="score")


def test_the_padding_floor_is_a_fraction_of_its_own_bins(tmp_path: Path) -> None:
    """Worked by hand: three documents of 33 tokens at L = 64.

    Best-fit needs 3 bins (33 + 33 > 64): 192 tokens, 93 padding (93/192). The floor of
    whole row groups is ceil(99 / 64) = 2 bins: 128 tokens, 29 padding, so 29/128 (it was
    29/192, the floor's padding over best-fit's bins).
    """
    write_dataset(tmp_path, [[[[7] * 33, [8] * 33, [9] * 33]]])
    p = plitzer.plan(tmp_path, packing="best-fit", lanes=1, window=1, seq_len=64)
    row = tables.padding(p, 0).row(0, named=True)
    assert (row["bins"], row["tokens"], row["padding"], row["floor_bins"]) == (3, 99, 93, 2)
    assert row["padding_fraction"] == pytest.approx(93 / 192)
    assert row["floor_fraction"] == pytest.approx(29 / 128)


def test_the_audit_s_padding_total_floor(tmp_path: Path) -> None:
    """Two row groups (99 tokens in 3 bins, 64 in 1): the floor is 3 bins, 192 - 163 = 29 padding: 29/192."""
    write_dataset(tmp_path, [[[[7] * 33, [8] * 33, [9] * 33], [[5] * 64]]])
    report = audit(tmp_path, packing="best-fit", lanes=1, window=2, seq_len=64)
    row = report.tables["padding"].row(0, named=True)
    assert (row["bins"], row["floor_bins"]) == (4, 3)
    assert row["floor_fraction"] == pytest.approx(29 / 192)
    assert row["padding_fraction"] == pytest.approx((256 - 163) / 256)
