"""``row_group_tokens``, a setting of the kinds that cut their own row groups (SPEC section 21).

A Megatron or numpy source's row group is a run of whole consecutive documents ending at the
first document end at or after ``row_group_tokens`` tokens (default 2**20). Given 200, each
gives the batches of its Parquet copy cut the same way through every entry point: the Loader,
``plitzer.plan``'s ``row_groups`` table, a mixture source's key (a dict and a TOML mixture
file), ``plitzer.torch.Dataset``, ``plitzer.grain.Dataset`` and the CLI's
``--row-group-tokens``. A value that is not an int >= 1, or one given for a source whose row
groups are its files' own (Parquet, Arrow IPC, text), is a ConfigError naming the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import plitzer
from plitzer.cli import main
from plitzer.errors import ConfigError
from plitzer.sources import megatron, olmo_numpy
from tests.sources.test_source_kinds import (
    CFG,
    EOS,
    documents,
    eos_documents,
    rule_groups,
    write_arrow,
    write_megatron,
    write_numpy,
    write_parquet,
)

CUT = 200
NUMPY = {"format": "numpy", "eos_id": EOS, "dtype": "uint16"}
Cut = tuple[str, Path, Path, dict[str, Any], int]
"""A kind's name, its source, its Parquet copy cut at :data:`CUT` tokens, its settings, its row groups there."""


