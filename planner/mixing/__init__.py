"""Mixtures: named sources side by side, weight stages, and the interleave of their row groups."""
