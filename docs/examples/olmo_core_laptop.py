"""OLMo-core on a laptop, fed by plitzer: a 2-layer model trains 10 steps on CPU, one process.

What a CPU run needs beyond docs/trainers/olmo-core.md's config: OLMo-core's ``torch``
attention backend (SDPA; its default, flash-attn, needs an NVIDIA GPU), no process group for
one process, and data whose ids the model's vocabulary holds::

    plitzer synth data/small --tokens 200000 --vocab 2000
    python docs/examples/olmo_core_laptop.py

plitzer's figures (``plitzer/tokens/data``, ``plitzer/targets/data``, ``plitzer/padding``,
``plitzer/wait_s``) reach every logger the trainer has through the metrics callback.
tests/trainers/test_laptop.py runs it (OLMo-core installed: ``pip install "plitzer[olmo-core]"``).
"""

from olmo_core.nn.attention import AttentionBackendName
from olmo_core.nn.transformer import TransformerConfig
from olmo_core.optim import AdamWConfig
from olmo_core.train import Duration, TrainerConfig, prepare_training_environment, teardown_training_environment
from olmo_core.train.train_module import TransformerTrainModuleConfig

from plitzer.integrations.olmo_core import PlitzerDataLoaderConfig, PlitzerMetricsCallbackConfig

STEPS, ROWS, SEQ = 10, 4, 128

prepare_training_environment(seed=0, backend=None)  # one process: no process group
model = TransformerConfig.llama_like(
    d_model=64, vocab_size=2000, n_layers=2, n_heads=4, attn_backend=AttentionBackendName.torch
).build(init_device="cpu")
train_module = TransformerTrainModuleConfig(
    rank_microbatch_size=ROWS * SEQ, max_sequence_length=SEQ, optim=AdamWConfig(lr=1e-3)
).build(model)
data_loader = PlitzerDataLoaderConfig(global_batch_size=ROWS * SEQ, sequence_length=SEQ, source="data/small", window=2)
trainer = (
    TrainerConfig(save_folder="out/olmo", max_duration=Duration.steps(STEPS), metrics_collect_interval=1)
    .with_callback("plitzer", PlitzerMetricsCallbackConfig())
    .build(train_module, data_loader.build(dp_process_group=train_module.dp_process_group))
)
trainer.fit()
teardown_training_environment()
