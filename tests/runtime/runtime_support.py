"""Helpers for the runtime tests: installed plugin files, StableHLO test programs, jaxlib re-encoding."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path


#: The create options of the CPU plugin (the backend package declares the same schema).
CPU_OPTION_SCHEMA = {"cpu_device_count": int}


def package_dir(module: str) -> Path | None:
    """The directory of an installed package, without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def site_file(module: str, relative: str) -> Path | None:
    """``relative`` inside an installed package, if that file exists."""
    directory = package_dir(module)
    if directory is None:
        return None
    path = directory / relative
    return path if path.is_file() else None


ADD_F32_4 = """
module @add {
  func.func public @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %a, %b : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"""

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
    """An SPMD program: x sharded over ``num_devices``; returns x*x (sharded) and sum(x*x) (replicated)."""
    ids = ",".join(str(i) for i in range(num_devices))
    tiled = f'"{{devices=[{num_devices}]{ids}}}"'
    return f"""
module @spmd attributes {{mhlo.num_partitions = {num_devices} : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func public @main(%x: tensor<{length}xf32> {{mhlo.sharding = {tiled}}})
      -> (tensor<{length}xf32> {{mhlo.sharding = {tiled}}}, tensor<f32> {{mhlo.sharding = "{{replicated}}"}}) {{
    %sq = stablehlo.multiply %x, %x : tensor<{length}xf32>
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %sum = stablehlo.reduce(%sq init: %zero) applies stablehlo.add across dimensions = [0]
        : (tensor<{length}xf32>, tensor<f32>) -> tensor<f32>
    return %sq, %sum : tensor<{length}xf32>, tensor<f32>
  }}
}}
"""


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
