"""Models nobody here wrote, trained and evaluated on the CPU plugin's 8 devices against the same model in CPU eager.

Each architecture comes from transformers or timm as a user would take it, built from a tiny config with random
weights (no download). The copy on ``pjrt`` trains data-parallel (the batch sharded on an 8-device ``data`` axis,
plain SGD so both steps run one program) and must follow its CPU twin step by step: the losses, the weights after
the steps, then the logits in eval mode. Dropout is off in every config: the two sides draw different random masks.
Every model runs with the CPU fallback off (any operator without a lowering fails the test), Mixtral in both of its
experts paths: the default one (``aten._grouped_mm``, forward and backward) and ``batched_mm``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import timm
import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers

import pjrt_plugins.spmd as xs

VOCAB = 64
BATCH, SEQ = 8, 8
IMAGE = 16
CLASSES = 10
STEPS = 2
LR = 0.1

#: A decoder of one layer: 4 query heads sharing 2 key/value heads (grouped-query attention).
DECODER = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64)

Batch = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Case:
    build: Callable[[], nn.Module]
    batch: Callable[[torch.Generator], Batch]
    loss: Callable[[nn.Module, Batch], torch.Tensor]
    logits: Callable[[nn.Module, Batch], torch.Tensor]


def _tokens(g: torch.Generator) -> Batch:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return {"input_ids": ids, "labels": ids}


def _seq2seq(g: torch.Generator) -> Batch:
    return {"input_ids": torch.randint(1, VOCAB, (BATCH, SEQ), generator=g),
            "labels": torch.randint(1, VOCAB, (BATCH, SEQ), generator=g)}


def _pixels(g: torch.Generator, size: int = IMAGE) -> Batch:
    return {"pixel_values": torch.randn(BATCH, 3, size, size, generator=g),
            "labels": torch.randint(0, CLASSES, (BATCH,), generator=g)}


def _cnn_pixels(g: torch.Generator) -> Batch:
    """Images the CNNs can downsample five times (ResNet's stem and stages, ConvNeXt's stem and stages)."""
    return _pixels(g, 2 * IMAGE)


def _hf_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(**batch).loss


def _hf_logits(model: nn.Module, batch: Batch) -> torch.Tensor:
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    if "labels" in batch and isinstance(model, transformers.T5ForConditionalGeneration):
        inputs["decoder_input_ids"] = batch["labels"]
    return model(**inputs).logits


def _timm_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    return F.cross_entropy(model(batch["pixel_values"]), batch["labels"])


def _timm_logits(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(batch["pixel_values"])


def _causal_lm(config_class: type, **options: object) -> Case:
    return Case(lambda: transformers.AutoModelForCausalLM.from_config(config_class(**options)),
                _tokens, _hf_loss, _hf_logits)


def _mixtral(**options: object) -> Callable[[], nn.Module]:
    config = transformers.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **DECODER)
    return lambda: transformers.AutoModelForCausalLM.from_config(config, **options)


CASES = {
    "gpt2": _causal_lm(transformers.GPT2Config, vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=1, n_head=4,
                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "llama": _causal_lm(transformers.LlamaConfig, **DECODER),
    "mistral": _causal_lm(transformers.MistralConfig, **DECODER),
    "qwen3": _causal_lm(transformers.Qwen3Config, head_dim=8, **DECODER),
    "gemma": _causal_lm(transformers.GemmaConfig, head_dim=8, **DECODER),
    "phi3": _causal_lm(transformers.Phi3Config, pad_token_id=0, **DECODER),
    # transformers' default experts path (grouped_mm): aten._grouped_mm is lowered natively.
    "mixtral": Case(_mixtral(), _tokens, _hf_loss, _hf_logits),
    # Every expert's weights gathered per token: static shapes, lowered whole.
    "mixtral-batched_mm": Case(_mixtral(experts_implementation="batched_mm"), _tokens, _hf_loss, _hf_logits),
    "bert": Case(lambda: transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
        _tokens, _hf_loss, _hf_logits),
    "t5": Case(lambda: transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4, dropout_rate=0.0,
        decoder_start_token_id=0, pad_token_id=0)),
        _seq2seq, _hf_loss, _hf_logits),
    "vit": Case(lambda: transformers.ViTForImageClassification(transformers.ViTConfig(
        image_size=IMAGE, patch_size=4, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=64, num_labels=CLASSES)),
        _pixels, _hf_loss, _hf_logits),
    "timm-resnet18": Case(lambda: timm.create_model("resnet18", num_classes=CLASSES), _cnn_pixels, _timm_loss,
                          _timm_logits),
    # ConvNeXt's own blocks (depthwise 7x7 convolutions, LayerNorm over channels, layer scale), one per stage.
    "timm-convnext": Case(lambda: timm.create_model("convnext_atto", num_classes=CLASSES, depths=(1, 1, 1, 1),
                                                    dims=(8, 16, 32, 64)), _cnn_pixels, _timm_loss, _timm_logits),
}


def assert_close(name: str, got: torch.Tensor, want: torch.Tensor, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """Same shape and dtype, values within ``atol + rtol * |want|``, with the worst element in the message."""
    want = want.detach()
    assert got.shape == want.shape and got.dtype == want.dtype, (
        f"{name}: {got.dtype}{list(got.shape)} != CPU's {want.dtype}{list(want.shape)}")
    err = (got.double() - want.double()).abs()
    bound = atol + rtol * want.double().abs()
    if err.numel() and not bool((err <= bound).all()):
        worst = int((err - bound).argmax())
        raise AssertionError(f"{name}: max error {err.max().item():.3g} (CPU {want.flatten()[worst].item():.6g}, "
                             f"pjrt {got.flatten()[worst].item():.6g}) exceeds rtol={rtol} atol={atol}")


def _llama_reference(train: bool) -> tuple[nn.Module, xs.Mesh]:
    """The Llama case on the CPU (seeded: every side copies it) and the 8-device data mesh; the CPU fallback off, so
    an operator without a lowering fails the test."""
    xs.set_cpu_fallback(False)
    torch.manual_seed(0)
    return CASES["llama"].build().train(train), xs.Mesh(range(8), (8,), ("data",))


def _shard_batch(batch: Batch, mesh: xs.Mesh) -> Batch:
    """The batch on pjrt, split along its first dimension over the mesh's ``data`` axis."""
    return {k: xs.mark_sharding(v.to("pjrt"), mesh, ("data",) + (None,) * (v.dim() - 1)) for k, v in batch.items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_trains_data_parallel_and_evaluates_like_cpu_eager(cpu8, name):
    case = CASES[name]
    xs.set_cpu_fallback(False)  # an operator without a lowering fails the test
    torch.manual_seed(0)
    ref = case.build().train()
    model = copy.deepcopy(ref).to("pjrt")
    mesh = xs.Mesh(range(8), (8,), ("data",))
    opt_ref = torch.optim.SGD(ref.parameters(), lr=LR)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    g = torch.Generator().manual_seed(1)
    for step in range(STEPS):
        batch = case.batch(g)
        loss_ref = case.loss(ref, batch)
        loss_ref.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        loss = case.loss(model, _shard_batch(batch, mesh))
        loss.backward()
        opt.step()
        opt.zero_grad()
        xs.sync()
        assert_close(f"{name}: loss at step {step}", loss.detach().cpu(), loss_ref)
    for (key, got), want in zip(model.state_dict().items(), ref.state_dict().values()):
        assert_close(f"{name}: {key} after {STEPS} steps", got.cpu(), want)

    ref.eval()
    model.eval()
    batch = case.batch(g)
    with torch.no_grad():
        logits_ref = case.logits(ref, batch)
        logits = case.logits(model, _shard_batch(batch, mesh))
    assert_close(f"{name}: eval logits", logits.cpu(), logits_ref)
    assert xs.metrics().fallbacks == 0


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_trains_under_torch_compile_with_its_kv_cache_like_cpu_eager(cpu8, name):
    """``torch.compile(backend="pjrt")`` on a transformers model in its default config: the forward builds a KV
    cache from ``torch.tensor([], device=...)`` even in training; forward and backward are one recorded op each."""
    xs.set_cpu_fallback(False)
    torch.manual_seed(0)
    ref = CASES[name].build().train()
    assert ref.config.use_cache, "the default config builds a KV cache"
    model = copy.deepcopy(ref).to("pjrt")
    forward = torch.compile(model, backend="pjrt")
    mesh = xs.Mesh(range(8), (8,), ("data",))
    opt_ref = torch.optim.SGD(ref.parameters(), lr=LR)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    g = torch.Generator().manual_seed(1)
    recorded = []
    for step in range(STEPS):
        batch = _tokens(g)
        loss_ref = ref(**batch).loss
        loss_ref.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        before = xs.metrics().ops_recorded
        loss = forward(**_shard_batch(batch, mesh)).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        xs.sync()
        recorded.append(xs.metrics().ops_recorded - before)
        assert_close(f"loss at step {step}", loss.detach().cpu(), loss_ref)
    for (key, got), want in zip(model.state_dict().items(), ref.state_dict().values()):
        assert_close(f"{key} after {STEPS} steps", got.cpu(), want)
    assert xs.metrics().fallbacks == 0
    # The eager step records every ATen operator (about 600 for Llama); compiled, the forward and the backward are
    # one region op each, and the optimizer's operators are eager as before.
    assert recorded[-1] < 100, f"ops recorded per compiled step: {recorded}"


def _cache(kind: str, model: nn.Module) -> transformers.Cache:
    if kind == "static":
        return transformers.StaticCache(config=model.config, max_cache_len=SEQ + 4)
    return transformers.DynamicCache(config=model.config)


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_llama_decodes_with_a_kv_cache_under_torch_compile_like_cpu_eager(cpu8, kind):
    """A prefill then decode steps of one token through the compiled model, the cache passed in and updated: the
    dynamic cache grows by ``cat``, the static one is written in place (zeros made on the first call, then
    ``index_copy_``). A static cache's decode steps, once warm, run one program."""
    ref, mesh = _llama_reference(train=False)
    model = copy.deepcopy(ref).to("pjrt")
    forward = torch.compile(model, backend="pjrt")
    cache_ref, cache = _cache(kind, ref), _cache(kind, model)
    ids = _tokens(torch.Generator().manual_seed(1))["input_ids"]
    compiles = []
    with torch.no_grad():
        for step in range(5):
            want = ref(input_ids=ids, cache=cache_ref, use_cache=True)
            before = xs.metrics().compiles
            got = forward(**_shard_batch({"input_ids": ids}, mesh), cache=cache, use_cache=True)
            assert_close(f"{kind} cache: logits at step {step}", got.logits.cpu(), want.logits)
            compiles.append(xs.metrics().compiles - before)
            ids = want.logits[:, -1:].argmax(-1)
        for layer, layer_ref in zip(cache.layers, cache_ref.layers):
            assert_close(f"{kind} cache: keys", layer.keys.cpu(), layer_ref.keys)
            assert_close(f"{kind} cache: values", layer.values.cpu(), layer_ref.values)
    assert xs.metrics().fallbacks == 0
    if kind == "static":  # the first decode steps compile (the counter's update waits for the next step), then none
        assert compiles[3:] == [0, 0], f"compiles per step: {compiles}"


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_llama_generates_the_cpu_tokens_without_a_program_per_token(cpu8, padded):
    """Greedy ``generate`` with a static cache on a batch sharded over 8 devices: the tokens of CPU eager, two
    programs on the first call (prefill and decode), and once warm, an answer of any length compiles nothing (the
    decode step is one program; the final ``input_ids`` is put together on the host; the last call's leftover
    ``cat`` is dropped, not run). A padded prompt's attention mask, one column longer every token, is padded to
    the cache's length on the host: the decode step reads it with one shape."""
    ref, mesh = _llama_reference(train=False)
    model = copy.deepcopy(ref).to("pjrt")
    prompt = torch.randint(1, VOCAB, (BATCH, 5), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": prompt}
    if padded:  # half the prompts start with two pad tokens (pad_token_id 0)
        batch["attention_mask"] = torch.ones_like(prompt)
        batch["attention_mask"][: BATCH // 2, :2] = 0
        batch["input_ids"] = prompt * batch["attention_mask"]
    compiles = {}
    for new_tokens in (4, 8, 16):
        options = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        want = ref.generate(**batch, **options)
        before = xs.metrics().compiles
        cache = transformers.StaticCache(config=model.config, max_cache_len=32)
        got = model.generate(**_shard_batch(batch, mesh), cache=cache, **options)
        assert torch.equal(got.cpu(), want), f"{new_tokens} new tokens"
        compiles[new_tokens] = xs.metrics().compiles - before
    assert xs.metrics().fallbacks == 0
    # The first call: the prefill and the decode step (transformers' checks on the prompt and its special tokens
    # are computed on the host; the first decode step runs the later steps' program). Later calls: none.
    assert compiles == {4: 2, 8: 0, 16: 0}, f"programs compiled per generate call: {compiles}"


def test_llama_trains_with_a_compiled_adamw_step_like_cpu_eager(cpu8):
    """``torch.compile(opt.step, backend="pjrt")`` (torch's recipe for compiling an optimizer step) next to the compiled
    model, with ``capturable=True`` so that AdamW keeps its step counters on the device: the update is then one region
    in the step's one program. The AdamW state is made on the first call; the losses, weights and moments follow CPU
    eager's AdamW, the step stops compiling after the first steps, uploads nothing but the batch (the eager
    update uploads its changing scalars every step), and the parameters and optimizer state are donated to the
    step's program."""
    ref, mesh = _llama_reference(train=True)
    model = copy.deepcopy(ref).to("pjrt")
    forward = torch.compile(model, backend="pjrt")
    options = dict(lr=1e-2, weight_decay=0.01)
    opt_ref = torch.optim.AdamW(ref.parameters(), **options)
    opt = torch.optim.AdamW(model.parameters(), capturable=True, **options)
    step_opt = torch.compile(opt.step, backend="pjrt")
    g = torch.Generator().manual_seed(1)
    compiles, donated, programs, uploaded = [], [], [], []
    for step in range(4):
        batch = _tokens(g)
        loss_ref = ref(**batch).loss
        loss_ref.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        before = xs.metrics()
        loss = forward(**_shard_batch(batch, mesh)).loss
        loss.backward()
        step_opt()
        opt.zero_grad()
        xs.sync()
        after = xs.metrics()
        compiles.append(after.compiles - before.compiles)
        donated.append(after.donated_buffers - before.donated_buffers)
        programs.append(after.executions - before.executions)
        # the batch, and nothing of the optimizer's
        uploaded.append(after.bytes_uploaded - before.bytes_uploaded - sum(v.nbytes for v in batch.values()))
        assert_close(f"loss at step {step}", loss.detach().cpu(), loss_ref)
    for (key, got), want in zip(model.state_dict().items(), ref.state_dict().values()):
        assert_close(f"{key} after 4 steps", got.cpu(), want)
    for p, p_ref in zip(model.parameters(), ref.parameters()):
        for k in ("exp_avg", "exp_avg_sq"):
            assert_close(f"AdamW {k}", opt.state[p][k].cpu(), opt_ref.state[p_ref][k])
        assert float(opt.state[p]["step"]) == float(opt_ref.state[p_ref]["step"]) == 4.0
    assert xs.metrics().fallbacks == 0
    assert compiles[2:] == [0, 0], f"programs compiled per step: {compiles}"
    assert donated[-1] > 0, f"buffers donated per step: {donated}"
    assert programs[2:] == [1, 1], f"programs run per step: {programs}"
    assert uploaded[2:] == [0, 0], f"bytes uploaded per step: {uploaded}"


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_llama_replays_a_captured_training_step_like_the_traced_one(cpu8, compiled):
    """``xs.capture_step`` around a whole Llama step (forward, backward, AdamW with ``capturable=True``, zero_grad):
    once two calls agree, later calls replay the recorded program without tracing. The replayed loop gives the
    traced loop's losses and weights on new batches (within float rounding: which values are still alive at the
    traced loop's sync, garbage the collector has not reached yet included, decides its program's outputs, and a
    program with other outputs may fuse and round differently; tests/spmd/test_capture_step.py checks bit equality
    on a small model), and follows CPU eager."""
    ref, mesh = _llama_reference(train=True)
    options = dict(lr=1e-2, weight_decay=0.01)

    def make_step():
        model = copy.deepcopy(ref).to("pjrt")
        forward = torch.compile(model, backend="pjrt") if compiled else model
        opt = torch.optim.AdamW(model.parameters(), capturable=True, **options)

        def step(batch: Batch) -> torch.Tensor:
            loss = forward(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()

        return model, step

    traced_model, traced_step = make_step()
    model, step = make_step()
    captured = xs.capture_step(step)
    opt_ref = torch.optim.AdamW(ref.parameters(), **options)
    g = torch.Generator().manual_seed(1)
    ops = []
    for i in range(5):
        batch = _tokens(g)
        traced_loss = traced_step(_shard_batch(batch, mesh))
        xs.sync()
        before = xs.metrics().ops_recorded
        loss = captured(_shard_batch(batch, mesh))
        ops.append(xs.metrics().ops_recorded - before)
        assert_close(f"loss against the traced loop at step {i}", loss.cpu(), traced_loss.cpu(), rtol=1e-5, atol=1e-6)
        loss_ref = ref(**batch).loss
        loss_ref.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        assert_close(f"loss at step {i}", loss.cpu(), loss_ref.detach())
    assert captured.replays == 2 and ops[3:] == [0, 0], f"ops traced per call: {ops}"
    for (key, got), want in zip(model.state_dict().items(), traced_model.state_dict().values()):
        assert_close(f"{key} against the traced loop", got.cpu(), want.cpu(), rtol=1e-5, atol=1e-6)
    assert xs.metrics().fallbacks == 0
