"""Supervised fine-tuning with whole documents: best-fit packing, its mask and cu_seqlens (SPEC section 15).

Under ``packing="concat"`` a conversation can be cut between two rows: the second row then
trains an answer whose prompt it cannot see. ``packing="best-fit"`` keeps every document of
at most ``seq_len`` tokens whole in one row (best-fit decreasing within each row group), pads
each row with ``pad_id``, and says where: ``batch.mask`` is False on the padding, and the
varlen metadata (``cu_seqlens``, ``position_ids``, ``doc_lengths``) treats the padding as a
segment of its own, so attention never mixes two conversations, or a conversation and padding.

The script writes a chat dataset (a prompt, then an answer that is a function of it, with a
``prompt_mask``), checks that every conversation arrives whole (one piece, from its first
token), and trains a one-layer attention model a few steps with a block-diagonal attention
mask built from ``cu_seqlens`` and a loss over the answer tokens only::

    python docs/examples/whole_documents.py      # synthetic data, CPU, a few seconds
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

VOCAB, PAD = 512, 0
SETTINGS = {"seed": 0, "lanes": 8, "window": 2, "seq_len": 64, "packing": "best-fit", "pad_id": PAD}


def write_chat(root: Path) -> Path:
    """Conversations of 6 to 60 tokens: a prompt, then an answer that is a function of it."""
    rng = np.random.default_rng(0)
    ids, masks = [], []
    for _ in range(600):
        prompt = rng.integers(256, VOCAB, int(rng.integers(3, 30))).tolist()
        answer = [(t * 7) % 255 + 1 for t in prompt]
        ids.append(prompt + answer)
        masks.append([True] * len(prompt) + [False] * len(answer))
    root.mkdir(parents=True)
    table = pa.table({"input_ids": pa.array(ids, pa.list_(pa.int32())), "prompt_mask": pa.array(masks)})
    pq.write_table(table, root / "part-0.parquet", row_group_size=100)
    return root


class TinyAttention(nn.Module):
    """Embedding, one causal self-attention layer inside each document, and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.attn = nn.MultiheadAttention(32, 2, batch_first=True)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, tokens: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        mixed, _ = self.attn(x, x, x, attn_mask=~allowed.repeat_interleave(2, dim=0), need_weights=False)
        return self.head(x + mixed)


def document_attention(batch: plitzer.torch.Batch) -> torch.Tensor:
    """``(rows, L, L)``: token ``i`` may attend to ``j <= i`` of its own segment (a document, or the padding)."""
    rows, length = batch.tokens.shape
    cu = batch.cu_seqlens.long()
    segment = torch.zeros(rows * length, dtype=torch.long)
    segment[cu[1:-1]] = 1
    segment = segment.cumsum(0).reshape(rows, length)
    same = segment[:, :, None] == segment[:, None, :]
    return same & torch.ones(length, length, dtype=torch.bool).tril()


def main() -> None:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        data = write_chat(Path(tmp) / "chat")
        lengths = pq.read_table(data, columns=["input_ids"])["input_ids"].combine_chunks().value_lengths()
        model = TinyAttention()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        ds = plitzer.torch.Dataset(str(data), columns={"prompt_mask": True}, **SETTINGS)  # type: ignore[arg-type]
        losses = []
        for step, batch in zip(range(30), ds, strict=False):
            docs = batch.documents()
            # Every conversation is whole: one piece, from its first token, of its full length.
            assert (docs["token_offset"] == 0).all(), step
            at = (docs["row_group"] * 100 + docs["row"]).to_list()  # the file's rows: 100 a row group
            assert docs["length"].to_list() == [lengths[i].as_py() for i in at], step
            assert int(batch.mask.sum()) == int(docs["length"].sum())  # the mask: the documents' tokens
            assert (batch.tokens[~batch.mask] == PAD).all()
            tokens = batch.tokens.long()
            logits = model(tokens, document_attention(batch))
            # Targets: the next token, where it is an answer token of the same document (not padding).
            keep = batch.mask[:, 1:] & ~batch.columns["prompt_mask"][:, 1:] & (batch.position_ids[:, 1:] != 0)
            per_token = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1), reduction="none")
            weight = keep.reshape(-1).float()
            loss = (per_token * weight).sum() / weight.sum().clamp(min=1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        padding = 1 - float(batch.mask.float().mean())
        ds.close()
        print(
            f"answer loss {losses[0]:.2f} -> {losses[-1]:.2f} over {len(losses)} steps; every conversation "
            f"whole; the last batch {padding:.1%} padding"
        )
        assert losses[-1] < losses[0]


if __name__ == "__main__":
    main()
