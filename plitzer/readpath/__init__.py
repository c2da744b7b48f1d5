"""The read path: a unit's planned row groups read, decoded and packed into lanes; the batches over them."""
