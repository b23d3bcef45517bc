"""The HDF5 superblock of a result file: checked before HDF5 opens it, repaired after a crash.

Layout (HDF5 File Format Specification, "Superblock", versions 0-3; signature at byte 0):

* all versions: signature ``\\x89HDF\\r\\n\\x1a\\n`` (8 bytes), then the superblock version;
* versions 2 and 3 (``libver="latest"``, what hpcpipe writes): version (1), size of
  offsets O (1), size of lengths (1), file consistency flags (1), then four addresses
  (base, superblock extension, end of file, root object header; O bytes each), then a
  Jenkins lookup3 checksum of everything before it (4 bytes): 12 + 4·O + 4 bytes;
* versions 0 and 1: the end-of-file address sits after 16 (v0) or 20 (v1) bytes of
  versions, sizes and B-tree parameters and two addresses: at byte 24 + 2·O (v0) or
  28 + 2·O (v1).

A writer in SWMR mode sets the consistency flags (bit 0: open for writing, bit 2: SWMR
write) and clears them on close. A writer that dies (kill -9, MPI_Abort of a failed rank)
leaves them set, and HDF5 then refuses to open the file for writing (``h5clear -s`` clears
them). ``clear_status_flags`` does the same in Python: it checks the stored checksum,
zeroes the flags and writes the new checksum.

A writer killed while HDF5 grows the file can also leave it shorter than the end-of-file
address its superblock already records (HDF5 moves the address first and writes the tail
later). ``extend_to_eof`` lengthens such a file to that address, as ``h5clear
--increment`` does; the bytes it adds are zeros, which no flushed object refers to, and
each data chunk's Fletcher-32 checksum tells a chunk the kill cut from a whole one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SIGNATURE = b"\x89HDF\r\n\x1a\n"
_M = 0xFFFFFFFF


class SuperblockError(ValueError):
    """The first bytes of a file are not a complete, consistent HDF5 superblock."""


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _M


def lookup3(data: bytes, initval: int = 0) -> int:
    """Bob Jenkins' lookup3 ``hashlittle`` (HDF5's metadata checksum, H5_checksum_lookup3)."""
    n = len(data)
    a = b = c = (0xDEADBEEF + n + initval) & _M
    i = 0
    while n - i > 12:
        a = (a + int.from_bytes(data[i : i + 4], "little")) & _M
        b = (b + int.from_bytes(data[i + 4 : i + 8], "little")) & _M
        c = (c + int.from_bytes(data[i + 8 : i + 12], "little")) & _M
        a = (a - c) & _M ^ _rot(c, 4)
        c = (c + b) & _M
        b = (b - a) & _M ^ _rot(a, 6)
        a = (a + c) & _M
        c = (c - b) & _M ^ _rot(b, 8)
        b = (b + a) & _M
        a = (a - c) & _M ^ _rot(c, 16)
        c = (c + b) & _M
        b = (b - a) & _M ^ _rot(a, 19)
        a = (a + c) & _M
        c = (c - b) & _M ^ _rot(b, 4)
        b = (b + a) & _M
        i += 12
    if n == i:
        return c
    tail = data[i:] + bytes(12 - (n - i))
    a = (a + int.from_bytes(tail[0:4], "little")) & _M
    b = (b + int.from_bytes(tail[4:8], "little")) & _M
    c = (c + int.from_bytes(tail[8:12], "little")) & _M
    c = ((c ^ b) - _rot(b, 14)) & _M
    a = ((a ^ c) - _rot(c, 11)) & _M
    b = ((b ^ a) - _rot(a, 25)) & _M
    c = ((c ^ b) - _rot(b, 16)) & _M
    a = ((a ^ c) - _rot(c, 4)) & _M
    b = ((b ^ a) - _rot(a, 14)) & _M
    c = ((c ^ b) - _rot(b, 24)) & _M
    return c


@dataclass
class Superblock:
    version: int
    offset_size: int
    flags: int  # file consistency flags (versions 2, 3); 0 for versions 0, 1
    eof: int  # end-of-file address: the file must be at least this long
    checksum_at: int  # byte of the checksum (versions 2, 3), else -1


def read(path: str | Path, check_size: bool = True) -> Superblock:
    """The superblock at byte 0, checked for completeness, checksum and (``check_size``)
    that the file reaches its end-of-file address."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(128)
    if not head.startswith(SIGNATURE):
        if SIGNATURE.startswith(head):
            raise SuperblockError(f"truncated ({size} bytes: not even an HDF5 signature)")
        raise SuperblockError("not an HDF5 file (no HDF5 signature)")
    if len(head) < 14:
        raise SuperblockError(f"truncated ({size} bytes, inside its HDF5 superblock)")
    version = head[8]
    if version in (2, 3):
        o = head[9]
        if o not in (2, 4, 8, 16):
            raise SuperblockError(f"damaged HDF5 superblock (size of offsets {o})")
        end = 12 + 4 * o
        if len(head) < end + 4:
            raise SuperblockError(f"truncated ({size} bytes, inside its HDF5 superblock)")
        stored = int.from_bytes(head[end : end + 4], "little")
        if lookup3(head[:end]) != stored:
            raise SuperblockError("damaged HDF5 superblock (checksum mismatch)")
        eof = int.from_bytes(head[12 + 2 * o : 12 + 3 * o], "little")
        sb = Superblock(version, o, head[11], eof, end)
    elif version in (0, 1):
        o = head[13]
        if o not in (2, 4, 8, 16):
            raise SuperblockError(f"damaged HDF5 superblock (size of offsets {o})")
        at = (24 if version == 0 else 28) + 2 * o
        if len(head) < at + o:
            raise SuperblockError(f"truncated ({size} bytes, inside its HDF5 superblock)")
        eof = int.from_bytes(head[at : at + o], "little")
        sb = Superblock(version, o, 0, eof, -1)
    else:
        raise SuperblockError(f"damaged HDF5 superblock (version {version})")
    if check_size and size < sb.eof:
        raise SuperblockError(f"truncated ({size} bytes, its superblock says {sb.eof})")
    return sb


def clear_status_flags(path: str | Path) -> bool:
    """``h5clear -s``: zero the consistency flags a dead writer left; True if it did.

    Only for a superblock whose stored checksum is right (``read`` checks it), and only
    after the caller made sure no live process writes the file (its lock is free).
    """
    sb = read(path)
    if sb.version not in (2, 3) or sb.flags == 0:
        return False
    fd = os.open(path, os.O_RDWR)
    try:
        head = bytearray(os.pread(fd, sb.checksum_at, 0))
        head[11] = 0
        os.pwrite(fd, bytes(head[11:12]), 11)
        os.pwrite(fd, lookup3(bytes(head)).to_bytes(4, "little"), sb.checksum_at)
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def left_open(sb: Superblock) -> bool:
    """Whether a writer left the file open (consistency flag bit 0: versions 2, 3 only)."""
    return sb.version in (2, 3) and bool(sb.flags & 1)


def extend_to_eof(fd: int, sb: Superblock) -> int:
    """``h5clear --increment``: lengthen the open file ``fd`` to its end-of-file address.

    Returns the size before (to undo it with ``os.ftruncate``). Only for a file a dead
    writer left open (``left_open``), and only while the caller holds its lock.
    """
    size = os.fstat(fd).st_size
    if size < sb.eof:
        os.ftruncate(fd, sb.eof)
        os.fsync(fd)
    return size