@pytest.fixture(params=["megatron", "numpy"])
def cut(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cut:
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    docs = eos_documents() if request.param == "numpy" else documents()
    (tmp_path / "k").mkdir()
    src = write_numpy(docs, tmp_path / "k") if request.param == "numpy" else write_megatron(docs, tmp_path / "k")
    groups = rule_groups(docs, CUT)
    opts = NUMPY if request.param == "numpy" else {}
    return request.param, src, write_parquet(docs, tmp_path, groups), opts, len(groups)


def _steps(source: Any, steps: int = 6, **opts: Any) -> list[np.ndarray]:
    with plitzer.Loader(source, **CFG, **opts) as ld:
        it = iter(ld)
        return [np.from_dlpack(next(it).tokens).copy() for _ in range(steps)]


def _same(got: list[np.ndarray], want: list[np.ndarray]) -> bool:
    return len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_the_loader_and_plan_cut_at_the_setting(cut: Cut) -> None:
    _, src, ref, opts, n = cut
    assert n > 5  # the documents hold several 200-token groups
    assert _same(_steps(src, row_group_tokens=CUT, **opts), _steps(ref))
    a = plitzer.plan(src, seed=3, lanes=4, window=2, row_group_tokens=CUT, **opts)
    b = plitzer.plan(ref, seed=3, lanes=4, window=2)
    assert len(a.dataset.frame) == n
    assert a.row_groups(0).drop("file").equals(b.row_groups(0).drop("file"))
    whole = plitzer.plan(src, seed=3, lanes=4, window=2, **opts)  # the default, 2**20: one group, the cache's key
    assert len(whole.dataset.frame) == 1 and megatron.ROW_GROUP_TOKENS == olmo_numpy.ROW_GROUP_TOKENS == 1 << 20
    again = plitzer.plan(src, seed=3, lanes=4, window=2, row_group_tokens=100, **opts)
    assert len(again.dataset.frame) == len(rule_groups(eos_documents() if opts else documents(), 100)) > n


def test_a_mixture_sources_key_and_the_loaders_setting(cut: Cut) -> None:
    _, src, ref, opts, n = cut
    mix = {"k": {"path": str(src), "row_group_tokens": CUT, **opts}, "p": str(ref)}
    p = plitzer.plan(mix, seed=3, lanes=4, window=2, seq_len=64)
    assert p.sources().sort("name")["row_groups"].to_list() == [n, n]
    assert _same(_steps(mix), _steps({"k": str(ref), "p": str(ref)}))
    both = _steps({"a": str(src), "b": str(src)}, row_group_tokens=CUT, **opts)  # the loader's: every source's
    assert _same(both, _steps({"a": str(ref), "b": str(ref)}))


def test_the_cli_plans_with_row_group_tokens(cut: Cut, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kind, src, _, opts, n = cut
    flags = [f"--{'data-format' if k == 'format' else k.replace('_', '-')}={v}" for k, v in opts.items()]
    sql = ["--sql", "select count(*) n from row_groups", "--format", "csv"]
    assert main(["plan", str(src), "--row-group-tokens", str(CUT), "--lanes", "4", "--window", "2", *flags, *sql]) == 0
    assert capsys.readouterr().out.split() == ["n", str(n)]
    toml = tmp_path / "mix.toml"
    keys = "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in opts.items())
    toml.write_text(f'[sources.{kind}]\npath = "{src}"\nrow_group_tokens = {CUT}\n{keys}')
    assert main(["plan", "--mixture", str(toml), "--lanes", "4", "--window", "2", *sql]) == 0
    assert capsys.readouterr().out.split() == ["n", str(n)]
    assert main(["index", str(src), "--row-group-tokens", str(CUT), *flags, "--format", "json", "--no-lengths"]) == 0


def test_torch_takes_the_setting(cut: Cut) -> None:
    pytest.importorskip("torch")
    import plitzer.torch

    _, src, ref, opts, _ = cut
    with plitzer.torch.Dataset(src, **CFG, **opts, row_group_tokens=CUT) as ds:
        got = [ds.next_batch().tokens.numpy() for _ in range(4)]
    assert _same(got, _steps(ref, steps=4))


def test_grain_takes_the_setting(cut: Cut) -> None:
    pytest.importorskip("grain")
    import plitzer.grain

    _, src, ref, opts, _ = cut
    got = [np.asarray(el["tokens"]) for el in list(plitzer.grain.Dataset(src, **CFG, **opts, row_group_tokens=CUT))]
    assert _same(got[:4], _steps(ref, steps=4))


@pytest.mark.parametrize("bad", [0, -5, 2.5, "200", True])
def test_a_value_not_an_int_of_at_least_1_is_refused(bad: Any, cut: Cut) -> None:
    _, src, _, opts, _ = cut
    with pytest.raises(ConfigError, match=r"row_group_tokens=.*give an int >= 1"):
        plitzer.Loader(src, row_group_tokens=bad, **CFG, **opts)
    with pytest.raises(ConfigError, match=r"source 'k': row_group_tokens="):
        plitzer.plan({"k": {"path": str(src), "row_group_tokens": bad, **opts}})


def test_the_cli_refuses_a_row_group_tokens_of_0(cut: Cut, capsys: pytest.CaptureFixture[str]) -> None:
    _, src, _, opts, _ = cut
    flags = [f"--{'data-format' if k == 'format' else k.replace('_', '-')}={v}" for k, v in opts.items()]
    assert main(["plan", str(src), "--row-group-tokens", "0", *flags]) == 2
    assert "row_group_tokens=0: give an int >= 1" in capsys.readouterr().err


def test_a_source_whose_row_groups_are_its_files_own_refuses_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ref = write_parquet(documents(), tmp_path)
    ipc = write_arrow(documents(), tmp_path)
    fix = r"row groups are its files' own: leave row_group_tokens out"
    for src, kind in ((ref, "a Parquet"), (ipc, "an Arrow IPC")):
        with pytest.raises(ConfigError, match=f"{kind} source's {fix}"):
            plitzer.Loader(src, row_group_tokens=CUT, **CFG)
        with pytest.raises(ConfigError, match=f"{kind} source's {fix}"):
            plitzer.plan(src, row_group_tokens=CUT)
        with pytest.raises(ConfigError, match="source 'p': row_group_tokens=200 is for Megatron and numpy"):
            plitzer.plan({"p": {"path": str(src), "row_group_tokens": CUT}})
    mm = write_megatron(documents(), tmp_path)
    with pytest.raises(ConfigError, match=f"source 'p': .*a Parquet source's {fix}"):  # the loader's: every source's
        plitzer.Loader({"m": str(mm), "p": str(ref)}, row_group_tokens=CUT, **CFG)
    with pytest.raises(ConfigError, match="a text source's row groups are its Parquet files' own"):
        plitzer.plan({"t": {"path": str(ref), "tokenizer": "tokenizer.json", "row_group_tokens": CUT}})
    assert main(["plan", str(ref), "--row-group-tokens", str(CUT)]) == 2
    assert "a Parquet source's row groups are its files' own" in capsys.readouterr().err
