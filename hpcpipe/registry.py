"""Registries: the extension points of hpcpipe, looked up by name.

Schedules, problems, optimizers and executors each have one ``Registry``.
The command line's choices, the configuration checks, the docs and the
analysis all read the same registry, so a part registered once is known
everywhere. A name of the form ``package.module:attribute`` names a user's own
part: the module is imported and the attribute is registered under that name
on first use, so a result file records exactly where it came from.

A name read from a file (a result being resumed or analysed, a results folder)
is data, not a choice of code: inside ``names_from(source)`` such a name is
refused rather than imported, unless it was registered already (the user
named it on the command line, or imported it in their own program).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import re
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]*\Z")
_REF = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*\Z")


class RegistryError(ValueError):
    """An unknown or badly formed name; the message lists what is allowed."""


class UntrustedName(RegistryError):
    """A ``package.module:attribute`` read from a file, which hpcpipe does not import."""


_sources: list[str] = []  # files whose names are being read (innermost last)


@contextlib.contextmanager
def names_from(source: str, trusted: bool = False) -> Iterator[None]:
    """While active, ``get`` refuses a ``module:attr`` name not registered yet.

    ``source`` names the file(s) in the message; ``trusted=True`` (the user's explicit
    ``--trust-file``) lifts the refusal.
    """
    if trusted:
        yield
        return
    _sources.append(source)
    try:
        yield
    finally:
        _sources.pop()


def is_reference(name: object) -> bool:
    """Whether ``name`` has the form ``package.module:attribute`` (a user's own part)."""
    return isinstance(name, str) and bool(_REF.match(name))


def untrusted_message(what: str, name: str, source: str) -> str:
    """The refusal of a ``module:attr`` name recorded in ``source``."""
    return (
        f"{what} {name!r} is recorded in {source}: hpcpipe does not import code named by a "
        f"file. If you trust that module, pass --{what} {name} again on the command line, "
        "or add --trust-file (which imports and runs it)"
    )


class _Deferred:
    """An entry registered by ``register_lazy``: ``load()`` makes it on first ``get``."""

    __slots__ = ("load",)

    def __init__(self, load: Callable[[], object]):
        self.load = load


class Registry(Generic[T]):
    """Names → entries of one kind (``what``: "schedule", "problem", ...).

    ``register(name, entry)`` adds an entry (a decorator when ``entry`` is
    omitted); ``register_lazy(name, load)`` adds one that ``load()`` makes on
    first use, so that a name can be listed, offered and checked without
    importing the module that defines it; ``get(name)`` returns an entry,
    importing ``module:attr`` names on demand; ``names()`` lists the built-in
    and registered names in order.
    """

    def __init__(self, what: str, load: Callable[[object, str], T] | None = None):
        self.what = what
        self._entries: dict[str, T] = {}
        self._load = load  # turns an imported attribute into an entry (default: as is)

    def register(self, name: str, entry: T | None = None, *, replace: bool = False):
        if not isinstance(name, str) or not (_NAME.match(name) or _REF.match(name)):
            raise RegistryError(
                f"{self.what} name {name!r} is not allowed: use lower-case letters, digits, "
                "'-', '_' and '.', or package.module:attribute"
            )

        def add(e: T) -> T:
            if name in self._entries and not replace:
                raise RegistryError(
                    f"{self.what} {name!r} is already registered; pass replace=True to replace it"
                )
            self._entries[name] = e
            return e

        return add if entry is None else add(entry)

    def register_lazy(self, name: str, load: Callable[[], T]) -> None:
        """Register ``name`` now and its entry ``load()`` at its first ``get``.

        The name is in ``names()``, ``in`` and the choices at once; only
        ``get`` (a run, a settings check) pays for importing the entry's module.
        """
        self.register(name, _Deferred(load))  # type: ignore[arg-type]

    def get(self, name: str) -> T:
        if name in self._entries:
            entry = self._entries[name]
            if isinstance(entry, _Deferred):
                entry = self._entries[name] = entry.load()  # type: ignore[assignment]
            return entry
        if isinstance(name, str) and _REF.match(name):
            if _sources:
                raise UntrustedName(untrusted_message(self.what, name, _sources[-1]))
            self._entries[name] = self._import(name)
            return self._entries[name]
        close = difflib.get_close_matches(str(name), list(self._entries), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise RegistryError(
            f"unknown {self.what} {name!r}{hint}: choose one of {', '.join(self._entries)}, "
            "or name your own as package.module:attribute"
        )

    def check(self, name: str) -> str | None:
        """The error message for ``name``, or None when it resolves."""
        try:
            self.get(name)
        except RegistryError as e:
            return str(e)
        return None

    def _import(self, ref: str) -> T:
        module, _, attr = ref.partition(":")
        try:
            obj: object = importlib.import_module(module)
        except ImportError as e:
            raise RegistryError(
                f"{self.what} {ref!r}: cannot import module {module!r} ({e}); "
                "is it installed or on PYTHONPATH?"
            ) from None
        for part in attr.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                raise RegistryError(
                    f"{self.what} {ref!r}: module {module!r} has no attribute {attr!r}"
                ) from None
        return self._load(obj, ref) if self._load is not None else obj  # type: ignore[return-value]

    def names(self) -> list[str]:
        """Registered names, in registration order (``module:attr`` ones after use)."""
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}, {self.names()})"
