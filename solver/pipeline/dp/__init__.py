"""Exact dynamic programs: over the ideals of the graph and over its separator chain."""
