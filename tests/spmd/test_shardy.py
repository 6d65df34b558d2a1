"""Shardy, the partitioner XLA is moving to: the lowering's ``sdy`` annotations, the per-plugin probe and its
GSPMD fallback, the switch, and the same results as GSPMD for real sharded programs."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import pjrt_plugins.runtime._partitioner as runtime_partitioner
import pjrt_plugins.spmd as xs
from pjrt_plugins._native_logs import LOG_LEVEL_ENV, TPU_VARIABLES, XLA_VARIABLES
from pjrt_plugins.errors import ShardingError
from pjrt_plugins.spmd import execution
from pjrt_plugins.spmd.lowering import LoweringOptions, lower_graph
from pjrt_plugins.spmd.sharding import Mesh, OpSharding, plan_sdy

from _exec_support import assert_close, engine, partitioner, spec, trace  # noqa: F401
from test_exec_training import _batches, _mlp, _shard_mlp, _train
from test_models import GPT, _megatron
from test_quiet_step import STEP

DEPRECATION = "GSPMD sharding propagation is going to be deprecated"


def _user(mesh: Mesh) -> tuple:
    return mesh.mesh_shape, mesh.axis_names, mesh.device_ids.tolist()


# -- the plan: HLO shardings on one named mesh ------------------------------------------------------------


def test_plan_keeps_the_users_axis_names_and_device_order():
    mesh = Mesh([3, 2, 1, 0, 7, 6, 5, 4], (2, 4), ("data", "model"))
    specs = [mesh.get_op_sharding(p) for p in [("data", None), (None, "model"), (("data", "model"), None),
                                               ("model", "data")]]
    plan = plan_sdy(specs + [OpSharding.replicated()], 8, [_user(mesh)])
    assert plan.mesh.text() == '<["data"=2, "model"=4] device_ids=[3, 2, 1, 0, 7, 6, 5, 4]>'
    assert [plan.sharding(s).dims for s in specs] == [
        (("data",), ()), ((), ("model",)), (("data", "model"), ()), (("model",), ("data",))]
    assert plan.sharding(OpSharding.replicated()).dim_axes(3) == ((), (), ())


def test_plan_without_a_user_mesh_derives_prime_axes_that_reproduce_every_tile_assignment():
    mesh = Mesh(range(8), (2, 4))
    specs = [mesh.get_op_sharding(p) for p in [(0, None), (None, 1), (1, 0)]]
    plan = plan_sdy(specs, 8)
    assert [size for _, size in plan.mesh.axes] == [2, 2, 2]
    names = [n for n, _ in plan.mesh.axes]
    ids = plan.mesh.device_ids or tuple(range(8))
    # Rebuild each tile assignment from the plan and compare (sorted within replication groups, as XLA lists them).
    grid = np.array(ids).reshape(2, 2, 2)
    for spec in specs:
        dims = plan.sharding(spec).dims
        used = [names.index(a) for d in dims for a in d]
        rest = [i for i in range(3) if i not in used]
        flat = grid.transpose(used + rest).reshape(-1, 2 ** len(rest))
        assert tuple(np.sort(flat, axis=1).reshape(-1)) == spec.devices


def test_plan_refuses_manual_and_maximal_shardings_with_the_reason():
    with pytest.raises(ShardingError, match="manual"):
        plan_sdy([OpSharding.manual()], 8)
    with pytest.raises(ShardingError, match="maximal"):
        plan_sdy([OpSharding.maximal(3)], 8)


# -- lowering and compiling a sharded step ------------------------------------------------------------------


def _sharded_step() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    x, w = torch.randn(16, 32), torch.randn(32, 64)
    y = (xs.mark_sharding(x.to("pjrt"), mesh, ("data", None)) @ xs.mark_sharding(w.to("pjrt"), mesh, (None, "model")))
    y = y.relu()
    xs.mark_sharding(y, mesh, ("data", None))  # a constraint on an intermediate; None: closed, replicated
    return (y * 2).sum(1).cpu(), ((x @ w).relu() * 2).sum(1)


def test_a_sharded_step_is_lowered_with_sdy_annotations_and_compiled_with_shardy(engine, partitioner):
    assert xs.get_partitioner() == "shardy"
    out, ref = _sharded_step()
    assert_close("sharded step", out, ref, rtol=1e-5, atol=1e-4)
    program = execution.last_program()
    text = program.lowered.text
    assert program.lowered.partitioner == "shardy"
    assert 'sdy.mesh @mesh = <["data"=2, "model"=4]>' in text
    assert 'sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>' in text
    assert 'sdy.sharding = #sdy.sharding<@mesh, [{}, {"model"}]>' in text
    assert 'sdy.sharding_constraint' in text and '<@mesh, [{"data"}, {}]>' in text
    assert "mhlo.sharding" not in text
    # What users read back stays in HLO sharding strings.
    assert all(str(s).startswith("{") for s in program.output_shardings)


def test_the_switch_forces_gspmd_and_both_give_the_same_results(engine, partitioner):
    shardy, ref = _sharded_step()
    partitioner("gspmd")
    gspmd, _ = _sharded_step()
    program = execution.last_program()
    assert program.lowered.partitioner == "gspmd" and "mhlo.sharding" in program.lowered.text
    assert "sdy." not in program.lowered.text
    assert torch.equal(shardy, gspmd)
    assert_close("gspmd step", gspmd, ref, rtol=1e-5, atol=1e-4)


def test_a_bad_switch_value_says_what_is_allowed(monkeypatch, partitioner):
    with pytest.raises(ValueError, match="shardy, gspmd"):
        partitioner("spmd")
    monkeypatch.setenv(execution.ENV_PARTITIONER, "sdy")
    with pytest.raises(ValueError, match="PJRT_PLUGINS_PARTITIONER"):
        execution.partitioner_mode()


def test_a_plugin_that_refuses_shardy_falls_back_to_gspmd_with_a_logged_reason(engine, partitioner, monkeypatch,
                                                                                caplog):
    # Test hook: a probe program the (real) plugin refuses, standing for a plugin without Shardy.
    monkeypatch.setattr(runtime_partitioner, "SHARDY_PROBE_PROGRAM", "module {{ sdy.no_such_op }} // {n} {length}")
    execution.reset_partitioner_probes()
    execution.clear_compile_cache()
    with caplog.at_level(logging.WARNING, logger="pjrt_plugins.spmd.execution"):
        assert xs.get_partitioner() == "gspmd"
        out, ref = _sharded_step()
    assert "compiles sharded programs with GSPMD: the plugin refused a Shardy program" in caplog.text
    assert execution.last_program().lowered.partitioner == "gspmd"
    assert_close("fallback step", out, ref, rtol=1e-5, atol=1e-4)


def test_a_sharded_step_in_a_fresh_process_prints_no_gspmd_deprecation_line():
    # The plugin's INFO/WARNING lines shown (they are hidden by default), so a deprecation line would appear.
    env = {k: v for k, v in os.environ.items() if k not in (LOG_LEVEL_ENV, *XLA_VARIABLES, *TPU_VARIABLES)}
    env[LOG_LEVEL_ENV] = "info"
    shardy = subprocess.run([sys.executable, "-c", STEP], env=env, capture_output=True, text=True, timeout=300)
    assert shardy.returncode == 0, shardy.stderr
    assert DEPRECATION not in shardy.stderr
    env[execution.ENV_PARTITIONER] = "gspmd"  # the same step on GSPMD does print it: the check can fail
    gspmd = subprocess.run([sys.executable, "-c", STEP], env=env, capture_output=True, text=True, timeout=300)
    assert gspmd.returncode == 0, gspmd.stderr
    assert DEPRECATION in gspmd.stderr
    assert shardy.stdout == gspmd.stdout


# -- the same training on both partitioners -----------------------------------------------------------------


def _on(name: str) -> None:
    xs.set_partitioner(name)
    execution.clear_compile_cache()


def _megatron_mlp_run(name: str) -> tuple[list, list, list]:
    _on(name)
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    model = _mlp().to("pjrt")
    _shard_mlp(model, mesh)
    losses = _train(model, _batches(2), device="pjrt", mesh=mesh, sync=True)
    assert execution.last_program().lowered.partitioner == name
    params = list(model.parameters())
    return [loss.cpu() for loss in losses], [p.cpu() for p in params], [p.sharding_spec for p in params]


def _gpt_adamw_run(name: str) -> tuple[list, list, list]:
    _on(name)
    torch.manual_seed(0)
    model = GPT(layers=1).to("pjrt")
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    _megatron(model, mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(2):
        idx, target = torch.randint(0, 64, (4, 8), generator=g), torch.randint(0, 64, (4, 8), generator=g)
        idx_d = xs.mark_sharding(idx.to("pjrt"), mesh, ("data", None))
        loss = F.cross_entropy(model(idx_d).flatten(0, 1), target.to("pjrt").flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        xs.sync()
        losses.append(loss.cpu())
    assert execution.last_program().lowered.partitioner == name
    params = list(model.parameters())
    return losses, [p.cpu() for p in params], [p.sharding_spec for p in params]


@pytest.mark.parametrize("run", [_megatron_mlp_run, _gpt_adamw_run], ids=["megatron_mlp_sgd", "gpt_adamw"])
def test_training_gives_the_same_results_and_shardings_with_shardy_and_gspmd(engine, partitioner, run):
    shardy, gspmd = run("shardy"), run("gspmd")
    for i, (a, b) in enumerate(zip(shardy[0], gspmd[0])):
        assert_close(f"loss {i}", a, b, rtol=1e-5, atol=1e-6)
    for i, (a, b) in enumerate(zip(shardy[1], gspmd[1])):
        assert_close(f"parameter {i}", a, b, rtol=1e-4, atol=1e-6)
    assert shardy[2] == gspmd[2]  # what users read back (sharding_spec) does not change


def test_attention_products_keep_batch_and_heads_as_batch_dims_so_shardy_gathers_nothing(engine, partitioner):
    # torch's matmul of (b, h, t, d) tensors is a bmm of (b*h, t, d) views: a merged dimension that no sharding of
    # batch on "data" and heads on "model" can describe, which cost all-gathers. One dot_general keeps both.
    torch.manual_seed(0)
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    q, k, v = (torch.randn(4, 8, 16, 8) for _ in range(3))
    qd, kd, vd = (xs.mark_sharding(t.to("pjrt"), mesh, ("data", "model", None, None)) for t in (q, k, v))
    out = ((qd @ kd.transpose(-2, -1)).softmax(-1) @ vd).cpu()
    assert_close("attention", out, (q @ k.transpose(-2, -1)).softmax(-1) @ v, rtol=1e-5, atol=1e-5)
    program = execution.last_program()
    assert program.lowered.partitioner == "shardy"
    assert "batching_dims = [0, 1] x [0, 1]" in program.lowered.text
    assert "32x16x8" not in program.lowered.text  # no merged (b*h) operand is left in the module
    hlo = program.executable.optimized_hlo_text()
    assert "all-gather" not in hlo and "all-to-all" not in hlo


# -- programs that keep GSPMD -----------------------------------------------------------------------------


def _lowered(fn, args, shardings, mark=None):
    gm = trace(fn, *args)
    for node, s in zip([n for n in gm.graph.nodes if n.op == "placeholder"], shardings):
        node.meta["sharding"] = s
    if mark is not None:
        node = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.mul.Tensor)
        node.meta["sharding"] = mark
    return lower_graph(gm.graph, LoweringOptions(num_partitions=8, partitioner="shardy"))


def test_lowering_for_shardy_without_a_user_mesh_and_with_a_marked_intermediate():
    lowered = _lowered(lambda x: (x * 2).sum(0), [torch.randn(8, 8)], [spec(0, None)], mark=spec(None, 1))
    assert lowered.partitioner == "shardy"
    assert lowered.text.count("sdy.mesh") == 1 and "sdy.sharding_constraint" in lowered.text
    assert lowered.input_shardings == [spec(0, None).to_hlo()]  # what the runtime reads stays in HLO form


@pytest.mark.parametrize("case", ["maximal", "uneven"])
def test_programs_shardy_cannot_express_keep_gspmd_with_the_reason_logged(case, caplog):
    x = torch.randn(8, 8) if case == "maximal" else torch.randn(6, 8)
    mark = OpSharding.maximal(0) if case == "maximal" else None
    with caplog.at_level(logging.INFO, logger="pjrt_plugins.spmd.lowering"):
        lowered = _lowered(lambda x: (x * 2).sum(0), [x], [spec(0, None) if case == "maximal" else spec(1, 0)],
                           mark=mark)
    assert lowered.partitioner == "gspmd"
    assert "mhlo.sharding" in lowered.text and "sdy." not in lowered.text
    assert "keeps GSPMD shardings" in caplog.text and ("maximal" if case == "maximal" else "unevenly") in caplog.text
