"""plitzer inside trainers: torchtitan, OLMo-core and litgpt (docs/trainers/).

Each trainer has its own module, the only one of plitzer that imports that trainer,
installed with its extra:

- :mod:`plitzer.integrations.torchtitan` (``pip install 'plitzer[torchtitan]'``): a
  ``BaseDataLoader`` and a null tokenizer, and every torchtitan config (``--module
  plitzer.integrations.torchtitan --config llama3_debugmodel``) fed by plitzer;
- :mod:`plitzer.integrations.olmo_core` (``pip install 'plitzer[olmo-core]'``): a
  ``TextDataLoaderBase`` and its config dataclass, and an evaluator callback;
- :mod:`plitzer.integrations.litgpt` (``pip install 'plitzer[litgpt]'``): a
  ``DataModule`` that a YAML config names by ``class_path``.

Each maps the trainer's data-parallel rank and degree to plitzer's ``rank`` and ``world``
and its batch size and sequence length to ``lanes`` and ``seq_len``, gives the trainer's
batch format with plitzer's labels (SPEC section 16), puts plitzer's checkpoint into the
trainer's own, and takes every other setting of :data:`planner.parameters.PARAMETERS`
through the trainer's configuration system (:mod:`plitzer.integrations.shared`).

This package imports no trainer: import the module of the one you use.
"""
