"""Mixtral from transformers with data-dependent routing on the CPU plugin's 8 devices: the bounded-shape experts
paths stop compiling after the first training steps and match CPU eager; the ``eager`` path (``nonzero`` in a
loop over the experts) still trains, and warns once that it compiles anew.

``capacity_experts()`` gives every expert room for all tokens: no choice is dropped and the model must follow
transformers' own ``eager`` path on the CPU. With a capacity factor below that, choices are dropped, and the
model must follow the same function on the CPU (same drops), not the dropless one.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import transformers
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

import pjrt_plugins.spmd as xs
from pjrt_plugins.errors import CpuFallbackWarning
from pjrt_plugins.spmd import moe
from pjrt_plugins.spmd.frontend import _fallback

from test_hf_models import DECODER, VOCAB, assert_close

BATCH, SEQ, LR = 8, 8, 0.1


@pytest.fixture
def capacity_paths():
    """Two capacity functions in transformers' experts interface (this instance only, removed afterwards)."""
    names = {"test_capacity": moe.capacity_experts(), "test_capacity_half": moe.capacity_experts(0.5)}
    for name, fn in names.items():
        ALL_EXPERTS_FUNCTIONS[name] = fn
    yield
    for name in names:
        del ALL_EXPERTS_FUNCTIONS[name]


def _mixtral(implementation: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **DECODER)
    return transformers.AutoModelForCausalLM.from_config(config, experts_implementation=implementation).train()


def _train(model: torch.nn.Module, steps: int, mesh: xs.Mesh | None) -> tuple[list[torch.Tensor], list[int]]:
    """Losses and programs compiled per step, on new random batches (the routing changes every step)."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    g = torch.Generator().manual_seed(1)
    losses, compiles = [], []
    for _ in range(steps):
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        if mesh is not None:
            ids = xs.mark_sharding(ids.to("pjrt"), mesh, ("data", None))
        before = xs.metrics().compiles
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().cpu())
        compiles.append(xs.metrics().compiles - before)
    return losses, compiles


@pytest.mark.parametrize("path, cpu_path", [("test_capacity", "eager"), ("test_capacity_half", "test_capacity_half"),
                                            ("grouped_mm", "eager"), ("batched_mm", "eager")])
def test_a_bounded_path_stops_compiling_and_follows_cpu_eager(cpu8, capacity_paths, path, cpu_path):
    xs.set_cpu_fallback(False)
    ref = _mixtral(cpu_path)
    model = _mixtral(path).to("pjrt")  # the same seed: the same weights
    assert model.config._experts_implementation == path
    mesh = xs.Mesh(range(8), (8,), ("data",))
    losses, compiles = _train(model, 5, mesh)
    want, _ = _train(ref, 5, None)
    for step, (got, expected) in enumerate(zip(losses, want)):
        assert_close(f"{path}: loss at step {step}", got, expected)
    assert compiles[2:] == [0, 0, 0], f"{path}: programs compiled per step {compiles}"
    for (key, got), expected in zip(model.state_dict().items(), ref.state_dict().values()):
        assert_close(f"{path}: {key} after 5 steps", got.cpu(), expected)
    assert xs.metrics().fallbacks == 0


def test_a_capacity_below_the_tokens_drops_choices(cpu8, capacity_paths):
    """The factor-0.5 model differs from the dropless one on the CPU: choices were dropped (so the test above compared
    the dropping algorithm, not a capacity that happened to hold every choice)."""
    dropless, half = _mixtral("test_capacity"), _mixtral("test_capacity_half")
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = dropless(input_ids=ids).logits, half(input_ids=ids).logits
    assert not torch.allclose(a, b, rtol=1e-3, atol=1e-4)


def test_the_eager_path_warns_once_that_it_compiles_anew_and_still_matches(cpu8):
    """nonzero in a Python loop: it runs through the CPU fallback and makes new programs in later steps too."""
    _fallback._warned.clear()
    ref = _mixtral("eager")
    model = copy.deepcopy(ref).to("pjrt")
    mesh = xs.Mesh(range(8), (8,), ("data",))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses, compiles = _train(model, 3, mesh)
    want, _ = _train(ref, 3, None)
    for step, (got, expected) in enumerate(zip(losses, want)):
        assert_close(f"eager: loss at step {step}", got, expected)
    hints = [str(w.message) for w in caught if issubclass(w.category, CpuFallbackWarning)
             and "aten.nonzero.default" in str(w.message)]
    assert len(hints) == 1 and "capacity_experts" in hints[0], hints
    assert xs.metrics().fallback_ops.get("aten.nonzero.default", 0) > 0
    assert compiles[2] > 0, f"the eager path compiled nothing in its third step ({compiles}): update the docs"


#: Other MoE models of transformers: a shared expert beside the routed ones (Qwen2-MoE), Mixtral's layout in other
#: models (OLMoE, Qwen3-MoE), and transposed weights with biases and a gate of its own (gpt-oss).
OTHER_MOES = {
    "qwen2_moe": (transformers.Qwen2MoeConfig, dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                                    shared_expert_intermediate_size=32)),
    "olmoe": (transformers.OlmoeConfig, dict(num_experts=4, num_experts_per_tok=2, eos_token_id=None)),
    "qwen3_moe": (transformers.Qwen3MoeConfig, dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                                    head_dim=8)),
    "gpt_oss": (transformers.GptOssConfig, dict(num_local_experts=4, num_experts_per_tok=2, head_dim=8,
                                                layer_types=["full_attention"])),
}


@pytest.mark.parametrize("name", sorted(OTHER_MOES))
def test_without_drops_capacity_experts_is_the_eager_path_for_other_experts_layouts(capacity_paths, name):
    """On the CPU (plain torch): loss and every gradient as transformers' eager path gives them."""
    config_class, options = OTHER_MOES[name]
    config = config_class(**{**DECODER, **options})
    models = []
    for implementation in ("eager", "test_capacity"):
        torch.manual_seed(0)
        models.append(transformers.AutoModelForCausalLM.from_config(config, experts_implementation=implementation))
    ids = torch.randint(0, VOCAB, (4, SEQ), generator=torch.Generator().manual_seed(2))
    eager, capacity = (m(input_ids=ids, labels=ids).loss for m in models)
    eager.backward()
    capacity.backward()
    assert_close(f"{name}: loss", capacity, eager)
    for (key, p), q in zip(models[0].named_parameters(), models[1].parameters()):
        if p.grad is not None:
            assert_close(f"{name}: gradient of {key}", q.grad, p.grad)


def test_under_torch_compile_the_capacity_path_is_one_graph_and_stops_compiling(cpu8, capacity_paths):
    """Dynamo traces into capacity_experts as into the CPU model's code: no graph break, and the same losses."""
    xs.set_cpu_fallback(False)
    ref = _mixtral("test_capacity_half")
    model = torch.compile(_mixtral("test_capacity_half").to("pjrt"), backend="pjrt")
    torch._dynamo.utils.counters.clear()
    losses, compiles = _train(model, 4, xs.Mesh(range(8), (8,), ("data",)))
    want, _ = _train(ref, 4, None)
    for step, (got, expected) in enumerate(zip(losses, want)):
        assert_close(f"compiled: loss at step {step}", got, expected)
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    assert compiles[2:] == [0, 0], compiles
