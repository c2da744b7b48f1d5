"""Where the bytes live: listing and checked ranged reads (local, S3, GCS, Azure, Hub, HTTP), retries, the cache."""
