"""Text sources: tokenizers, tokenizing as the loader reads, and the offline tokenize job."""
