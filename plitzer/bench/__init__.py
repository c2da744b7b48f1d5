"""Benchmarks of plitzer against other loaders of the same Parquet.

``python -m plitzer.bench.baseline DATA --loaders plitzer,litdata,grain,mosaic,hf,hf-stream --batch 64 --workers 2``
runs every loader in its own subprocess (``plitzer.bench._run_one``), in its own
virtual environment where its pins conflict with ours, and prints the comparison
table of the README. The peers (litdata, Grain, MosaicML Streaming, Hugging Face ``datasets``,
``torchdata``) are imported lazily, only inside the runner of their loader.
"""

from __future__ import annotations

__all__ = ["DECODES", "LOADERS"]

#: Every loader the harness knows, in the order of the table.
LOADERS = ("pyarrow", "pyarrow-rg", "plitzer", "litdata", "grain", "mosaic", "hf", "hf-stream")
#: The raw decodes, always measured; the faster is the reference of the ratios.
DECODES = ("pyarrow", "pyarrow-rg")
