"""From a source's URL to its storage backend: the one module that knows every backend.

:mod:`planner.stores.storage` defines the interface and local disk; each object store
builds on it in its own module (:mod:`planner.stores.s3`, :mod:`planner.stores.gcs`,
:mod:`planner.stores.azure`, the Hugging Face Hub :mod:`planner.stores.hf`, HTTP :mod:`planner.stores.http`).
Choosing among them lives here, above all of them, so that the storage modules
form no cycle (docs/design.md, "The map of the code").
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from planner.errors import ConfigError
from planner.stores.azure import AzureStorage
from planner.stores.gcs import GCSStorage
from planner.stores.hf import HFStorage
from planner.stores.http import HTTPStorage
from planner.stores.s3 import S3Storage
from planner.stores.storage import SCHEMES, SOURCE_FORMS, LocalStorage, Storage

__all__ = ["open_storages"]


def open_storages(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    storage_options: Mapping[str, Any] | None = None,
) -> list[Storage]:
    """One storage per source; a list source gives several, in order."""
    if isinstance(source, (str, os.PathLike)):
        sources: list[str | os.PathLike[str]] = [source]
    else:
        sources = list(source)
        if not sources:
            msg = f"source is an empty list; pass {SOURCE_FORMS}"
            raise ConfigError(msg)
    out: list[Storage] = []
    for s in sources:
        text = os.fspath(s)
        if text.startswith("s3://"):
            out.append(S3Storage(text, storage_options))
        elif text.startswith(("gs://", "gcs://")):
            out.append(GCSStorage(text, storage_options))
        elif text.startswith(("az://", "abfs://", "abfss://")):
            out.append(AzureStorage(text, storage_options))
        elif text.startswith("hf://"):
            out.append(HFStorage(text, storage_options))
        elif text.startswith(("https://", "http://")):
            out.append(HTTPStorage(text, storage_options))
        elif "://" in text:
            msg = f"source {text!r}: the supported URLs are {', '.join(SCHEMES)} (and local paths)"
            raise ConfigError(msg)
        else:
            out.append(LocalStorage(text))
    return out
