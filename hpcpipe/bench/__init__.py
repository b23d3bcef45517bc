"""Benchmark cases: each prints its figures with their units and a sanity check."""
