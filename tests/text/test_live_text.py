"""Text sources in a mixture (SPEC sections 8 and 9): a text source beside a token source gives
the batches of the same mixture with the text tokenized first by ``plitzer tokenize``."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import plitzer
from plitzer.text.source import TextIndex, load_tokenizer
from plitzer.text.tokenize import tokenize
from tests.conftest import tokens_of
from tests.share_fixtures import char_tokenizer, chars, utf8_bytes

CFG = {"seed": 9, "lanes": 4, "window": 2, "seq_len": 24}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("textmix")
    rng = random.Random(4)
    words = ["loader", "packs", "tokens", "déjà", "vu", "東京", "x", "Ω", "1234"]
    for f in range(2):
        docs = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 12))) for _ in range(90)]
        (root / "prose").mkdir(exist_ok=True)
        pq.write_table(pa.table({"text": docs}), root / "prose" / f"{f}.parquet", row_group_size=15)
    plitzer.synth.write(root / "code", tokens=12_000, seed=3, docs_per_row_group=10, mean_length=40, vocab=997)
    tok = char_tokenizer()
    tokenize(root / "prose", root / "prose-tok", tokenizer=tok, jobs=1, progress=False)
    return {"prose": root / "prose", "tok": root / "prose-tok", "code": root / "code"}


def _text_mix(data: dict[str, Path], tokenizer: object = None) -> dict[str, object]:
    tok = tokenizer or char_tokenizer()
    return {"prose": {"path": str(data["prose"]), "tokenizer": tok, "text_column": "text"}, "code": str(data["code"])}


def _run(loaders: list[plitzer.Loader], n: int) -> list[np.ndarray]:
    return [np.concatenate([tokens_of(ld.next_batch()) for ld in loaders]) for _ in range(n)]


def test_text_source_equals_the_tokenized_one(data: dict[str, Path]) -> None:
    weights = [(0, {"prose": 1, "code": 1}), (30, {"prose": 3, "code": 1})]
    tokenized = {"prose": str(data["tok"]), "code": str(data["code"])}
    with plitzer.Loader(tokenized, weights=weights, **CFG) as ref:
        steps = 3 * ref.tokens // (CFG["lanes"] * CFG["seq_len"])  # three mixture epochs
        want = _run([ref], steps)
    for world in (1, 2):
        loaders = [plitzer.Loader(_text_mix(data), weights=weights, world=world, rank=r, **CFG) for r in range(world)]
        assert isinstance(loaders[0].plan.mixture.parts[1], TextIndex)  # prose: tokenized as read
        got = _run(loaders, steps)
        for t in range(steps):
            np.testing.assert_array_equal(got[t], want[t], err_msg=f"world {world}, step {t}")
        state = plitzer.merge([ld.checkpoint() for ld in loaders])
        for ld in loaders:
            ld.close()
    # Resume at random steps in another world; a live change on a text mixture.
    for at in sorted(random.Random(1).sample(range(1, steps - 6), 3)):
        with plitzer.Loader(_text_mix(data), weights=weights, world=2, rank=1, **CFG) as a:
            a.seek(at)
            part = a.checkpoint()
        with plitzer.Loader(_text_mix(data), weights=weights, world=2, rank=1, **CFG) as b:
            b.resume(part)
            for t in range(5):
                np.testing.assert_array_equal(tokens_of(b.next_batch()), want[at + t][2:])
    with plitzer.Loader(_text_mix(data), weights=weights, **CFG) as c:
        c.seek(40)
        at = c.set_weights({"prose": 1, "code": 4})
        live = _run([c], 20)
    with plitzer.Loader(tokenized, weights=[*weights, (at, {"prose": 1, "code": 4})], **CFG) as d:
        d.seek(40)
        for t in range(20):
            np.testing.assert_array_equal(live[t], tokens_of(d.next_batch()))
    # Another tokenizer is another source: its checkpoint is refused, naming the sources.
    other = load_tokenizer(utf8_bytes, name="bytes-v1", eos_id=997, vocab_size=998)
    with plitzer.Loader(_text_mix(data, other), weights=weights, **CFG) as e:
        with pytest.raises(plitzer.CheckpointError, match="sources: checkpoint"):
            e.resume(state)


def test_text_source_mistakes(data: dict[str, Path]) -> None:
    with pytest.raises(plitzer.ConfigError, match="without a tokenizer"):
        plitzer.Loader({"prose": {"path": str(data["prose"]), "text_column": "text"}, "code": str(data["code"])})
    with pytest.raises(plitzer.ConfigError, match="tokenizer= with a mixture: give each text source its own"):
        plitzer.Loader({"prose": str(data["prose"]), "code": str(data["code"])}, tokenizer=chars)
    with pytest.raises(plitzer.ConfigError, match="planner does not run"):
        plitzer.plan(_text_mix(data), lanes=4, window=2)
    # A text source whose ids need uint32 beside int32 tokens: a batch has one dtype.
    wide = load_tokenizer(chars, name="chars-wide-v1", eos_id=997, vocab_size=2**32)
    with pytest.raises(plitzer.ConfigError, match=r"different token dtypes \(code: int32, prose: uint32\)"):
        plitzer.Loader(_text_mix(data, wide), **CFG)
