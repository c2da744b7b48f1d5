"""Reverse lookup: the pieces each document becomes, from the plan and token lengths alone."""
