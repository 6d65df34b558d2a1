"""The in-memory compile cache: keyed by graph structure (ops, shapes, dtypes, shardings, plugin).

The cache directory has its own tests (test_disk_cache.py).
"""

from __future__ import annotations

import torch

import pjrt_plugins.spmd as xs
from pjrt_plugins.spmd import execution
from pjrt_plugins.spmd import lowering

from _exec_support import GatherFactor, engine, overriding, spec, trace  # noqa: F401


def _key(fn, *args, shardings=(), vd=None, **options):
    gm = trace(fn, *args)
    for node, s in zip([n for n in gm.graph.nodes if n.op == "placeholder"], shardings):
        node.meta["sharding"] = s
    opts = lowering.LoweringOptions(**options) if options else lowering.LoweringOptions()
    return execution.program_key(gm.graph, opts, ("plugin", "1.0"))


def test_key_depends_on_structure_not_values():
    a = _key(lambda x: x * 2 + 1, torch.randn(4, 4))
    assert a == _key(lambda x: x * 2 + 1, torch.randn(4, 4))  # other values
    assert a != _key(lambda x: x * 3 + 1, torch.randn(4, 4))  # another constant
    assert a != _key(lambda x: x * 2 - 1, torch.randn(4, 4))  # another op
    assert a != _key(lambda x: x * 2 + 1, torch.randn(4, 5))  # another shape
    assert a != _key(lambda x: x * 2 + 1, torch.randn(4, 4, dtype=torch.float64))  # another dtype
    assert a != _key(lambda x: x * 2 + 1, torch.randn(4, 4), shardings=[spec(0, 1)])  # another sharding
    assert a != _key(lambda x: x * 2 + 1, torch.randn(4, 4), dense_gather_factor=8192)  # other plugin answers
    assert a != _key(lambda x: x * 2 + 1, torch.randn(4, 4), rng_algorithm="philox")


def test_key_depends_on_the_plugin_and_its_version():
    gm = trace(lambda x: x + 1, torch.randn(2))
    opts = lowering.LoweringOptions()
    assert execution.program_key(gm.graph, opts, ("cpu", "0.1")) != execution.program_key(gm.graph, opts, ("cpu", "0.2"))
    assert execution.program_key(gm.graph, opts, ("cpu", "0.1")) != execution.program_key(gm.graph, opts, ("gpu", "0.1"))


def test_same_step_hits_other_shapes_and_shardings_compile(engine):
    mesh = xs.Mesh(range(8), (2, 4))
    xs.clear_compile_cache()

    def step(x):
        return ((x * 2).sum(0) + 1).cpu()

    step(torch.randn(8, 8).to("pjrt"))
    step(torch.randn(8, 8).to("pjrt"))
    assert (xs.metrics().compiles, xs.metrics().cache_hits) == (1, 1)
    step(torch.randn(8, 16).to("pjrt"))
    assert xs.metrics().compiles == 2
    step(xs.mark_sharding(torch.randn(8, 16).to("pjrt"), mesh, (0, 1)))
    assert xs.metrics().compiles == 3
    assert execution.compiled_programs() == 3


def test_changing_a_plugin_answer_recompiles(engine):
    xs.clear_compile_cache()
    x = torch.randn(4, 4).to("pjrt")
    (x + 1).cpu()
    with overriding(engine.plugin, GatherFactor(8192)):
        (x + 1).cpu()
    assert xs.metrics().compiles == 2


def test_changing_float_operands_reuse_the_program(engine):
    xs.clear_compile_cache()
    x = torch.randn(4, 4)
    t = x.to("pjrt")
    for scale in (0.37, 0.41, 1e-3):
        assert torch.allclose((t * scale + scale).cpu(), x * scale + scale)
    assert xs.metrics().compiles == 1
    assert execution.last_program().lowered.scalars_input is not None  # the floats are one run-time input
    # Values a lowering special-cases (x ** 2 is x * x) stay part of the program.
    for exponent in (2.0, 2.5):
        assert torch.allclose((t.abs() ** exponent).cpu(), x.abs() ** exponent)
    assert xs.metrics().compiles == 3
