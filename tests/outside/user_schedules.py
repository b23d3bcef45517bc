"""Schedules defined outside the hpcpipe package, as a user would write them.

Used by tests/test_schedule_registry.py through ``package.module:builder``
names (this folder is put on PYTHONPATH); nothing here is imported by hpcpipe.
"""

import numpy as np

from hpcpipe.pipeline.schedules import Kind, Schedule, encode


def lifo(n_stages: int, n_items: int) -> Schedule:
    """Fill-drain with the backwards in reverse item order (last in, first out)."""
    i = np.arange(n_items)
    codes = np.concatenate([encode(i, Kind.FORWARD), encode(i[::-1], Kind.BACKWARD)])
    return Schedule("lifo", n_stages, n_items, [codes] * n_stages)


def pairs(n_stages: int, n_items: int) -> Schedule:
    """Items two at a time: F(2j) F(2j+1) B(2j+1) B(2j) on every stage."""
    order = []
    for j in range(0, n_items, 2):
        grp = list(range(j, min(j + 2, n_items)))
        order += [encode(k, Kind.FORWARD) for k in grp]
        order += [encode(k, Kind.BACKWARD) for k in reversed(grp)]
    return Schedule("pairs", n_stages, n_items, [np.array(order)] * n_stages)


def not_a_builder():
    return 3


DEADLOCK = "a string, not a builder"
