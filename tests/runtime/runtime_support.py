"""Helpers for the runtime tests: StableHLO test programs and jaxlib re-encoding.

The add and SPMD programs are the conformance kit's own (pjrt_plugins.conform._programs), so
one source serves the runtime, backend and conformance tests; the others are runtime-only.
"""

from __future__ import annotations

import io

import numpy as np

from pjrt_plugins.conform._programs import ADD_F32 as ADD_F32_4
from pjrt_plugins.conform._programs import spmd_square_and_sum as _conform_spmd_square_and_sum

#: The create options of the CPU plugin (the backend package declares the same schema).
CPU_OPTION_SCHEMA = {"cpu_device_count": int}


# Several outputs of different shapes and dtypes.
MULTI_OUTPUT = """
module @multi {
  func.func public @main(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>)
      -> (tensor<2x3xf32>, tensor<2x3xf32>, tensor<f32>, tensor<2x3xi32>) {
    %sum = stablehlo.add %a, %b : tensor<2x3xf32>
    %prod = stablehlo.multiply %a, %b : tensor<2x3xf32>
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %total = stablehlo.reduce(%sum init: %zero) applies stablehlo.add across dimensions = [0, 1]
        : (tensor<2x3xf32>, tensor<f32>) -> tensor<f32>
    %int = stablehlo.convert %prod : (tensor<2x3xf32>) -> tensor<2x3xi32>
    return %sum, %prod, %total, %int : tensor<2x3xf32>, tensor<2x3xf32>, tensor<f32>, tensor<2x3xi32>
  }
}
"""


def identity(mlir_type: str) -> str:
    """A program returning its argument (any element type): ``identity("tensor<3xbf16>")``."""
    return f"""
module @identity {{
  func.func public @main(%a: {mlir_type}) -> {mlir_type} {{
    return %a : {mlir_type}
  }}
}}
"""


def spmd_square_and_sum(num_devices: int = 8, length: int = 16) -> str:
    """An SPMD program: x (``length`` long) sharded over ``num_devices``; returns x*x (sharded) and sum(x*x)."""
    if length % num_devices:
        raise ValueError(f"length {length} must be a multiple of num_devices {num_devices}")
    return _conform_spmd_square_and_sum(num_devices, length // num_devices)


def busy_loop(iterations: int) -> str:
    """A program that spins ``iterations`` times (a long C call for GIL tests); returns the count."""
    return f"""
module @busy {{
  func.func public @main(%start: tensor<i64>) -> tensor<i64> {{
    %one = stablehlo.constant dense<1> : tensor<i64>
    %limit = stablehlo.constant dense<{iterations}> : tensor<i64>
    %result = stablehlo.while(%i = %start) : tensor<i64>
      cond {{
        %lt = stablehlo.compare LT, %i, %limit : (tensor<i64>, tensor<i64>) -> tensor<i1>
        stablehlo.return %lt : tensor<i1>
      }} do {{
        %next = stablehlo.add %i, %one : tensor<i64>
        stablehlo.return %next : tensor<i64>
      }}
    return %result : tensor<i64>
  }}
}}
"""


def busy_dot_loop(iterations: int, size: int = 32) -> str:
    """Like :func:`busy_loop`, with a ``size``-square matrix product in each step: enough work that
    the CPU plugin dispatches it asynchronously (it runs programs under 1000 flops inline, inside
    the Execute call), so ``execute()`` spends its time waiting for the device-complete event."""
    t = f"tensor<{size}x{size}xf32>"
    return f"""
module @busy_dot {{
  func.func public @main(%x: {t}) -> {t} {{
    %zero = stablehlo.constant dense<0> : tensor<i64>
    %one = stablehlo.constant dense<1> : tensor<i64>
    %limit = stablehlo.constant dense<{iterations}> : tensor<i64>
    %result:2 = stablehlo.while(%i = %zero, %m = %x) : tensor<i64>, {t}
      cond {{
        %lt = stablehlo.compare LT, %i, %limit : (tensor<i64>, tensor<i64>) -> tensor<i1>
        stablehlo.return %lt : tensor<i1>
      }} do {{
        %next = stablehlo.add %i, %one : tensor<i64>
        %p = stablehlo.dot_general %m, %m, contracting_dims = [1] x [0] : ({t}, {t}) -> {t}
        stablehlo.return %next, %p : tensor<i64>, {t}
      }}
    return %result#1 : {t}
  }}
}}
"""


def _context():
    from jaxlib.mlir import ir
    from jaxlib.mlir._mlir_libs import _jax_mlir_ext
    from jaxlib.mlir.dialects import stablehlo

    registry = ir.DialectRegistry()
    _jax_mlir_ext.register_dialects(registry)
    context = ir.Context()
    context.append_dialect_registry(registry)
    stablehlo.register_dialect(context)
    context.load_all_available_dialects()
    return context


def to_bytecode(text: str) -> bytes:
    """MLIR bytecode of a StableHLO text module (via jaxlib)."""
    from jaxlib.mlir import ir

    with _context():
        module = ir.Module.parse(text)
        out = io.BytesIO()
        module.operation.write_bytecode(out)
        return out.getvalue()


def to_portable_artifact(text: str, target_version: str) -> bytes:
    """A StableHLO portable artifact (VHLO bytecode) targeting ``target_version`` (via jaxlib)."""
    from jaxlib.mlir.dialects import stablehlo

    return stablehlo.serialize_portable_artifact_str(text, target_version)


# A transpose whose output the compiler lays out column-major on the device.
COLUMN_MAJOR_TRANSPOSE = """
module @t {
  func.func public @main(%a: tensor<2x3xf32>) -> (tensor<3x2xf32> {mhlo.layout_mode = "{0,1}"}) {
    %0 = stablehlo.transpose %a, dims = [1, 0] : (tensor<2x3xf32>) -> tensor<3x2xf32>
    return %0 : tensor<3x2xf32>
  }
}
"""


def aligned(n: int, dtype=np.float32) -> np.ndarray:
    """An uninitialized 1-D array on the runtime's host alignment (the CPU plugin aliases those)."""
    from pjrt_plugins.runtime import aligned_empty

    return aligned_empty(n * np.dtype(dtype).itemsize).view(dtype)


def shim_report(path) -> str:
    """What a shim plugin built with a recording switch (see shim_plugin.c) noted so far."""
    import cffi

    reader = cffi.FFI()
    reader.cdef("const char* shim_report(void);")
    return reader.string(reader.dlopen(str(path), reader.RTLD_NOW | reader.RTLD_NODELETE).shim_report()).decode()


def launch_ids(path) -> list[int]:
    """The launch ids a shim built with SHIM_RECORD_LAUNCH_IDS saw, in order (over the whole process)."""
    return [int(entry.split("=")[1]) for entry in shim_report(path).split(";") if entry.startswith("launch=")]
