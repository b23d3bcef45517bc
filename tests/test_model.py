"""Partition, stage construction and counter-based randomness."""

import numpy as np
import pytest

from hpcpipe.model import rng
from hpcpipe.model.stages import (
    ModelSpec,
    PartitionError,
    Stage,
    build_stages,
    microbatch_bounds,
    partition,
    stage_offsets,
)


def test_partition_balanced_and_contiguous():
    assert partition(8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert partition(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert partition(5, 1) == [(0, 5)]
    for depth in range(1, 20):
        for p in range(1, depth + 1):
            parts = partition(depth, p)
            sizes = [hi - lo for lo, hi in parts]
            assert parts[0][0] == 0 and parts[-1][1] == depth
            assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
            assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_partition_rejects_more_ranks_than_layers():
    with pytest.raises(PartitionError, match="depth 3 is smaller than the number of stages .* 4"):
        partition(3, 4)


def test_microbatches():
    assert microbatch_bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]
    with pytest.raises(ValueError, match="between 1 and m=2"):
        microbatch_bounds(2, 3)


def test_stages_do_not_depend_on_partition():
    spec = ModelSpec("mlp", depth=8, d_in=4, d_out=3, width=6, seed=7)
    whole = Stage(spec, 0, 8).flat
    for p in (1, 2, 3, 4, 8):
        stages = build_stages(spec, p)
        np.testing.assert_array_equal(np.concatenate([s.flat for s in stages]), whole)
        offs = stage_offsets(spec, p)
        assert [s.size for s in stages] == list(np.diff(offs))


def test_perturbation_is_partition_independent():
    spec = ModelSpec("mlp", depth=6, d_in=3, d_out=2, width=4, seed=1)
    whole = Stage(spec, 0, 6)
    pw = whole.perturbed(whole.flat, 0.3, seed=5, call=2, sample=1)
    parts = [s.perturbed(s.flat, 0.3, 5, 2, 1) for s in build_stages(spec, 3)]
    np.testing.assert_array_equal(np.concatenate(parts), pw)
    assert not np.array_equal(pw, whole.flat)


def test_noise_is_its_generators_draw_bitwise_in_any_order_and_thread():
    """rng.noise reuses a Philox per thread: each draw equals a fresh generator's,
    whatever was drawn before (other keys, a partial float32 word) and in threads."""
    import threading

    cases = [(1, 2, 3, 4, (100,), np.float64), (0, 0, 0, 0, (3, 5), np.float32),
             (2**63 + 5, 7, 9, 1, (7,), np.float32), (1, 2, 3, 4, (4097,), np.float64),
             (-1, 2**70, 1, 3, (2, 2), np.float64)]  # fmt: skip
    want = [rng.noise_generator(*c[:4]).standard_normal(c[4], dtype=c[5]) for c in cases]
    for order in (cases, cases[::-1], cases + cases):
        for c in order:
            got = rng.noise(*c[:4], c[4], dtype=c[5])
            assert got.dtype == c[5]
            np.testing.assert_array_equal(got, want[cases.index(c)])
    bad = []

    def draw():
        for _ in range(200):
            for c, w in zip(cases, want):
                if not np.array_equal(rng.noise(*c[:4], c[4], dtype=c[5]), w):
                    bad.append(c)

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


def test_noise_streams_are_counter_based():
    a = rng.noise(1, 2, 3, 4, (100,))
    np.testing.assert_array_equal(a, rng.noise(1, 2, 3, 4, (100,)))
    for other in [(2, 2, 3, 4), (1, 3, 3, 4), (1, 2, 4, 4), (1, 2, 3, 5)]:
        assert not np.allclose(a, rng.noise(*other, (100,)))
    # prefix property: a longer draw starts with the shorter one
    np.testing.assert_array_equal(rng.noise(1, 2, 3, 4, (200,))[:100], a)
    assert abs(a.mean()) < 0.4 and 0.6 < a.std() < 1.4


def test_seed_changes_weights():
    a = Stage(ModelSpec("mlp", 2, 3, 2, 4, seed=1), 0, 2).flat
    b = Stage(ModelSpec("mlp", 2, 3, 2, 4, seed=2), 0, 2).flat
    assert not np.allclose(a, b)
