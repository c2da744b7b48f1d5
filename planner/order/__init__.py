"""The order of a dataset: each epoch's row groups, windows, lanes and reads, and layout stages."""
