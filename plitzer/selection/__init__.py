"""Selection by a predicate (where=): the predicate checked, the pass over the data, the selected index."""
