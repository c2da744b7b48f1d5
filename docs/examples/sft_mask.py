"""Supervised fine-tuning with a loss mask, mixed with pretraining text (SPEC section 13).

A chat dataset stores, beside each conversation's ``input_ids``, a ``prompt_mask``: one bool
per token, True on the prompt (what the user wrote: the model reads it but is not trained to
produce it), False on the answer. Pretraining text has no such column: the mixture gives it
the fill ``0`` (no prompt, every token is trained on), so SFT data and pretraining text mix
in every batch. plitzer packs the mask with exactly the tokens' cuts, so element ``j`` of
``batch.columns["prompt_mask"]`` is the mask of token ``j``, whatever lane cut or row edge
split the conversation.

The loss of a next-token model at position ``j`` predicts token ``j + 1``: it counts where
token ``j + 1`` is an answer token of the same document (``position_ids`` restarts at 0 at a
document start, so a target with position 0 belongs to the next document). The script
checks that the loss counts exactly the answer tokens that ``batch.documents()`` places in
the batch, and trains a tiny bigram model a few steps::

    python docs/examples/sft_mask.py            # synthetic data, CPU, a few seconds
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from torch import nn

import plitzer
import plitzer.torch
from plitzer.text.source import load_tokenizer

VOCAB = 512
SETTINGS = {"seed": 0, "lanes": 8, "window": 2, "seq_len": 64}


def chars(texts: list[str]) -> list[list[int]]:
    """A tokenizer of characters for the pretraining text (ids below 256)."""
    return [[ord(c) % 256 for c in t] for t in texts]


def write_data(root: Path) -> dict[str, object]:
    """A chat dataset with ``prompt_mask`` and a text dataset; the mixture's sources."""
    rng = np.random.default_rng(0)
    ids, masks = [], []
    for _ in range(400):
        prompt = rng.integers(256, VOCAB, int(rng.integers(3, 20))).tolist()
        answer = [(t * 7) % 256 + 256 for t in prompt]  # the answer is a function of the prompt
        ids.append(prompt + answer)
        masks.append([True] * len(prompt) + [False] * len(answer))
    (root / "chat").mkdir(parents=True)
    table = pa.table({"input_ids": pa.array(ids, pa.list_(pa.int32())), "prompt_mask": pa.array(masks)})
    pq.write_table(table, root / "chat" / "part-0.parquet", row_group_size=50)
    (root / "web").mkdir()
    words = ["the", "loader", "packs", "documents", "into", "rows", "of", "tokens"]
    texts = [" ".join(rng.choice(words, int(rng.integers(5, 30)))) for _ in range(300)]
    pq.write_table(pa.table({"text": texts}), root / "web" / "part-0.parquet", row_group_size=60)
    tokenizer = load_tokenizer(chars, name="chars-v1", eos_id=10, vocab_size=256)
    return {"chat": str(root / "chat"), "web": {"path": str(root / "web"), "tokenizer": tokenizer}}


def trained_targets(batch: plitzer.torch.Batch) -> torch.Tensor:
    """Which positions' next-token targets the loss counts: answers of the same document."""
    prompt = batch.columns["prompt_mask"]
    same_doc = batch.position_ids[:, 1:] != 0
    return ~prompt[:, 1:] & same_doc


def masked_loss(logits: torch.Tensor, tokens: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the kept targets (``keep`` is rows x (seq_len - 1))."""
    per_token = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1), reduction="none")
    weight = keep.reshape(-1).to(per_token.dtype)
    return (per_token * weight).sum() / weight.sum().clamp(min=1)


def answer_targets(batch: plitzer.torch.Batch) -> int:
    """The same count from ``batch.documents()`` and the data alone: answer tokens past a piece's first."""
    total = 0
    mask = batch.source.columns["prompt_mask"]
    for r in batch.documents().iter_rows(named=True):
        row, a, n = r["batch_row"], r["start"], r["length"]
        total += int((~mask[row, a + 1 : a + n]).sum()) if n > 1 else 0
    return total


def main() -> None:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        sources = write_data(Path(tmp))
        model = nn.Sequential(nn.Embedding(VOCAB, 32), nn.Linear(32, VOCAB))
        opt = torch.optim.Adam(model.parameters(), lr=3e-2)
        ds = plitzer.torch.Dataset(sources, columns={"prompt_mask": 0}, **SETTINGS)  # type: ignore[arg-type]
        losses = []
        for step, batch in zip(range(40), ds, strict=False):
            tokens = batch.tokens.long()
            keep = trained_targets(batch)
            # Row edges: a row's first position is a piece start (position 0) only where a
            # document starts there, so the count matches the documents' view of the batch.
            assert int(keep.sum()) == answer_targets(batch), step
            loss = masked_loss(model(tokens), tokens, keep)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        ds.close()
        sources_seen = set(batch.documents()["source"].to_list())
        print(
            f"masked loss {losses[0]:.2f} -> {losses[-1]:.2f} over {len(losses)} steps; sources {sorted(sources_seen)}"
        )
        assert losses[-1] < losses[0]


if __name__ == "__main__":
    main()
