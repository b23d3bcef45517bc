"""Finite-difference checks of every layer, loss head and a depth-8 chain (float64)."""

import numpy as np
import pytest

from hpcpipe.model.layers import (
    Dense,
    Identity,
    Layer,
    Orthogonal,
    ReLU,
    backward_layers,
    backward_layers_into,
    forward_layers,
    forward_layers_into,
)
from hpcpipe.model.losses import HEADS, make_head
from hpcpipe.model.reference import Reference
from hpcpipe.model.stages import ModelSpec, random_batch

H = 1e-6
TOL = 1e-6


def fd_grad(f, x, h=H):
    g = np.zeros_like(x)
    flat, gf = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + h
        fp = f()
        flat[i] = old - h
        fm = f()
        flat[i] = old
        gf[i] = (fp - fm) / (2 * h)
    return g


def rel_err(a, b):
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)


def make_layer(name, rng):
    if name == "dense":
        return Dense.init(rng, 4, 3)
    if name == "relu":
        return ReLU(4)
    if name == "orthogonal":
        return Orthogonal.init(rng, 4)
    return Identity(4)


@pytest.mark.parametrize("name", ["dense", "relu", "orthogonal", "identity"])
def test_layer_gradients(name):
    rng = np.random.default_rng(0)
    layer = make_layer(name, rng)
    x = rng.standard_normal((5, layer.n_in))
    params = [p.copy() for p in layer.params()]
    v = rng.standard_normal((5, layer.n_out))  # random projection: L = <v, y>

    def loss():
        return float((layer.forward(x, params)[0] * v).sum())

    y, cache = layer.forward(x, params)
    grads = [np.zeros_like(p) for p in params]
    dx = layer.backward(v, cache, params, grads)
    assert rel_err(dx, fd_grad(loss, x)) < TOL
    for p, g in zip(params, grads):
        assert rel_err(g, fd_grad(loss, p)) < TOL


class Square(Layer):
    """y = x²: a layer with only forward/backward, so the default ``_into`` methods run."""

    def __init__(self, n):
        self.n_in = self.n_out = n

    def forward(self, x, params):
        return x * x, x

    def backward(self, dy, cache, params, grads):
        return 2.0 * cache * dy


@pytest.mark.parametrize("name", ["dense", "relu", "orthogonal", "identity", "square"])
def test_layer_into_equals_forward_and_backward(name):
    """forward_into / backward_into give forward's output and backward's dL/dx and
    parameter gradients bitwise; with out None only the parameter gradients."""
    rng = np.random.default_rng(3)
    layer = Square(4) if name == "square" else make_layer(name, rng)
    x = rng.standard_normal((5, layer.n_in))
    dy = rng.standard_normal((5, layer.n_out))
    params = layer.params()
    y, cache = layer.forward(x, params)
    out = np.full((5, layer.n_out), np.nan)
    cache_into = layer.forward_into(x, params, out)
    np.testing.assert_array_equal(out, y)
    grads = [np.zeros_like(p) for p in params]
    dx = layer.backward(dy, cache, params, grads)
    for target in (np.full((5, layer.n_in), np.nan), None):
        grads_into = [np.zeros_like(p) for p in params]
        layer.backward_into(dy, cache_into, params, grads_into, target)
        if target is not None:
            np.testing.assert_array_equal(target, dx)
        for a, b in zip(grads_into, grads):
            np.testing.assert_array_equal(a, b)
    assert name not in ("dense", "relu", "orthogonal") or np.abs(dx).max() > 0


def test_layer_lists_into_equal_forward_and_backward_layers():
    """A stage of several layers (dense, ReLU, dense, custom): the ``_into`` list functions
    give the output, dL/dx and every parameter gradient of the plain ones, bitwise."""
    rng = np.random.default_rng(4)
    layers = [Dense.init(rng, 3, 5), ReLU(5), Dense.init(rng, 5, 4), Square(4)]
    params = [layer.params() for layer in layers]
    x, dy = rng.standard_normal((6, 3)), rng.standard_normal((6, 4))
    y, caches = forward_layers(layers, x, params)
    out = np.zeros((6, 4))
    caches_into = forward_layers_into(layers, x, params, out)
    np.testing.assert_array_equal(out, y)
    grads = [[np.zeros_like(p) for p in ps] for ps in params]
    dx = backward_layers(layers, dy, caches, params, grads)
    for target in (np.zeros((6, 3)), None):
        grads_into = [[np.zeros_like(p) for p in ps] for ps in params]
        backward_layers_into(layers, dy, caches_into, params, grads_into, target)
        if target is not None:
            np.testing.assert_array_equal(target, dx)
        for a, b in zip(sum(grads_into, []), sum(grads, [])):
            np.testing.assert_array_equal(a, b)
            assert np.abs(b).max() > 0


