"""Seeing a step without running it, and acting after it: ``xm.get_stablehlo`` / ``get_stablehlo_bytecode`` of
the pending graph, ``xm.add_step_closure``, and ``xm.xla_real_devices`` / ``xla_replication_devices``.

On the real 8-device CPU plugin; the bytecode is read back with jaxlib's StableHLO bindings.
"""

from __future__ import annotations

import threading

import pytest
import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy, stablehlo

import pjrt_plugins.spmd as xs
import pjrt_plugins.spmd.xla_model as xm
from pjrt_plugins.errors import VirtualDeviceError
from pjrt_plugins.spmd.frontend import engine as spmd_engine
from pjrt_plugins.spmd.trace import wait_async_closures

from _exec_support import engine  # noqa: F401

MESH = xs.Mesh(range(8), (2, 4), ("data", "model"))


def _spec(partition) -> str:
    return MESH.get_op_sharding(partition).to_hlo()


def test_get_stablehlo_lowers_the_pending_graph_with_its_shardings_and_runs_nothing(engine):
    x0 = torch.randn(8, 4)
    x = xs.mark_sharding(x0.to("pjrt"), MESH, ("data", None))
    y = torch.tanh(x * 2 + 1)
    xs.mark_sharding(y, MESH, (None, "model"))
    before = xs.metrics()
    text = xm.get_stablehlo([y])
    after = xs.metrics()
    assert after.compiles == before.compiles and after.executions == before.executions
    assert text.startswith("module") and "func.func public @main" in text
    if "sdy.mesh" in text:  # Shardy (the default where the plugin takes it)
        assert '{sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>}' in text  # the argument's layout
        assert 'sdy.sharding_constraint %' in text and '[{}, {"model"}]' in text  # the pending value's mark
    else:
        assert f'mhlo.sharding = "{_spec(("data", None))}"' in text
        assert "@Sharding(%" in text and _spec((None, "model")) in text
    assert "stablehlo.tanh" in text
    assert spmd_engine().pending_ops() > 0  # still pending: it runs once, when read
    torch.testing.assert_close(y.cpu(), torch.tanh(x0 * 2 + 1))


def test_get_stablehlo_of_everything_pending_and_of_data(engine):
    x = xs.mark_sharding(torch.randn(8, 4).to("pjrt"), MESH, ("data", None))
    a, b = x + 1, x.sum(0)
    text = xm.get_stablehlo()  # every live pending tensor: two results
    assert text.count("tensor<8x4xf32>") >= 2 and "-> (tensor<8x4xf32>, tensor<4xf32>)" in text, text
    xs.sync()
    data_only = xm.get_stablehlo([x])  # a tensor with data: an argument returned as it is
    assert "return %arg0" in data_only
    assert _spec(("data", None)) in data_only or '[{"axis_0"}, {}]' in data_only or '[{"data"}, {}]' in data_only
    assert "func.func public @main() " in xm.get_stablehlo()  # nothing pending
    del a, b


def test_get_stablehlo_bytecode_is_a_portable_artifact_of_the_same_module(engine):
    x = xs.mark_sharding(torch.randn(8, 4).to("pjrt"), MESH, ("data", None))
    y = x.exp()
    blob = xm.get_stablehlo_bytecode([y])
    assert isinstance(blob, bytes) and blob.startswith(b"ML\xefR")  # MLIR bytecode
    with ir.Context() as ctx:
        stablehlo.register_dialect(ctx)
        sdy.register_dialect(ctx)
        module = stablehlo.deserialize_portable_artifact(ctx, blob)
        text = str(module)
    assert "stablehlo.exponential" in text
    assert _spec(("data", None)) in text or '[{"data"}, {}]' in text, text


def test_get_stablehlo_refuses_cpu_tensors(engine):
    with pytest.raises(VirtualDeviceError):
        xm.get_stablehlo([torch.ones(2)])


def test_step_closures_run_after_the_step_in_order_with_their_args(engine):
    x = torch.randn(4).to("pjrt")
    y = x * 3
    seen: list = []
    xm.add_step_closure(lambda t, tag: seen.append((tag, y.sharding_spec != "" or spmd_engine().pending_ops() == 0,
                                                    t.cpu().clone())), args=(y, "first"))
    xm.add_step_closure(seen.append, args=("second",))
    assert seen == [] and spmd_engine().pending_ops() > 0
    xm.mark_step()
    assert [s[0] if isinstance(s, tuple) else s for s in seen] == ["first", "second"]
    assert seen[0][1]  # the step had run: no pending work when the closure read y
    torch.testing.assert_close(seen[0][2], x.cpu() * 3)
    xs.sync()  # a closure runs once
    assert len(seen) == 2


def test_step_closures_run_even_when_nothing_is_pending(engine):
    xs.sync()
    seen = []
    xm.add_step_closure(seen.append, args=(1,))
    xs.sync()
    assert seen == [1]


def test_async_step_closures_run_in_order_on_another_thread_and_report_errors(engine):
    threads, order = [], []
    done = threading.Event()
    for i in range(3):
        xm.add_step_closure(lambda i: (order.append(i), threads.append(threading.current_thread())),
                            args=(i,), run_async=True)
    xm.add_step_closure(done.set, run_async=True)
    xs.sync()
    assert done.wait(30)
    assert order == [0, 1, 2] and all(t is not threading.main_thread() for t in threads)
    xm.add_step_closure(lambda: 1 / 0, run_async=True)
    xs.sync()
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        wait_async_closures()  # what the next sync would raise


def test_add_step_closure_checks_its_arguments(engine):
    with pytest.raises(TypeError, match="callable"):
        xm.add_step_closure(42)
    with pytest.raises(TypeError, match="tuple"):
        xm.add_step_closure(print, args=[1])


def test_real_and_replication_devices(engine):
    assert xm.xla_real_devices() == ["SPMD:0"] == xm.xla_real_devices(["pjrt:0"])
    assert xm.xla_replication_devices() == [f"CPU:{i}" for i in range(8)]
    assert xm.xla_replication_devices([torch.device("pjrt:0")]) == [f"CPU:{i}" for i in range(8)]
    with pytest.raises(RuntimeError, match="number of devices"):
        xm.xla_replication_devices(["pjrt:0", "pjrt:0"])
    with pytest.raises(VirtualDeviceError):
        xm.xla_real_devices(["xla:1"])
