"""Train a tiny causal LM on plitzer batches with per-document (varlen) attention.

Each row of a plitzer batch is ``seq_len`` real tokens packed from several
documents. A token must attend only to earlier tokens *of its own document*, so
the attention mask is block-diagonal: built here from ``batch.cu_seqlens`` (the
same boundaries ``flash_attn_varlen_func`` takes), with ``batch.position_ids``
(restarting at 0 in each document) for the position embedding. The loss skips
the targets that would cross into the next document.

Model, optimizer and data are checkpointed together at one step, then a fresh
run resumes from that checkpoint and must reproduce the uninterrupted losses.

    python docs/examples/train_tiny.py            # a tiny synthetic dataset, CPU, a few seconds
    python docs/examples/train_tiny.py DATA_DIR   # your pre-tokenized Parquet
    torchrun --nproc-per-node 2 docs/examples/train_tiny.py   # two ranks (gloo on CPU), one machine
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

import plitzer
import plitzer.torch


class TinyLM(nn.Module):
    """Embedding, one pre-norm attention block with a per-document causal mask, tied head."""

    def __init__(self, vocab: int, seq_len: int, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq_len, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.norm_out = nn.LayerNorm(dim)
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, tokens: torch.Tensor, position_ids: torch.Tensor, doc_ids: torch.Tensor) -> torch.Tensor:
        rows, length = tokens.shape
        x = self.embed(tokens) + self.pos(position_ids)
        q, k, v = self.qkv(self.norm1(x)).view(rows, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        causal = torch.ones(length, length, dtype=torch.bool, device=tokens.device).tril()
        same_doc = doc_ids[:, :, None] == doc_ids[:, None, :]
        mask = (causal & same_doc)[:, None]  # (rows, 1, L, L): block-diagonal and causal
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(a.transpose(1, 2).reshape(rows, length, -1))
        x = x + self.mlp(self.norm2(x))
        return self.norm_out(x) @ self.embed.weight.T  # logits


def document_ids(batch: plitzer.torch.Batch) -> torch.Tensor:
    """(rows, seq_len) index of the document piece each token belongs to, from cu_seqlens."""
    cu = batch.cu_seqlens.long()
    pieces = torch.arange(len(cu) - 1, device=cu.device)
    return torch.repeat_interleave(pieces, cu.diff()).view(batch.tokens.shape)


def train_step(model: TinyLM, opt: torch.optim.Optimizer, batch: plitzer.torch.Batch, vocab: int) -> float:
    tokens = batch.tokens.long() % vocab  # a toy vocabulary; a real model uses the tokenizer's
    docs = document_ids(batch)
    logits = model(tokens, batch.position_ids.long(), docs)
    same = docs[:, 1:] == docs[:, :-1]  # never predict the first token of the next document
    loss = F.cross_entropy(logits[:, :-1][same], tokens[:, 1:][same])
    opt.zero_grad()
    loss.backward()
    if dist.is_initialized():  # data parallel by hand: average the gradients
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
    opt.step()
    return float(loss.detach())


def save(path: Path, model: nn.Module, opt: torch.optim.Optimizer, data_state: dict[str, object]) -> None:
    """Model, optimizer and data in one file, written atomically on rank 0."""
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "data": data_state}, tmp)
    os.replace(tmp, path)


def run(data: Path, ckpt: Path, steps: int, save_at: int, resume: bool, vocab: int, seq_len: int) -> list[float]:
    torch.manual_seed(0)
    dataset = plitzer.torch.Dataset(data, seed=0, lanes=8, window=4, seq_len=seq_len, budget=1 << 28, threads=2)
    model = TinyLM(vocab, seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    if resume:
        state = torch.load(ckpt, weights_only=True)  # plain tensors, ints and bytes: no pickle needed
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        dataset.load_state_dict(state["data"])  # on any number of ranks
    loader = DataLoader(dataset, batch_size=None, num_workers=0)  # plitzer reads in its own threads
    losses: list[float] = []
    while dataset.step < steps:  # epoch after epoch (see also: while dataset.epoch < N)
        for batch in loader:
            losses.append(train_step(model, opt, batch, vocab))
            if batch.step + 1 == save_at:
                # The position right after this batch, even if a loop prefetched more.
                # Collective: every rank calls it; the result is the same on every rank.
                save(ckpt, model, opt, dataset.state_dict(after=batch))
            if batch.step + 1 == steps:
                break
    dataset.close()
    return losses


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", nargs="?", type=Path, help="pre-tokenized Parquet (default: a tiny synthetic set)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--save-at", type=int, default=6)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--seq-len", type=int, default=64)
    a = p.parse_args()
    if "RANK" in os.environ:  # launched by torchrun
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    # One scratch folder for every rank: rank 0's, its name sent to the others (each
    # rank's own temporary folder would hold no data on the other ranks). Ranks on
    # several machines need DATA_DIR and TRAIN_TINY_CKPT on a shared file system.
    with tempfile.TemporaryDirectory() if rank == 0 else contextlib.nullcontext("") as own:
        names = [own]
        if dist.is_initialized():
            dist.broadcast_object_list(names, src=0)
        tmp = names[0]
        data = a.data
        if data is None:
            data = Path(tmp) / "data"
            if rank == 0:
                plitzer.synth.write(data, tokens=60_000, vocab=a.vocab, mean_length=120, docs_per_row_group=50)
            if dist.is_initialized():
                dist.barrier()  # written before any rank opens it
        ckpt = Path(os.environ.get("TRAIN_TINY_CKPT", Path(tmp) / "ckpt.pt"))
        full = run(data, ckpt, a.steps, a.save_at, False, a.vocab, a.seq_len)
        if dist.is_initialized():
            dist.barrier()  # the checkpoint is on disk
        again = run(data, ckpt, a.steps, -1, True, a.vocab, a.seq_len)
        if rank == 0:
            print("losses:", " ".join(f"{x:.4f}" for x in full))
            print(f"resumed at step {a.save_at}:", " ".join(f"{x:.4f}" for x in again))
        if again != full[a.save_at :]:
            msg = "the resumed run differs from the uninterrupted one"
            raise SystemExit(msg)
        if rank == 0:
            print("ok: the resumed run equals the uninterrupted one")
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
