"""Sanity checks of a shared library's ELF headers against its file, before dlopen maps it.

The dynamic loader trusts these headers: a truncated file maps segments past its end and
the process dies of SIGBUS inside dlopen. Reading the headers first turns that, and a
library built for another machine, into a LibraryLoadError. Reads only; never maps the file.
"""

from __future__ import annotations

import os
import platform
import struct
import sys

from ..errors import LibraryLoadError

ELF_MAGIC = b"\x7fELF"
_ELFCLASS32, _ELFCLASS64 = 1, 2
_ELFDATA2LSB, _ELFDATA2MSB = 1, 2
_ET_DYN = 3
_HEADER = struct.Struct("<4sBBBBB7xHHIQQQIHHHHHH")  # Elf64_Ehdr, little-endian (64 bytes)
_PROGRAM_HEADER = struct.Struct("<IIQQQQQQ")  # Elf64_Phdr (56 bytes)
_SECTION_HEADER_SIZE = 64  # sizeof(Elf64_Shdr)
_PT_LOAD = 1
#: e_machine of the CPUs we may run on (from the ELF specification's EM_* values).
_MACHINES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183, "ppc64le": 21, "s390x": 22, "riscv64": 243}


def check_shared_library(path: str) -> None:
    """Raise :class:`LibraryLoadError` unless ``path`` looks like a loadable 64-bit little-endian
    shared library for this CPU whose header tables and segments all lie within the file."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(_HEADER.size)
            if not head.startswith(ELF_MAGIC):
                raise LibraryLoadError(
                    f"{path!r} is not a shared library (it does not start with the ELF magic bytes; found "
                    f"{head[:4]!r}). Point the plugin at its .so file."
                )
            if len(head) < _HEADER.size:
                raise _damaged(path, "its ELF header", _HEADER.size, size)
            (_, elf_class, data, _, _, _, kind, machine, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize,
             shnum, _) = _HEADER.unpack(head)
            _check_target(path, elf_class, data, kind, machine)
            if phnum == 0 or phentsize != _PROGRAM_HEADER.size:
                raise LibraryLoadError(f"{path!r} has no usable program headers, so it is not a loadable shared library")
            table_end = phoff + phnum * phentsize
            if table_end > size:
                raise _damaged(path, "its program header table", table_end, size)
            if shoff:
                sections_end = shoff + max(shnum, 1) * shentsize
                if shentsize != _SECTION_HEADER_SIZE or sections_end > size:
                    raise _damaged(path, "its section header table", sections_end, size)
            f.seek(phoff)
            table = f.read(phnum * phentsize)
    except OSError as exc:
        raise LibraryLoadError(f"cannot read PJRT plugin library {path!r}: {exc}") from exc
    for kind, _, offset, _, _, filesz, _, _ in _PROGRAM_HEADER.iter_unpack(table):
        if filesz and offset + filesz > size:
            what = "a loadable segment" if kind == _PT_LOAD else f"a segment (type {kind:#x})"
            raise _damaged(path, what, offset + filesz, size)


def _check_target(path: str, elf_class: int, data: int, kind: int, machine: int) -> None:
    if elf_class not in (_ELFCLASS32, _ELFCLASS64) or data not in (_ELFDATA2LSB, _ELFDATA2MSB):
        raise LibraryLoadError(
            f"{path!r} has a damaged ELF header (class {elf_class}, data encoding {data}); reinstall the plugin"
        )
    if elf_class != _ELFCLASS64:
        raise LibraryLoadError(f"{path!r} is a 32-bit library; this Python is 64-bit. Install the plugin's 64-bit build.")
    if data != (_ELFDATA2LSB if sys.byteorder == "little" else _ELFDATA2MSB):
        raise LibraryLoadError(f"{path!r} was built for a CPU of the other byte order. Install the build for this machine.")
    if kind != _ET_DYN:
        raise LibraryLoadError(f"{path!r} is an ELF file but not a shared library (type {kind}); point the plugin at its .so file.")
    expected = _MACHINES.get(platform.machine().lower())
    if expected is not None and machine != expected:
        raise LibraryLoadError(
            f"{path!r} was built for another CPU architecture (ELF machine {machine}, this machine is "
            f"{platform.machine()}, {expected}). Install the plugin's build for {platform.machine()}."
        )


def _damaged(path: str, what: str, end: int, size: int) -> LibraryLoadError:
    return LibraryLoadError(
        f"{path!r} is truncated or damaged: {what} ends at byte {end}, but the file has only {size} bytes. "
        "Loading it would crash the process; reinstall the plugin (an interrupted download or copy leaves such files)."
    )
