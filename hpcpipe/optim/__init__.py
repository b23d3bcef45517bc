"""Optimizers: explicit-state rules (``base``), GD / AGD / PPRS and their theory
plans (``methods``), and ``OPTIMIZERS``, the registry the run reads by name
(``package.module:Class`` names are imported on use)."""

from __future__ import annotations

from hpcpipe.optim.base import Optimizer, OptState
from hpcpipe.optim.methods import AGD, GD, PPRS
from hpcpipe.registry import Registry, RegistryError


def _as_optimizer(obj: object, name: str) -> type[Optimizer]:
    if not (isinstance(obj, type) and issubclass(obj, Optimizer)):
        raise RegistryError(f"optimizer {name!r}: expected a subclass of hpcpipe.optim.Optimizer")
    return obj


OPTIMIZERS: Registry[type[Optimizer]] = Registry("optimizer", load=_as_optimizer)
for _cls in (GD, AGD, PPRS):
    OPTIMIZERS.register(_cls.name, _cls)


def register_optimizer(name: str, cls: type[Optimizer] | None = None):
    """Register an Optimizer subclass under ``name`` (a class decorator without ``cls``)."""

    def add(c: type[Optimizer]) -> type[Optimizer]:
        OPTIMIZERS.register(name, _as_optimizer(c, name))
        return c

    return add if cls is None else add(cls)


__all__ = ["AGD", "GD", "OPTIMIZERS", "OptState", "Optimizer", "PPRS", "register_optimizer"]
