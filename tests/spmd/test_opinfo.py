"""torch's OpInfo samples on the pjrt device, compared with the CPU: a representative subset of the full sweep.

The cases run through ``scripts/opinfo_sweep.py`` (the same code as the full sweep) in one worker
process, so an op that kills its process fails its own test instead of the session. Each family of
ops is covered (elementwise, activations, reductions, norms, shapes, indexing, linear algebra,
nn layers, pooling, data-dependent shapes, random ops), with the cases where PyTorch/XLA 2.9 gives
wrong numbers or dies: avg_pool2d/3d, elu/celu/selu backward, norm.inf, norm.nuc, pixel_shuffle,
and torch.roll of an empty tensor.

Cases that fail today are strict expected failures that name the reason: when a fix lands they
pass, the strict xfail fails, and the mark must go. Likewise for cases that pass only through the
CPU fallback (``test_native``): a new lowering flips them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "opinfo_sweep.py"


def _load_sweep() -> Any:
    spec = importlib.util.spec_from_file_location("opinfo_sweep", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["opinfo_sweep"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


sweep = _load_sweep()

#: The subset, by family.
CASES = {
    "unary": ["abs", "exp", "log1p", "sigmoid", "tanh", "erf", "sqrt", "nn.functional.gelu", "nn.functional.silu",
              "nn.functional.softplus"],
    "special": ["digamma", "polygamma.polygamma_n_2"],
    "complex": ["complex", "polar"],
    "binary": ["add", "mul", "div.no_rounding_mode", "div.floor_rounding", "pow", "maximum", "atan2", "remainder",
               "where", "clamp", "lerp", "addcmul"],
    "activations": ["nn.functional.elu", "nn.functional.celu", "nn.functional.selu", "nn.functional.leaky_relu",
                    "nn.functional.hardtanh"],
    "reductions": ["sum", "mean", "amax", "prod", "var", "std", "logsumexp", "cumsum", "argmax", "softmax",
                   "log_softmax", "sort", "topk", "argsort"],
    "norms": ["norm", "norm.inf", "norm.nuc", "norm.fro", "linalg.vector_norm"],
    "shapes": ["reshape", "permute", "transpose", "cat", "stack", "split", "flip", "roll", "roll.empty",
               "roll.empty_2d", "diagonal", "tril", "expand", "squeeze", "unsqueeze", "narrow", "repeat",
               "nn.functional.pixel_shuffle", "nn.functional.pad.constant", "nn.functional.pad.replicate"],
    "indexing": ["index_select", "gather", "scatter_add", "index_add", "index_copy", "index_put", "take_along_dim",
                 "masked_fill", "nn.functional.embedding", "__getitem__", "_unsafe_masked_index",
                 "_unsafe_masked_index_put_accumulate", "nonzero_static"],
    "linalg": ["mm", "matmul", "bmm", "addmm", "einsum", "linalg.det", "linalg.inv"],
    "nn": ["nn.functional.linear", "nn.functional.layer_norm", "native_batch_norm", "nn.functional.cross_entropy",
           "nn.functional.mse_loss", "nn.functional.conv2d", "nn.functional.interpolate.bilinear"],
    "pooling": ["nn.functional.avg_pool2d", "nn.functional.avg_pool3d", "nn.functional.max_pool2d",
                "nn.functional.adaptive_avg_pool2d"],
    "data-dependent": ["nonzero", "masked_select", "unique"],
    "random": ["nn.functional.dropout", "bernoulli", "nn.functional.scaled_dot_product_attention"],
}
ALL_CASES = [key for keys in CASES.values() for key in keys]

#: (case, phase) -> why it does not pass yet. Strict: a fix makes the test fail until the entry goes.
KNOWN_FAILURES: dict[tuple[str, str], str] = {}
#: Cases whose passes need the CPU fallback today: a lowering is missing.
NEEDS_FALLBACK = {
    "norm.nuc": "linalg.svd",
    "complex": "complex dtypes (no lowering computes them)",
    "polar": "complex dtypes (no lowering computes them)",
}
#: Cases that go through the CPU fallback by design: their output shape depends on the data (index_put: its
#: boolean-mask sample).
FALLBACK_BY_DESIGN = {"nonzero", "masked_select", "unique", "index_put"}


def _marked(phase: str) -> list[Any]:
    params = []
    for key in ALL_CASES:
        reason = KNOWN_FAILURES.get((key, phase))
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(key, marks=marks, id=key))
    return params


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    """Every case, run once in worker processes (the harness's own abort case in the middle: a dead
    worker must be replaced and the cases after it still run)."""
    keys = ALL_CASES[: len(ALL_CASES) // 2] + ["harness.abort"] + ALL_CASES[len(ALL_CASES) // 2 :]
    return {r.op: r for r in sweep.run_cases(keys)}


def _explain(result: Any, phase: str) -> str:
    return f"{result.op} {phase}: {getattr(result, phase)} {getattr(result, phase + '_detail')}"


@pytest.mark.parametrize("key", _marked("forward"))
def test_forward_matches_cpu(results, key):
    result = results[key]
    assert result.forward in ("pass", "fallback"), _explain(result, "forward")


@pytest.mark.parametrize("key", _marked("backward"))
def test_backward_matches_cpu(results, key):
    result = results[key]
    assert result.backward in ("pass", "fallback", "n/a"), _explain(result, "backward")


def _native_params() -> list[Any]:
    params = []
    for key in ALL_CASES:
        failing = any((key, phase) in KNOWN_FAILURES for phase in ("forward", "backward"))
        if key in FALLBACK_BY_DESIGN or failing:
            continue
        marks = [pytest.mark.xfail(strict=True, reason=f"needs the CPU fallback: {NEEDS_FALLBACK[key]}")] if (
            key in NEEDS_FALLBACK) else []
        params.append(pytest.param(key, marks=marks, id=key))
    return params


@pytest.mark.parametrize("key", _native_params())
def test_native(results, key):
    """Passes without the CPU fallback, forward and backward."""
    result = results[key]
    assert result.forward == "pass" and result.backward in ("pass", "n/a"), (
        f"{key}: forward {result.forward}, backward {result.backward}, fallback ops {result.fallback_ops}")


@pytest.mark.parametrize("key", sorted(FALLBACK_BY_DESIGN))
def test_data_dependent_shapes_go_through_the_cpu_fallback(results, key):
    result = results[key]
    assert result.forward == "fallback", _explain(result, "forward")
    assert result.fallback_ops, "the fallback was not counted in xs.metrics()"


def test_every_family_has_a_case_that_passes_natively(results):
    for family, keys in CASES.items():
        if family in ("data-dependent", "random", "complex"):
            continue
        assert any(results[k].forward == "pass" for k in keys), family


def test_a_dead_worker_is_recorded_and_replaced(results):
    dead = results["harness.abort"]
    assert dead.forward == "death" and "SIGABRT" in dead.forward_detail, dead
    assert set(ALL_CASES) <= set(results), "cases after the death did not run"


def test_the_sweep_stops_when_workers_keep_dying():
    # Deaths in a row with no op finishing between them: something every op needs is broken (on a GPU
    # image with torch 2.11 every worker died on its op, and the sweep marked all 680 ops dead).
    with pytest.raises(sweep.SweepStopped, match=r"1 workers in a row died .*SIGABRT"):
        sweep.run_cases(["harness.abort", "roll"], deaths_in_a_row=1)
    results = sweep.run_cases(["harness.abort", "roll"], deaths_in_a_row=2)  # one death: the sweep goes on
    assert [r.forward for r in results] == ["death", "pass"]


def test_a_hung_op_is_killed_after_the_timeout():
    (hung,) = sweep.run_cases(["harness.hang"], timeout=5)
    assert hung.forward == "timeout" and "5 s" in hung.forward_detail, hung


def test_the_table_counts_passes_fallbacks_and_deaths():
    r = sweep.OpResult
    results = [r("a", "pass", "pass"), r("b", "fallback", "n/a"), r("c", "pass", "death"), r("d", "error", "error"),
               r("e", "skip"), r("roll.empty", "pass"), r("harness.abort", "death")]
    s = sweep.summarize(results)
    assert (s.forward_total, s.forward_pass, s.forward_fallback) == (4, 3, 1)
    assert (s.backward_total, s.backward_pass, s.backward_fallback, s.deaths) == (3, 1, 0, 1)
    assert "3 of 4 (75.0%), 1 through the CPU fallback" in sweep.table(results)


def test_a_later_result_file_replaces_an_earlier_ones_ops(tmp_path):
    """``--table all.json rerun.json``: a re-run op counts once, with its new result."""
    first, rerun = tmp_path / "all.json", tmp_path / "rerun.json"
    first.write_text(json.dumps({"results": [dataclasses.asdict(sweep.OpResult("a", "pass", "n/a")),
                                             dataclasses.asdict(sweep.OpResult("b", "error", "n/a"))]}))
    rerun.write_text(json.dumps({"results": [dataclasses.asdict(sweep.OpResult("b", "pass", "n/a"))]}))
    results = {r.op: r.forward for r in sweep._load([str(first), str(rerun)])}
    assert results == {"a": "pass", "b": "pass"}
