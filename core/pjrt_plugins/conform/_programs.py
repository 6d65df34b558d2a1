"""The StableHLO programs conformance runs: small, exact, and valid for any PJRT compiler.

Text only; building them needs nothing but string formatting.
"""

from __future__ import annotations

#: f32[4] + f32[4]: the smallest program that proves compile, argument passing and results.
ADD_F32 = """
module @conform_add {
  func.func public @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %a, %b : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"""

#: Two outputs of different dtypes and ranks: x * 2 and the sum of x as i32.
TWO_OUTPUTS = """
module @conform_outputs {
  func.func public @main(%x: tensor<2x3xi32>) -> (tensor<2x3xi32>, tensor<i32>) {
    %two = stablehlo.constant dense<2> : tensor<2x3xi32>
    %doubled = stablehlo.multiply %x, %two : tensor<2x3xi32>
    %zero = stablehlo.constant dense<0> : tensor<i32>
    %sum = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0, 1]
        : (tensor<2x3xi32>, tensor<i32>) -> tensor<i32>
    return %doubled, %sum : tensor<2x3xi32>, tensor<i32>
  }
}
"""


def spmd_square_and_sum(num_devices: int, shard_length: int = 2) -> str:
    """x sharded over ``num_devices``; returns x*x (sharded) and sum(x*x) (replicated: a cross-device reduce)."""
    length = num_devices * shard_length
    ids = ",".join(str(i) for i in range(num_devices))
    tiled = f'"{{devices=[{num_devices}]{ids}}}"'
    return f"""
module @conform_spmd attributes {{mhlo.num_partitions = {num_devices} : i32, mhlo.num_replicas = 1 : i32}} {{
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
