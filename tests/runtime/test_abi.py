"""Our cffi layout against gcc: two real headers, and our own declarations compiled as C.

The headers: the 0.81 one the xla-cpu-pjrt wheel installs (the oldest plugin we test on), and
the 0.117 one our declarations follow (vendored in ``pjrt_c_api_0_117/``, see its SOURCE.txt).
A generated C program prints sizeof/offsetof of every struct and field we declare that
exists in the header, the PJRT_Api slot offsets and the enum values; any drift fails.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from pjrt_plugins.runtime import _cdef
from pjrt_plugins.runtime._cdef import ffi

ENUMS = (
    "PJRT_Extension_Type",
    "PJRT_Error_Code",
    "PJRT_NamedValue_Type",
    "PJRT_Buffer_Type",
    "PJRT_HostBufferSemantics",
    "PJRT_Buffer_MemoryLayout_Type",
)


def declared_structs() -> dict[str, list[tuple[str, int, int]]]:
    """``{struct: [(field, offset, size)]}`` for every struct with fields in our cdef."""
    return {
        name: [(field, item.offset, ffi.sizeof(item.type)) for field, item in ctype.fields]
        for name, ctype in _cdef.declared_structs()
    }


def extension_only_structs(header_text: str) -> set[str]:
    """Structs our cdef takes from the extension headers (profiler, memory descriptions), not pjrt_c_api.h.

    Only pjrt_c_api.h is vendored; these are checked for valid C by the gcc-versus-cffi test.
    """
    declared = set(re.findall(r"typedef struct (\w+) \{", _cdef._EXTENSION_TYPES))
    return {name for name in declared if not header_has(header_text, name)}


def compile_and_run(tmp_path: Path, gcc: str, prelude: str, body: list[str], *flags: str) -> list[list[str]]:
    source = tmp_path / "abi.c"
    source.write_text(prelude + "\n#include <stdio.h>\nint main(void) {\n" + "\n".join(body) + "\nreturn 0;\n}\n")
    exe = tmp_path / "abi"
    result = subprocess.run([gcc, "-std=c11", "-o", str(exe), str(source), *flags], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return [line.split() for line in out.splitlines()]


def field_line(struct: str, field: str) -> str:
    return (
        f'printf("F {struct} {field} %zu %zu\\n", (size_t)offsetof({struct}, {field}), '
        f"sizeof((({struct}*)0)->{field}));"
    )


#: The header our declarations follow, vendored with its license and source (SOURCE.txt).
HEADER_0_117_DIR = Path(__file__).resolve().parent / "pjrt_c_api_0_117"


@dataclass(frozen=True)
class Header:
    """A real pjrt_c_api.h: its folder (for -I), text, PJRT_API_MINOR, and the fields we declare
    that it lacks (appended after it)."""

    directory: Path
    text: str
    minor: int
    absent_fields: frozenset[tuple[str, str]]


def read_header(directory: Path, absent_fields: frozenset[tuple[str, str]]) -> Header:
    text = (directory / "pjrt_c_api.h").read_text()
    minor = re.search(r"#define PJRT_API_MINOR (\d+)", text)
    assert minor is not None, f"{directory}/pjrt_c_api.h has no PJRT_API_MINOR"
    return Header(directory, text, int(minor.group(1)), absent_fields)


@pytest.fixture(scope="module")
def header_0_81(cpu_header_dir: Path) -> Header:
    return read_header(cpu_header_dir, frozenset(_cdef.FIELDS_ADDED_AFTER_0_81))


@pytest.fixture(scope="module")
def header_0_117() -> Header:
    return read_header(HEADER_0_117_DIR, frozenset())


@pytest.fixture(scope="module", params=["0.81", "0.117"])
def header(request: pytest.FixtureRequest) -> Header:
    return request.getfixturevalue("header_0_81" if request.param == "0.81" else "header_0_117")


def header_has(header_text: str, name: str) -> bool:
    return re.search(rf"\b{re.escape(name)}\b", header_text) is not None


def header_api_slots(header_text: str) -> list[str]:
    body = header_text[header_text.index("typedef struct PJRT_Api {") :]
    body = body[: body.index("} PJRT_Api;")]
    return re.findall(r"_PJRT_API_STRUCT_FIELD\(\s*(\w+)\s*\)", body)  # long names wrap onto the next line


def test_cdef_is_valid_c_and_gcc_agrees_with_cffi(tmp_path, gcc):
    prelude = "#include <stddef.h>\n#include <stdint.h>\n#include <stdbool.h>\n" + _cdef.CDEF
    body = []
    structs = declared_structs()
    for struct, fields in structs.items():
        body.append(f'printf("S {struct} %zu\\n", sizeof({struct}));')
        body.extend(field_line(struct, field) for field, _, _ in fields)
    rows = compile_and_run(tmp_path, gcc, prelude, body)
    seen = 0
    for row in rows:
        if row[0] == "S":
            assert int(row[2]) == ffi.sizeof(row[1]), f"sizeof({row[1]})"
        else:
            _, struct, field, offset, size = row
            expected = {f: (o, s) for f, o, s in structs[struct]}[field]
            assert (int(offset), int(size)) == expected, f"{struct}.{field}"
            seen += 1
    assert seen > 500  # every field of every declared struct was checked


def test_the_headers_are_the_versions_we_name(header_0_81, header_0_117):
    assert header_0_81.minor == 81
    assert header_0_117.minor == _cdef.HEADER_MINOR == 117


def test_the_vendored_0_117_header_is_the_published_one():
    recorded = re.search(r"sha256 ([0-9a-f]{64})", (HEADER_0_117_DIR / "SOURCE.txt").read_text())
    assert recorded is not None
    digest = hashlib.sha256((HEADER_0_117_DIR / "pjrt_c_api.h").read_bytes()).hexdigest()
    assert digest == recorded.group(1), "pjrt_c_api_0_117/pjrt_c_api.h was edited; it must stay the wheel's copy"


def test_layout_matches_header(tmp_path, gcc, header):
    structs = declared_structs()
    body = []
    checked_structs = []
    for struct, fields in structs.items():
        if struct == "PJRT_Api" or not header_has(header.text, struct):
            continue
        checked_structs.append(struct)
        if re.search(rf"PJRT_DEFINE_STRUCT_TRAITS\(\s*{struct}\s*,", header.text):
            body.append(f'printf("S {struct} %zu\\n", (size_t){struct}_STRUCT_SIZE);')
        for field, _, _ in fields:
            if (struct, field) not in header.absent_fields:
                body.append(field_line(struct, field))
    for enum in ENUMS:
        for member in _cdef.enum_values(enum):
            if header_has(header.text, member):
                body.append(f'printf("E {member} %d\\n", (int){member});')
    rows = compile_and_run(tmp_path, gcc, '#include "pjrt_c_api.h"', body, f"-I{header.directory}")

    assert {"PJRT_Client_Create_Args", "PJRT_LoadedExecutable_Execute_Args", "PJRT_NamedValue"} <= set(checked_structs)
    if header.minor == _cdef.HEADER_MINOR:  # the layout we follow has every struct we declare but the extensions'
        assert set(checked_structs) == set(structs) - {"PJRT_Api"} - extension_only_structs(header.text)
    ours = {s: {f: (o, z) for f, o, z in fields} for s, fields in structs.items()}
    enum_values = {m: v for e in ENUMS for m, v in _cdef.enum_values(e).items()}
    fields_checked = enums_checked = sizes_checked = 0
    for row in rows:
        if row[0] == "F":
            _, struct, field, offset, size = row
            assert (int(offset), int(size)) == ours[struct][field], f"{struct}.{field} drifted from the 0.{header.minor} header"
            fields_checked += 1
        elif row[0] == "E":
            assert int(row[2]) == enum_values[row[1]], f"enum {row[1]}"
            enums_checked += 1
        else:
            struct, header_size = row[1], int(row[2])
            present = [(f, o, z) for f, o, z in structs[struct] if (struct, f) not in header.absent_fields]
            last_field, offset, size = present[-1]
            assert offset + size == header_size, f"{struct}_STRUCT_SIZE at 0.{header.minor} (our last field there: {last_field})"
            if len(present) == len(structs[struct]):
                assert _cdef.STRUCT_SIZE[struct] == header_size
            sizes_checked += 1
    assert fields_checked > 400 and enums_checked > 60 and sizes_checked > 70


def test_api_slot_order_matches_header(tmp_path, gcc, header):
    slots = header_api_slots(header.text)
    ours = [slot.name for slot in _cdef.API_SLOTS]
    assert ours[: len(slots)] == slots, f"PJRT_Api slot order differs from the 0.{header.minor} header"
    if header.minor == _cdef.HEADER_MINOR:
        assert ours == slots, "the PJRT_Api of the layout we follow has other slots than ours"
    body = [f'printf("A {name} %zu\\n", (size_t)offsetof(PJRT_Api, {name}));' for name in slots]
    body.append('printf("T PJRT_Api %zu\\n", (size_t)PJRT_Api_STRUCT_SIZE);')
    rows = compile_and_run(tmp_path, gcc, '#include "pjrt_c_api.h"', body, f"-I{header.directory}")
    for kind, name, value in rows:
        if kind == "A":
            index = _cdef.SLOT_INDEX[name]
            assert int(value) == 40 + 8 * index == ffi.offsetof("PJRT_Api", name)
        else:
            assert int(value) == 40 + 8 * len(slots) == _cdef.slot_end(slots[-1])


def test_every_slot_and_field_we_date_is_in_the_0_117_header(header_0_117):
    """What we mark as added after 0.81 (and the slots we date) exists in the layout we follow."""
    for struct, field in _cdef.FIELDS_ADDED:
        assert re.search(rf"\b{field}\b", header_0_117.text), f"{struct}.{field}"
    assert [slot.name for slot in _cdef.API_SLOTS] == header_api_slots(header_0_117.text)
    for slot in _cdef.API_SLOTS:
        assert slot.added <= header_0_117.minor


def test_fields_we_mark_as_newer_are_absent_from_the_0_81_header(tmp_path, gcc, cpu_header_dir):
    for (struct, field) in _cdef.FIELDS_ADDED_AFTER_0_81:
        source = tmp_path / "absent.c"
        source.write_text(f'#include <stddef.h>\n#include "pjrt_c_api.h"\nsize_t x = offsetof({struct}, {field});\n')
        result = subprocess.run(
            [gcc, "-c", "-o", str(tmp_path / "absent.o"), str(source), f"-I{cpu_header_dir}"],
            capture_output=True,
            text=True,
        )
        assert result.returncode != 0, f"{struct}.{field} exists at 0.81; fix FIELDS_ADDED_AFTER_0_81"


def test_header_0_117_totals():
    # Facts of the 0.117 layout our declarations follow (138 slots, as at 0.114; these sizes are
    # the ones a 0.117 plugin checks our struct_size against). PJRT_ExecuteOptions grew by
    # custom_options/num_custom_options after 0.114 (144 bytes there).
    assert len(_cdef.API_SLOTS) == 138
    assert _cdef.STRUCT_SIZE["PJRT_Api"] == 40 + 8 * 138 == ffi.sizeof("PJRT_Api")
    assert _cdef.STRUCT_SIZE["PJRT_ExecuteOptions"] == 160
    assert _cdef.STRUCT_SIZE["PJRT_Executable_DeserializeAndLoad_Args"] == 72
    assert _cdef.STRUCT_SIZE["PJRT_Client_Create_Args"] == 88
    # STRUCT_SIZE is offsetof(last)+sizeof(last), not sizeof: they differ when padding trails.
    assert _cdef.STRUCT_SIZE["PJRT_Buffer_IsDeleted_Args"] == 25 < ffi.sizeof("PJRT_Buffer_IsDeleted_Args")


def test_slot_minors_are_consistent():
    added = [slot.added for slot in _cdef.API_SLOTS]
    assert min(added) == _cdef.MIN_SUPPORTED_MINOR
    # Slots are appended over time, so the minor that added them never goes down.
    assert added == sorted(added)
    assert all(slot.args is None or slot.args in _cdef.STRUCT_SIZE for slot in _cdef.API_SLOTS)


def test_option_types_are_the_named_value_enum():
    from pjrt_plugins.options import OptionType

    declared = _cdef.enum_values("PJRT_NamedValue_Type")
    names = {"STRING": "kString", "INT64": "kInt64", "INT64_LIST": "kInt64List", "FLOAT": "kFloat", "BOOL": "kBool"}
    assert {f"PJRT_NamedValue_{names[kind.name]}": int(kind) for kind in OptionType} == declared


def test_every_declared_type_is_resolved_at_import_so_args_never_parse(monkeypatch):
    """A finalizer (a buffer's ``__del__`` during a garbage collection) must not enter cffi's type
    parser, which holds a lock and is not re-entrant: every args struct comes from the table made at import."""
    from pjrt_plugins.runtime import new_args

    assert set(_cdef.POINTER_CTYPES) == set(ffi.list_types()[0])
    assert all(_cdef.POINTER_CTYPES[name] is ffi.typeof(name + "*") for name in _cdef.STRUCT_SIZE)

    def no_parsing(*args, **kwargs):
        raise AssertionError(f"ffi.typeof{args} parsed a type after import")

    monkeypatch.setattr(ffi, "typeof", no_parsing)
    for struct, size in _cdef.STRUCT_SIZE.items():
        assert new_args(struct).struct_size == size
