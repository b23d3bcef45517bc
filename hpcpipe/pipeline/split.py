"""The backward of a stage split in two: I (the input gradient) and W (the weight gradient).

For a stage of layers h_L ∘ … ∘ h_1 with inputs x_1 … x_L (x_{l+1} = h_l(x_l))
and the output gradient g_L = dL/dy_L, backpropagation computes, for
l = L, …, 1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §2):

    I:  g_{l−1} = (∂h_l/∂x_l)ᵀ g_l          (needs x_l and the layer's parameters),
    W:  dL/dθ_l += (∂h_l/∂θ_l)ᵀ g_l          (needs x_l and g_l).

I runs the first line for every layer and sends g_0 = dL/dx on, as B does;
it stashes each g_l. W runs the second line later from that stash and the
forward's caches. A dense layer y = xW + b gives g_{l−1} = g_l Wᵀ (I) and
dL/dW += x_lᵀ g_l, dL/db += Σ_rows g_l (W): the same operations on the same
operands as B's ``backward`` (``layers.Dense``), so the gradient equals B's
up to the order in which items are summed (tested to <= 1e-12).

A layer with parameters but no ``backward_params`` cannot be split: I then
runs its whole backward (accumulating its gradient) and W has nothing left
to do for it; the numbers are B's either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Array = np.ndarray


def _weight_part(layer) -> Callable | None:
    """The layer's parameter-only backward, or None when it has no parameters."""
    if not layer.params():
        return None
    return getattr(layer, "backward_params", None)


def splitters(layers: Sequence[Any], single: bool) -> tuple[Callable, Callable]:
    """(input_grad, weight_grad) for a stage of ``layers``.

    ``input_grad(dy, cache, params, grads, out) -> stash`` writes dL/dx into
    ``out`` (None: not wanted) and returns what W needs; ``weight_grad(stash,
    cache, params, grads)`` accumulates dL/dθ into ``grads`` (None: the
    weights are not the variable, nothing to do). ``single``: the stage is
    one layer, whose cache and parameters are passed bare (not in lists).
    """
    if single:
        (layer,) = layers
        wpart = _weight_part(layer)
        whole = bool(layer.params()) and wpart is None  # I must do the whole backward

        def input_one(dy, cache, params, grads, out):
            layer.backward_into(dy, cache, params, grads if whole else None, out)
            return dy

        def weight_one(stash, cache, params, grads):
            if wpart is not None and grads is not None:
                wpart(stash, cache, params, grads)

        return input_one, weight_one

    wparts = [_weight_part(layer) for layer in layers]
    wholes = [bool(layer.params()) and w is None for layer, w in zip(layers, wparts)]

    def input_many(dy, caches, params, grads, out):
        dys: list[Array] = [dy] * len(layers)
        for idx in range(len(layers) - 1, 0, -1):
            dys[idx] = dy
            g = grads[idx] if (grads is not None and wholes[idx]) else None
            dy = layers[idx].backward(dy, caches[idx], params[idx], g)
        dys[0] = dy
        if layers:
            g = grads[0] if (grads is not None and wholes[0]) else None
            layers[0].backward_into(dy, caches[0], params[0], g, out)
        elif out is not None:
            np.copyto(out, dy)
        return dys

    def weight_many(dys, caches, params, grads):
        if grads is None:
            return
        for idx, wpart in enumerate(wparts):
            if wpart is not None:
                wpart(dys[idx], caches[idx], params[idx], grads[idx])

    return input_many, weight_many
