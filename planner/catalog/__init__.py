"""The catalog of a dataset: footers fetched, checked and parsed into one row per row group; job indexes."""
