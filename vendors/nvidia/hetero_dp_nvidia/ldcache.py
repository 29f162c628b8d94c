"""Read glibc's ``/etc/ld.so.cache``: which library soname lives at which path.

The layout is glibc's (``sysdeps/generic/dl-cache.h``): an optional old-format
part (magic ``ld.so-1.7.0``) followed by, or replaced by, the new format
(magic ``glibc-ld.so.cache`` + version ``1.1``)::

    char magic[17], version[3]; uint32 nlibs, len_strings;
    uint8 flags, pad[3]; uint32 extension_offset, unused[3];      # 48 bytes
    struct { int32 flags; uint32 key, value, osversion; uint64 hwcap; } libs[nlibs]

``key`` (the soname) and ``value`` (the path) are offsets of NUL-terminated
strings from the start of the new-format header; numbers are in the host's
byte order. The low byte of an entry's flags is the library type
(``FLAG_ELF_LIBC6`` = 3), the next one the architecture (``FLAG_X8664_LIB64``
0x0300, ``FLAG_AARCH64_LIB64`` 0x0a00, 0 for 32-bit i386/arm): NVIDIA's container
toolkit keeps only the 64-bit entries on a 64-bit host, and so do we.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

MAGIC_NEW = b"glibc-ld.so.cache1.1"
_HEADER = struct.Struct("=20sIIB3xI12x")  # 48 bytes
_ENTRY = struct.Struct("=iIIIQ")  # 24 bytes
FLAG_TYPE_MASK = 0x00FF
FLAG_ARCH_MASK = 0xFF00
FLAG_ELF_LIBC6 = 0x0003


class LdCacheError(ValueError):
    """The file is not a glibc ld cache of the new format."""


def parse(data: bytes, *, only_64bit: bool | None = None) -> list[tuple[str, str]]:
    """``(soname, path)`` pairs of the cache, in cache order (glibc's preference order).

    ``only_64bit`` (default: when this interpreter is 64-bit) drops 32-bit entries.
    Raises :class:`LdCacheError` for data that is not a new-format cache.
    """
    if only_64bit is None:
        only_64bit = sys.maxsize > 2**32
    start = data.find(MAGIC_NEW)
    if start < 0 or len(data) < start + _HEADER.size:
        raise LdCacheError("no glibc-ld.so.cache1.1 header")
    _magic, nlibs, _len_strings, _flags, _ext = _HEADER.unpack_from(data, start)
    table = start + _HEADER.size
    if table + nlibs * _ENTRY.size > len(data):
        raise LdCacheError(f"{nlibs} entries do not fit in {len(data)} bytes")
    out = []
    for i in range(nlibs):
        flags, key, value, _os, _hwcap = _ENTRY.unpack_from(data, table + i * _ENTRY.size)
        if flags & FLAG_TYPE_MASK != FLAG_ELF_LIBC6:
            continue
        if only_64bit and not flags & FLAG_ARCH_MASK:
            continue
        out.append((_string(data, start + key), _string(data, start + value)))
    return out


def _string(data: bytes, offset: int) -> str:
    end = data.find(b"\0", offset)
    if offset >= len(data) or end < 0:
        raise LdCacheError(f"string offset {offset} is outside the cache")
    return data[offset:end].decode("utf-8", "surrogateescape")


def read(path: str | Path) -> list[tuple[str, str]]:
    """:func:`parse` of the file at ``path``; [] when it is missing or unreadable."""
    try:
        return parse(Path(path).read_bytes())
    except (OSError, LdCacheError):
        return []
