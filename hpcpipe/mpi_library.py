"""The MPI library's name, as every record of hpcpipe writes it (results, benches, profiles).

``MPI.Get_library_version()`` is a free-form string: MPICH's spans several lines,
Open MPI's is one line ending in a NUL character (its C string's terminator),
which HDF5 string attributes truncate at and TOML does not allow in a string. The
name is its first non-blank line without NUL characters, stripped, so that a
result, a bench record and a machine profile made with one library compare equal.
"""

from __future__ import annotations


def clean_library_name(raw: str) -> str:
    """The first non-blank line of ``raw`` with every NUL removed, stripped ('' if none)."""
    for line in raw.replace("\x00", "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def library_name() -> str:
    """The clean name of the MPI library this process runs with (``clean_library_name``)."""
    from mpi4py import MPI

    return clean_library_name(MPI.Get_library_version())


__all__ = ["clean_library_name", "library_name"]
