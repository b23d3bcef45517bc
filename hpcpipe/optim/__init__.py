"""Optimizers (GD, AGD, PPRS) over explicit state, and the theory settings."""