def test_dense_backward_accumulates():
    rng = np.random.default_rng(1)
    layer = Dense.init(rng, 3, 2)
    x, dy = rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    grads = [np.ones((3, 2)), np.ones(2)]
    layer.backward(dy, x, layer.params(), grads)
    np.testing.assert_allclose(grads[0], 1 + x.T @ dy, rtol=1e-14)
    np.testing.assert_allclose(grads[1], 1 + dy.sum(0), rtol=1e-14)


def test_orthogonal_is_orthogonal():
    q = Orthogonal.init(np.random.default_rng(2), 7).q
    np.testing.assert_allclose(q.T @ q, np.eye(7), atol=1e-13)


@pytest.mark.parametrize("head", sorted(HEADS))
def test_loss_head_gradients(head):
    rng = np.random.default_rng(3)
    z = rng.standard_normal((6, 5))
    if head in ("cross_entropy", "margin"):
        t = rng.integers(0, 5, size=6)
    else:
        t = rng.standard_normal((6, 5))
    h = make_head(head)
    w = 1 / 6
    loss, dz = h(z, t, w)
    assert np.isfinite(loss)
    assert rel_err(dz, fd_grad(lambda: h(z, t, w)[0], z)) < TOL


@pytest.mark.parametrize(("head", "args"), [("max", {"k": 3}), ("pinball", {"tau": 0.3})])
def test_loss_head_gradients_with_arguments(head, args):
    rng = np.random.default_rng(4)
    z, t = rng.standard_normal((6, 5)), rng.standard_normal((6, 5))
    h = make_head(head, **args)
    loss, dz = h(z, t, 0.5)
    assert rel_err(dz, fd_grad(lambda: h(z, t, 0.5)[0], z)) < TOL
    if head == "max":  # the subgradient never leaves the first k coordinates
        assert np.all(dz[:, 3:] == 0) and np.all(dz.sum(1) == 0.5)


def test_loss_head_values():
    z = np.array([[1.0, 3.0, 2.0]])
    assert make_head("max")(z, None, 1.0)[0] == 3.0
    assert make_head("max", k=1)(z, None, 1.0)[0] == 1.0
    pin = make_head("pinball", tau=0.75, scale=1.0)(z, np.full((1, 3), 2.0), 1.0)
    np.testing.assert_allclose(pin[0], 0.25 * 1.0 + 0.0 + 0.75 * 1.0)
    np.testing.assert_allclose(pin[1], [[-0.25, 0.75, 0.0]])
    with pytest.raises(ValueError, match="tau must be in"):
        make_head("pinball", tau=1.0)
    assert make_head("margin")(z, np.array([0]), 1.0)[0] == -2.0
    assert make_head("margin", kappa=1.0)(z, np.array([0]), 1.0)[0] == -1.0
    np.testing.assert_allclose(make_head("abs")(z, np.zeros((1, 3)), 1.0)[0], 6 / np.sqrt(3))
    np.testing.assert_allclose(make_head("squared")(z, np.zeros((1, 3)), 1.0)[0], 7.0)
    ce = make_head("cross_entropy")(z, np.array([1]), 1.0)[0]
    np.testing.assert_allclose(ce, np.log(np.exp(z).sum()) - 3.0)


CHAINS = {
    "mlp": ModelSpec("mlp", depth=8, d_in=4, d_out=3, width=5, head="cross_entropy", seed=1),
    "dense": ModelSpec("dense", depth=8, d_in=4, d_out=3, width=5, head="squared", seed=2),
    "orthogonal": ModelSpec("orthogonal", depth=8, d_in=5, d_out=5, head="abs", seed=3),
}


@pytest.mark.parametrize(
    ("model", "variable"),
    [("mlp", "input"), ("mlp", "weights"), ("dense", "weights"), ("orthogonal", "input")],
)
def test_depth8_chain_gradient(model, variable):
    spec = CHAINS[model]
    batch = random_batch(spec, 3, seed=4)
    ref = Reference(spec, batch, variable, seed=9)
    point = ref.initial_point() + 0.1 * np.random.default_rng(5).standard_normal(ref.size)
    # with smoothing on: the gradient of f at the perturbed points, same noise both sides
    for gamma in (0.0, 0.05):
        _, g = ref.loss_and_grad(point, gamma=gamma, call=2, samples=3)
        fd = fd_grad(lambda g=gamma: ref.loss(point, gamma=g, call=2, samples=3), point)
        assert np.linalg.norm(g) > 0
        assert rel_err(g, fd) < TOL


def test_sum_reduce_is_k_times_mean():
    spec = CHAINS["mlp"]
    ref = Reference(spec, random_batch(spec, 3), "input", seed=1)
    p = ref.initial_point()
    _, gm = ref.loss_and_grad(p, 0.1, 0, 4, "mean")
    _, gs = ref.loss_and_grad(p, 0.1, 0, 4, "sum")
    np.testing.assert_allclose(gs, 4 * gm, rtol=1e-14)
