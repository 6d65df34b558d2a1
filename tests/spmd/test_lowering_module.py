"""The lowered module itself: shardings, version targeting, decompositions, errors, and the plugin's device cases."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from pjrt_plugins.errors import LoweringError, UnsupportedOpError
from pjrt_plugins.spmd import execution
from pjrt_plugins.spmd import devices
from pjrt_plugins.spmd.lowering import (
    LoweringOptions,
    expand_graph,
    lower_graph,
    supported_ops,
    target_version,
)
from pjrt_plugins.spmd.lowering._mlir import make_context

from _exec_support import GatherFactor, RngAlgorithm, assert_close, engine, overriding, run, spec, trace  # noqa: F401

aten = torch.ops.aten


def _lower(fn, *args, shardings=None, **options):
    gm = trace(fn, *args)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, s in zip(placeholders, shardings or []):
        node.meta["sharding"] = s
    return lower_graph(gm.graph, LoweringOptions(**options))


def test_inputs_carry_shardings_and_module_carries_partition_counts():
    lowered = _lower(lambda x, y: x @ y, torch.randn(8, 4), torch.randn(4, 4),
                     shardings=[spec(0, None), None], num_partitions=8)
    text = lowered.text
    assert "mhlo.num_partitions = 8" in text and "mhlo.num_replicas = 1" in text
    assert 'mhlo.sharding = "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"' in text
    assert 'mhlo.sharding = "{replicated}"' in text  # an unannotated input is replicated
    assert lowered.input_shardings == [spec(0, None).to_hlo(), "{replicated}"]
    # Results carry no sharding: the partitioner chooses them.
    result_part = text.split("->", 1)[1].split("{", 1)[0]
    assert "mhlo.sharding" not in result_part


def test_marked_intermediate_gets_a_sharding_custom_call():
    gm = trace(lambda x: (x * 2).sum(0), torch.randn(8, 8))
    mul = next(n for n in gm.graph.nodes if n.target is aten.mul.Tensor)
    mul.meta["sharding"] = spec(None, 1)
    text = lower_graph(gm.graph, LoweringOptions(num_partitions=8)).text
    assert "stablehlo.custom_call @Sharding" in text
    assert spec(None, 1).to_hlo() in text


def test_unpartitioned_module_has_no_sharding_attributes():
    lowered = _lower(lambda x: x + 1, torch.randn(3), num_partitions=1)
    assert "mhlo.sharding" not in lowered.text
    assert lowered.input_shardings == [None]


def test_portable_artifact_targets_the_plugins_older_stablehlo_version():
    lowered = _lower(lambda x: x.exp(), torch.randn(3), target_version="1.13.3")
    assert lowered.target_version == "1.13.3"
    assert b"StableHLO_v1.13.3" in lowered.artifact[:64]
    # jaxlib reads it back as a module.
    with make_context():
        module = ir.Module.parse(stablehlo.deserialize_portable_artifact_str(lowered.artifact))
        assert "stablehlo.exponential" in str(module)


def test_target_version_is_the_older_of_plugin_and_jaxlib():
    ours = stablehlo.get_current_version()
    assert target_version(None) == ours
    assert target_version("1.13.3") == "1.13.3"
    assert target_version("99.0.0") == ours
    with pytest.raises(LoweringError, match="older than the oldest"):
        target_version("0.1.0")


def test_cpu_plugin_version_is_read_from_its_attributes(engine):
    options = execution.lowering_options(engine)
    assert options.target_version == "1.13.3"
    assert options.num_partitions == 8


def test_chlo_ops_are_legalized_to_plain_stablehlo():
    lowered = _lower(lambda x: torch.erf(x) + torch.erfinv(x.clamp(-0.5, 0.5)), torch.randn(4))
    assert "chlo." not in lowered.text


def test_ops_without_lowering_are_reduced_by_torch_decompositions():
    gm = trace(lambda x: F.layer_norm(F.gelu(x), (6,)), torch.randn(4, 6))
    assert any(n.target is aten.native_layer_norm.default for n in gm.graph.nodes)
    expanded = expand_graph(gm.graph)
    targets = {n.target for n in expanded.nodes if n.op == "call_function"}
    assert aten.native_layer_norm.default not in targets
    assert aten.gelu.default not in targets
    assert aten.rsqrt.default in targets and aten.erf.default in targets


def test_inplace_calls_become_functional_and_rebind_their_target(engine):
    def fn(x, y):
        z = x.clone()
        z.add_(y)
        z.mul_(2)
        return z + x

    gm = fx.experimental.proxy_tensor.make_fx(fn)(torch.randn(8, 4), torch.randn(8, 4))
    assert any(n.target is aten.add_.Tensor for n in gm.graph.nodes)
    x, y = torch.randn(8, 4), torch.randn(8, 4)
    outs, _ = execution.run_graph(gm, [x, y], [spec(0, None), spec(0, None)])
    assert_close("inplace", outs[0], fn(x.clone(), y))


def test_unsupported_op_raises_an_error_naming_it():
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(4, 4, device="meta")
    y = g.call_function(aten.linalg_matrix_exp.default, (x,))
    y.meta["val"] = torch.empty(4, 4, device="meta")
    g.output((y,))
    with pytest.raises(UnsupportedOpError, match=r"aten\.linalg_matrix_exp\.default") as info:
        lower_graph(g, LoweringOptions())
    assert info.value.op == "aten.linalg_matrix_exp.default"
    assert isinstance(info.value, NotImplementedError)


def test_an_explicit_generator_is_refused_by_the_lowering_too():
    # The tracer refuses generator= first; a graph built elsewhere must not silently ignore one.
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(4, device="meta")
    y = g.call_function(aten.uniform.default, (x,), {"generator": torch.Generator()})
    y.meta["val"] = torch.empty(4, device="meta")
    g.output((y,))
    with pytest.raises(UnsupportedOpError, match="torch.Generator") as info:
        lower_graph(g, LoweringOptions())
    assert info.value.op == "aten.uniform.default"


def test_metadata_mismatch_is_reported_not_silently_lowered():
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(4, device="meta")
    y = g.call_function(aten.add.Tensor, (x, x))
    y.meta["val"] = torch.empty(5, device="meta")  # wrong on purpose
    g.output((y,))
    with pytest.raises(LoweringError, match="aten.add.Tensor"):
        lower_graph(g, LoweringOptions())


def test_supported_op_list_covers_the_issue():
    ops = set(supported_ops())
    for name in ["aten.add.Tensor", "aten.mm.default", "aten.bmm.default", "aten.addmm.default", "aten.sum.dim_IntList",
                 "aten.mean.dim", "aten.amax.default", "aten.argmax.default", "aten._softmax.default",
                 "aten._log_softmax.default", "aten.view.default", "aten.permute.default", "aten.expand.default",
                 "aten.slice.Tensor", "aten.select.int", "aten.cat.default", "aten.full.default",
                 "aten.arange.start_step", "aten.index_select.default", "aten.embedding.default", "aten.rand.default",
                 "aten.randn.default", "aten.where.self", "aten._to_copy.default", "aten.native_dropout.default"]:
        assert name in ops, name


# -- the plugins' device cases: the gather factor and the RNG algorithm -----------------------------


def test_gather_is_sparse_for_factor_zero_and_dense_within_factor_times_ten():
    table, idx = torch.randn(20, 6), torch.randint(0, 20, (4, 5))
    fn = lambda w, i: F.embedding(i, w)  # noqa: E731
    sparse = _lower(fn, table, idx, dense_gather_factor=0).text
    assert "stablehlo.gather" in sparse and "dot_general" not in sparse
    dense = _lower(fn, table, idx, dense_gather_factor=2).text  # 20 <= 2 * 10
    assert "stablehlo.gather" not in dense and "dot_general" in dense
    too_big = _lower(fn, table, idx, dense_gather_factor=1).text  # 20 > 1 * 10
    assert "stablehlo.gather" in too_big


def test_gather_lowering_asks_the_active_plugin_and_both_forms_agree(engine):
    table, idx = torch.randn(20, 6), torch.randint(0, 20, (4, 5))
    fn = lambda w, i: [F.embedding(i, w), w.index_select(0, i[0])]  # noqa: E731
    ref = fn(table, idx)
    texts = []
    for factor in (0, 8192):
        with overriding(engine.plugin, GatherFactor(factor)):
            assert engine.plugin.dense_gather_factor() == factor
            outs, program = run(fn, [table, idx], [spec(None, 1), spec(0, None)])
        for o, r in zip(outs, ref):
            assert_close(f"gather factor {factor}", o, r)
        texts.append(program.lowered.text)
    assert "stablehlo.gather" in texts[0]
    assert "stablehlo.gather" not in texts[1] and "dot_general" in texts[1]


def test_random_ops_use_the_plugins_rng_algorithm(engine):
    fn = lambda x: torch.rand(16, 16) + x  # noqa: E731
    x = torch.zeros(16, 16)
    results = {}
    for name, mlir_name in [("three_fry", "THREE_FRY"), ("philox", "PHILOX"), ("default", "DEFAULT")]:
        with overriding(engine.plugin, RngAlgorithm(name)):
            devices.set_seed(7)
            outs, program = run(fn, [x], [spec(0, 1)])
        assert f"algorithm = {mlir_name}" in program.lowered.text
        assert program.uses_rng
        u = outs[0]
        assert 0.0 <= u.min().item() and u.max().item() < 1.0
        results[name] = u
    assert not torch.equal(results["three_fry"], results["philox"])


def test_random_values_do_not_repeat_across_devices(engine):
    outs, program = run(lambda x: torch.rand(64, 64) + x, [torch.zeros(64, 64)], [spec(0, 1)])
    u = outs[0]
    assert program.output_shardings[0] == spec(0, 1)
    tiles = [u[i * 32:(i + 1) * 32, j * 16:(j + 1) * 16] for i in range(2) for j in range(4)]
    assert all(not torch.equal(tiles[0], t) for t in tiles[1:])
    assert abs(u.mean().item() - 0.5) < 0.05


def test_getitem_of_multi_output_ops_lowers():
    lowered = _lower(lambda x: x.max(1), torch.randn(4, 5))
    assert lowered.output_dtypes == [torch.float32, torch.int64]
    assert operator.getitem  # multi-output ops are read through getitem nodes


def test_transposed_matrix_product_is_lowered_as_the_swapped_product(engine):
    """Autograd's weight gradients are (x^T g)^T: no transposed copy of the product is emitted."""
    a, b = torch.randn(8, 16), torch.randn(16, 12)
    lowered = _lower(lambda a, b: (a @ b).t(), a, b)
    assert "stablehlo.transpose" not in lowered.text
    outs, _ = run(lambda a, b: (a @ b).t(), [a, b], [spec(0, None), spec(None, 1)])
    assert_close("(a @ b).t()", outs[0], (a @ b).t())
