"""Our cffi layout against gcc: the installed 0.81 header, and our own declarations compiled as C.

A generated C program prints sizeof/offsetof of every struct and field we declare that
exists in the header, the PJRT_Api slot offsets and the enum values; any drift fails.
"""

from __future__ import annotations

import re
import subprocess
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


@pytest.fixture(scope="module")
def header_text(cpu_header_dir: Path) -> str:
    return (cpu_header_dir / "pjrt_c_api.h").read_text()


def header_has(header_text: str, name: str) -> bool:
    return re.search(rf"\b{re.escape(name)}\b", header_text) is not None


def header_api_slots(header_text: str) -> list[str]:
    body = header_text[header_text.index("typedef struct PJRT_Api {") :]
    body = body[: body.index("} PJRT_Api;")]
    return re.findall(r"_PJRT_API_STRUCT_FIELD\((\w+)\)", body)


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


def test_layout_matches_installed_0_81_header(tmp_path, gcc, cpu_header_dir, header_text):
    structs = declared_structs()
    newer = _cdef.FIELDS_ADDED_AFTER_0_81
    body = []
    checked_structs = []
    for struct, fields in structs.items():
        if struct == "PJRT_Api" or not header_has(header_text, struct):
            continue
        checked_structs.append(struct)
        if re.search(rf"PJRT_DEFINE_STRUCT_TRAITS\(\s*{struct}\s*,", header_text):
            body.append(f'printf("S {struct} %zu\\n", (size_t){struct}_STRUCT_SIZE);')
        for field, _, _ in fields:
            if (struct, field) not in newer:
                body.append(field_line(struct, field))
    for enum in ENUMS:
        for member in _cdef.enum_values(enum):
            if header_has(header_text, member):
                body.append(f'printf("E {member} %d\\n", (int){member});')
    rows = compile_and_run(tmp_path, gcc, '#include "pjrt_c_api.h"', body, f"-I{cpu_header_dir}")

    assert {"PJRT_Client_Create_Args", "PJRT_LoadedExecutable_Execute_Args", "PJRT_NamedValue"} <= set(checked_structs)
    ours = {s: {f: (o, z) for f, o, z in fields} for s, fields in structs.items()}
    enum_values = {m: v for e in ENUMS for m, v in _cdef.enum_values(e).items()}
    fields_checked = enums_checked = sizes_checked = 0
    for row in rows:
        if row[0] == "F":
            _, struct, field, offset, size = row
            assert (int(offset), int(size)) == ours[struct][field], f"{struct}.{field} drifted from the 0.81 header"
            fields_checked += 1
        elif row[0] == "E":
            assert int(row[2]) == enum_values[row[1]], f"enum {row[1]}"
            enums_checked += 1
        else:
            struct, header_size = row[1], int(row[2])
            present = [(f, o, z) for f, o, z in structs[struct] if (struct, f) not in newer]
            last_field, offset, size = present[-1]
            assert offset + size == header_size, f"{struct}_STRUCT_SIZE at 0.81 (last field {last_field})"
            if len(present) == len(structs[struct]):
                assert _cdef.STRUCT_SIZE[struct] == header_size
            sizes_checked += 1
    assert fields_checked > 400 and enums_checked > 60 and sizes_checked > 70


def test_api_slot_order_matches_0_81_header(tmp_path, gcc, cpu_header_dir, header_text):
    slots_081 = header_api_slots(header_text)
    ours = [slot.name for slot in _cdef.API_SLOTS]
    assert ours[: len(slots_081)] == slots_081, "PJRT_Api slot order differs from the 0.81 header"
    body = [f'printf("A {name} %zu\\n", (size_t)offsetof(PJRT_Api, {name}));' for name in slots_081]
    body.append('printf("T PJRT_Api %zu\\n", (size_t)PJRT_Api_STRUCT_SIZE);')
    rows = compile_and_run(tmp_path, gcc, '#include "pjrt_c_api.h"', body, f"-I{cpu_header_dir}")
    for kind, name, value in rows:
        if kind == "A":
            index = _cdef.SLOT_INDEX[name]
            assert int(value) == 40 + 8 * index == ffi.offsetof("PJRT_Api", name)
        else:
            assert int(value) == 40 + 8 * len(slots_081) == _cdef.slot_end(slots_081[-1])


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


def test_header_0_114_totals():
    # Facts of the 0.114 layout our declarations follow (138 slots; these sizes are the
    # ones a 0.114 plugin checks our struct_size against).
    assert len(_cdef.API_SLOTS) == 138
    assert _cdef.STRUCT_SIZE["PJRT_Api"] == 40 + 8 * 138 == ffi.sizeof("PJRT_Api")
    assert _cdef.STRUCT_SIZE["PJRT_ExecuteOptions"] == 144
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
