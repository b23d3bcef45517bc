"""Counter-based random streams: the same numbers however layers are split.

Every random array hpcpipe draws is a pure function of a key and a counter,
never of the order in which a rank happens to draw:

* smoothing noise Z for (seed, call, parameter, sample k): Philox with key
  (seed, parameter id) and counter (0, 0, k, call). Draws advance the low
  counter word, so distinct (k, call) streams never overlap (2**64 draws each);
* initial weights of block b: a SeedSequence of (seed, INIT, b);
* data sets: a SeedSequence of (seed, DATA, purpose).

Parameter ids: 0 is the input variable; parameter p of depth block b is
1 + MAX_PARAMS_PER_BLOCK * b + p.
"""

from __future__ import annotations

import threading

import numpy as np

MAX_PARAMS_PER_BLOCK = 16
INPUT_PARAM_ID = 0
_INIT, _DATA = 1, 2
_MASK64 = (1 << 64) - 1


def param_id(block: int, index: int) -> int:
    """Global id of parameter ``index`` of depth block ``block``."""
    if not 0 <= index < MAX_PARAMS_PER_BLOCK:
        raise ValueError(f"a block has at most {MAX_PARAMS_PER_BLOCK} parameters")
    return 1 + MAX_PARAMS_PER_BLOCK * block + index


def noise_generator(seed: int, call: int, pid: int, sample: int) -> np.random.Generator:
    """Generator of the Gaussian smoothing noise Z for one (call, parameter, sample)."""
    key = np.array([seed & _MASK64, pid & _MASK64], dtype=np.uint64)
    counter = np.array([0, 0, sample & _MASK64, call & _MASK64], dtype=np.uint64)
    return np.random.Generator(np.random.Philox(key=key, counter=counter))


_local = threading.local()  # each thread's Philox for ``noise``
_EMPTY = np.zeros(4, dtype=np.uint64)


def noise(seed: int, call: int, pid: int, sample: int, shape, dtype=np.float64) -> np.ndarray:
    """Z ~ N(0, I) of the given shape for one (call, parameter, sample).

    The draw of ``noise_generator(seed, call, pid, sample)``, bitwise, from one Philox
    per thread whose key and counter are set for the draw, with its output buffer
    emptied: building a Philox reads OS entropy for a SeedSequence that a keyed
    Philox never uses (about 15 µs a draw; setting the state costs about 2 µs).
    """
    gen = getattr(_local, "gen", None)
    if gen is None:
        gen = _local.gen = np.random.Generator(np.random.Philox(0))
    gen.bit_generator.state = {
        "bit_generator": "Philox",
        "state": {
            "counter": np.array([0, 0, sample & _MASK64, call & _MASK64], dtype=np.uint64),
            "key": np.array([seed & _MASK64, pid & _MASK64], dtype=np.uint64),
        },
        "buffer": _EMPTY,
        "buffer_pos": 4,
        "has_uint32": 0,
        "uinteger": 0,
    }
    return gen.standard_normal(shape, dtype=dtype)


def init_generator(seed: int, block: int) -> np.random.Generator:
    """Generator for the initial weights of depth block ``block``."""
    return np.random.default_rng(np.random.SeedSequence([seed, _INIT, block]))


def data_generator(seed: int, purpose: int = 0) -> np.random.Generator:
    """Generator for synthetic data (inputs, targets) of a problem."""
    return np.random.default_rng(np.random.SeedSequence([seed, _DATA, purpose]))
