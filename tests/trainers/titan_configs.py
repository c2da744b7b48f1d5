"""A torchtitan config registry for the CPU test: ``--module tests.trainers.titan_configs --config tiny``.

torchtitan's ``llama3_debugmodel`` fed by plitzer (``plitzer.integrations.torchtitan``), made
smaller (2 layers) and with SDPA's causal attention in place of FlexAttention, whose backward
torch does not run on CPU: the positions plitzer gives then drive RoPE only (the block-causal
masks they give FlexAttention and varlen attention need an accelerator).
"""

from __future__ import annotations

from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention
from torchtitan.trainer import Trainer

import plitzer.integrations.torchtitan as titan


def tiny() -> Trainer.Config:
    config = titan.llama3_debugmodel()
    model = config.model_spec.model
    model.layers = model.layers[:2]
    for _, _, parent, attr in model.traverse(FlexAttention.Config):
        setattr(parent, attr, ScaledDotProductAttention.Config())
    return config
