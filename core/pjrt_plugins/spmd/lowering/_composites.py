"""Decompositions torch does not ship, written with ATen ops the lowering has: the fused fast paths of
``TransformerEncoderLayer`` / ``MultiheadAttention`` in eval mode, and ``embedding_bag`` with its backward;
and batch norm in eval mode, whose torch decomposition follows CUDA rather than the CPU.

They are consulted like torch's own decompositions (``decomposition_for``) and follow the CPU
kernels' semantics, including their quirks (a float attention mask counts as a boolean one,
a fully masked softmax row is zero).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch._decomp.decompositions as torch_decompositions
import torch.nn.functional as F

from ...errors import UnsupportedOpError
from ._table import caller_site, meta_rule, register_unique

aten = torch.ops.aten

#: op -> decomposition (a function of the op's arguments).
COMPOSITES: dict[Any, Callable[..., Any]] = {}


def _composite(*ops: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as the decomposition of ``ops`` (a second one for an op raises)."""
    site = caller_site(1)

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        register_unique(COMPOSITES, ops, fn, site, what="decomposition")
        return fn

    return register


# -- batch norm ------------------------------------------------------------------------------------


def _eval_statistics(x: torch.Tensor, training: bool, result: tuple) -> tuple:
    """The CPU kernels save no statistics in eval mode (empty tensors); torch's decomposition, like CUDA,
    returns the running mean there."""
    if training:
        return result
    return result[0], x.new_zeros((0,)), x.new_zeros((0,))


@meta_rule(aten.native_batch_norm.default)
@_composite(aten.native_batch_norm.default)
def native_batch_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                      running_mean: torch.Tensor | None, running_var: torch.Tensor | None, training: bool,
                      momentum: float, eps: float) -> tuple:
    result = torch_decompositions.native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum,
                                                    eps)
    return _eval_statistics(x, training, result)


@meta_rule(aten._native_batch_norm_legit.default)
@_composite(aten._native_batch_norm_legit.default)
def native_batch_norm_legit(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                            running_mean: torch.Tensor, running_var: torch.Tensor, training: bool, momentum: float,
                            eps: float) -> tuple:
    result = torch_decompositions._native_batch_norm_legit(x, weight, bias, running_mean, running_var, training,
                                                           momentum, eps)
    return _eval_statistics(x, training, result)


@meta_rule(aten._native_batch_norm_legit_no_training.default)
@_composite(aten._native_batch_norm_legit_no_training.default)
def native_batch_norm_legit_no_training(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                                        running_mean: torch.Tensor, running_var: torch.Tensor, momentum: float,
                                        eps: float) -> tuple:
    result = torch_decompositions._native_batch_norm_legit_no_training(x, weight, bias, running_mean, running_var,
                                                                      momentum, eps)
    return _eval_statistics(x, False, result)


# -- attention ------------------------------------------------------------------------------------


def _masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None, mask_type: int | None) -> torch.Tensor:
    """softmax over the last dim of [B, H, L, S] ``scores`` where ``mask`` is true; rows masked entirely give 0."""
    if mask is None:
        return torch.softmax(scores, -1)
    mask = mask.to(torch.bool)  # torch's kernel reads a float mask as a boolean one
    batch, _, length, keys = scores.shape
    if mask_type == 1 or (mask.dim() == 2 and tuple(mask.shape) == (batch, keys) and mask_type != 0):
        mask = mask.view(batch, 1, 1, keys)
    elif mask.dim() == 2:
        mask = mask.view(1, 1, length, keys)
    masked = scores.masked_fill(mask, float("-inf"))
    top = masked.amax(-1, keepdim=True)
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    e = torch.exp(masked - top)
    total = e.sum(-1, keepdim=True)
    return torch.where(total == 0, torch.zeros_like(e), e / torch.where(total == 0, torch.ones_like(total), total))


@_composite(aten._native_multi_head_attention.default)
def native_multi_head_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, embed_dim: int,
                                num_head: int, qkv_weight: torch.Tensor, qkv_bias: torch.Tensor,
                                proj_weight: torch.Tensor, proj_bias: torch.Tensor, mask: torch.Tensor | None = None,
                                need_weights: bool = True, average_attn_weights: bool = True,
                                mask_type: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """MultiheadAttention's fused eval path: batch-first [B, L, E] inputs, one packed qkv projection."""
    wq, wk, wv = qkv_weight.chunk(3)
    bq, bk, bv = qkv_bias.chunk(3)
    batch, length, _ = query.shape
    head_dim = embed_dim // num_head

    def heads(x: torch.Tensor) -> torch.Tensor:
        return x.view(batch, x.shape[1], num_head, head_dim).transpose(1, 2)

    q = heads(F.linear(query, wq, bq)) / math.sqrt(head_dim)
    k, v = heads(F.linear(key, wk, bk)), heads(F.linear(value, wv, bv))
    weights = _masked_softmax(q @ k.transpose(-2, -1), mask, mask_type)
    attended = (weights @ v).transpose(1, 2).reshape(batch, length, embed_dim)
    out = F.linear(attended, proj_weight, proj_bias)
    if not need_weights:
        return out, None
    return out, weights.mean(1) if average_attn_weights else weights


@_composite(aten._transformer_encoder_layer_fwd.default)
def transformer_encoder_layer_fwd(src: torch.Tensor, embed_dim: int, num_heads: int, qkv_weight: torch.Tensor,
                                  qkv_bias: torch.Tensor, proj_weight: torch.Tensor, proj_bias: torch.Tensor,
                                  use_gelu: bool, norm_first: bool, eps: float, norm_weight_1: torch.Tensor,
                                  norm_bias_1: torch.Tensor, norm_weight_2: torch.Tensor, norm_bias_2: torch.Tensor,
                                  ffn_weight_1: torch.Tensor, ffn_bias_1: torch.Tensor, ffn_weight_2: torch.Tensor,
                                  ffn_bias_2: torch.Tensor, mask: torch.Tensor | None = None,
                                  mask_type: int | None = None) -> torch.Tensor:
    """TransformerEncoderLayer's eval fast path: the same math as its Python forward, without dropout."""
    if src.is_nested:
        raise UnsupportedOpError("aten._transformer_encoder_layer_fwd.default",
                                 "nested tensors are not supported on the pjrt device")

    def norm1(x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (embed_dim,), norm_weight_1, norm_bias_1, eps)

    def norm2(x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (embed_dim,), norm_weight_2, norm_bias_2, eps)

    def attention(x: torch.Tensor) -> torch.Tensor:
        return native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                                           proj_bias, mask, False, True, mask_type)[0]

    def feed_forward(x: torch.Tensor) -> torch.Tensor:
        hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
        return F.linear(F.gelu(hidden) if use_gelu else F.relu(hidden), ffn_weight_2, ffn_bias_2)

    if norm_first:
        x = src + attention(norm1(src))
        return x + feed_forward(norm2(x))
    x = norm1(src + attention(src))
    return norm2(x + feed_forward(x))


# -- embedding_bag ----------------------------------------------------------------------------------

_SUM, _MEAN, _MAX = 0, 1, 2


def _bags(indices: torch.Tensor, offsets: torch.Tensor, include_last_offset: bool,
          padding_idx: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(bag of each index, whether the index counts, number of bags)."""
    bags = offsets.numel() - (1 if include_last_offset else 0)
    position = torch.arange(indices.numel(), device=indices.device)
    starts = offsets[:bags]
    offset2bag = (starts.unsqueeze(0) <= position.unsqueeze(1)).sum(1) - 1
    counts = indices != padding_idx if padding_idx >= 0 else torch.ones_like(indices, dtype=torch.bool)
    if include_last_offset:
        counts = counts & (position < offsets[bags])
    return offset2bag.clamp(min=0), counts & (offset2bag >= 0), bags


@_composite(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def embedding_bag(weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, scale_grad_by_freq: bool = False,
                  mode: int = 0, sparse: bool = False, per_sample_weights: torch.Tensor | None = None,
                  include_last_offset: bool = False, padding_idx: int = -1) -> tuple[torch.Tensor, ...]:
    """(output [B, D], offset2bag [N], bag_size [B], max_indices: [B, D] for max, else [0]), as the CPU's."""
    if sparse:
        raise UnsupportedOpError("aten._embedding_bag.default", "embedding_bag(sparse=True) gives sparse gradients, "
                                 "which the pjrt device does not support")
    offset2bag, counts, bags = _bags(indices, offsets, include_last_offset, padding_idx)
    dim = weight.shape[1]
    rows = weight.index_select(0, indices)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.unsqueeze(1)
    bag_size = torch.zeros(bags, dtype=torch.int64, device=weight.device).index_add(0, offset2bag, counts.long())
    if mode == _MAX:
        masked = rows.masked_fill(~counts.unsqueeze(1), float("-inf"))
        index = offset2bag.unsqueeze(1).expand(-1, dim)
        out = torch.full((bags, dim), float("-inf"), dtype=weight.dtype, device=weight.device)
        out = out.scatter_reduce(0, index, masked, "amax")
        is_max = (masked == out.index_select(0, offset2bag)) & counts.unsqueeze(1)
        large = torch.iinfo(torch.int64).max
        candidates = torch.where(is_max, indices.unsqueeze(1).expand(-1, dim), large)
        max_indices = torch.full((bags, dim), large, dtype=torch.int64, device=weight.device)
        max_indices = max_indices.scatter_reduce(0, index, candidates, "amin")
        empty = (bag_size == 0).unsqueeze(1)
        out = out.masked_fill(empty, 0.0)
        max_indices = max_indices.masked_fill(empty, 0)
        return out, offset2bag, bag_size, max_indices
    contrib = rows * counts.unsqueeze(1).to(rows.dtype)
    out = torch.zeros((bags, dim), dtype=weight.dtype, device=weight.device).index_add(0, offset2bag, contrib)
    if mode == _MEAN:
        out = out / bag_size.clamp(min=1).unsqueeze(1).to(out.dtype)
    return out, offset2bag, bag_size, torch.zeros(0, dtype=torch.int64, device=weight.device)


@_composite(aten._embedding_bag_backward.default, aten._embedding_bag_dense_backward.default)
def embedding_bag_backward(grad: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, offset2bag: torch.Tensor,
                           bag_size: torch.Tensor, maximum_indices: torch.Tensor, num_weights: int,
                           scale_grad_by_freq: bool, mode: int, *rest: Any, **kwargs: Any) -> torch.Tensor:
    """The weight's gradient: each index receives its bag's gradient (scaled as the forward combined it)."""
    # _embedding_bag_backward(..., sparse, per_sample_weights, padding_idx); the dense one has no ``sparse``.
    if rest and isinstance(rest[0], bool):
        if rest[0]:
            raise UnsupportedOpError("aten._embedding_bag_backward.default", "sparse embedding_bag gradients are not "
                                     "supported on the pjrt device")
        rest = rest[1:]
    per_sample_weights = rest[0] if rest else kwargs.get("per_sample_weights")
    padding_idx = rest[1] if len(rest) > 1 else kwargs.get("padding_idx", -1)
    include_last_offset = offsets.numel() == grad.shape[0] + 1
    bag_of, counts, _ = _bags(indices, offsets, include_last_offset, padding_idx)
    dim = grad.shape[1]
    if mode == _MAX:  # an empty bag's output is a constant 0: no row gets its gradient
        valid = (bag_size > 0).unsqueeze(1) & (maximum_indices != padding_idx)
        grad_weight = torch.zeros((num_weights, dim), dtype=grad.dtype, device=grad.device)
        return grad_weight.scatter_add(0, maximum_indices, grad * valid.to(grad.dtype))
    contrib = grad.index_select(0, bag_of) * counts.unsqueeze(1).to(grad.dtype)
    if mode == _MEAN:
        sizes = torch.zeros(grad.shape[0], dtype=torch.int64, device=grad.device).index_add(0, bag_of, counts.long())
        contrib = contrib / sizes.clamp(min=1).index_select(0, bag_of).unsqueeze(1).to(grad.dtype)
    if per_sample_weights is not None:
        contrib = contrib * per_sample_weights.unsqueeze(1)
    if scale_grad_by_freq:
        freq = torch.zeros(num_weights, dtype=torch.int64, device=grad.device).index_add(0, indices, counts.long())
        contrib = contrib / freq.clamp(min=1).index_select(0, indices).unsqueeze(1).to(grad.dtype)
    return torch.zeros((num_weights, dim), dtype=grad.dtype, device=grad.device).index_add(0, indices, contrib)


@_composite(aten._embedding_bag_per_sample_weights_backward.default)
def embedding_bag_per_sample_weights_backward(grad: torch.Tensor, weight: torch.Tensor, indices: torch.Tensor,
                                              offsets: torch.Tensor, offset2bag: torch.Tensor, mode: int,
                                              padding_idx: int = -1) -> torch.Tensor:
    include_last_offset = offsets.numel() == grad.shape[0] + 1
    bag_of, counts, _ = _bags(indices, offsets, include_last_offset, padding_idx)
    per_index = (grad.index_select(0, bag_of) * weight.index_select(0, indices)).sum(1)
    return per_index * counts.to(per_index.dtype)


# -- products, distances, searches, histograms -----------------------------------------------------


@_composite(aten._trilinear.default)
def trilinear(i1: torch.Tensor, i2: torch.Tensor, i3: torch.Tensor, expand1: Any, expand2: Any, expand3: Any,
              sumdim: Any, unroll_dim: int = 1) -> torch.Tensor:
    """Each input unsqueezed at its ``expand`` dims, multiplied, summed over ``sumdim`` (F.bilinear's kernel)."""
    def expanded(t: torch.Tensor, dims: Any) -> torch.Tensor:
        for d in sorted(dims):
            t = t.unsqueeze(d)
        return t

    product = expanded(i1, expand1) * expanded(i2, expand2) * expanded(i3, expand3)
    return product.sum(list(sumdim)) if len(sumdim) else product


def _pairwise_difference(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """[..., P, R, M]: x1[..., p, :] - x2[..., r, :]."""
    return x1.unsqueeze(-2) - x2.unsqueeze(-3)


@_composite(aten._cdist_forward.default)
def cdist_forward(x1: torch.Tensor, x2: torch.Tensor, p: float, compute_mode: int | None = None) -> torch.Tensor:
    diff = _pairwise_difference(x1, x2).abs()
    if p == 0:
        return (diff != 0).to(x1.dtype).sum(-1)
    if p == float("inf"):
        return diff.amax(-1) if diff.shape[-1] else diff.sum(-1)
    if p == 1:
        return diff.sum(-1)
    if p == 2:
        return diff.square().sum(-1).sqrt()
    return diff.pow(p).sum(-1).pow(1.0 / p)


@_composite(aten._cdist_backward.default)
def cdist_backward(grad: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor, p: float,
                   cdist: torch.Tensor) -> torch.Tensor:
    """d cdist / d x1: sum over r of grad * d|x1 - x2|_p (zero where a distance or a difference is zero)."""
    diff = _pairwise_difference(x1, x2)
    dist = cdist.unsqueeze(-1)
    if p == 0:
        return torch.zeros_like(x1)
    if p == 1:
        local = diff.sign()
    elif p == float("inf"):
        local = diff.sign() * (diff.abs() == dist).to(diff.dtype)
    else:
        safe = torch.where(dist == 0, torch.ones_like(dist), dist)
        magnitude = diff.abs().pow(p - 1) if p != 2 else diff.abs()
        local = torch.where(dist == 0, torch.zeros_like(diff), diff.sign() * magnitude / safe.pow(p - 1))
    return (grad.unsqueeze(-1) * local).sum(-2)


@_composite(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(sorted_sequence: torch.Tensor, values: Any, *, out_int32: bool = False, right: bool = False,
                 side: str | None = None, sorter: torch.Tensor | None = None) -> torch.Tensor:
    """How many sequence elements are < v (left) or <= v (right): comparisons, no binary search."""
    seq = sorted_sequence if sorter is None else sorted_sequence.gather(-1, sorter)
    if not isinstance(values, torch.Tensor):
        values = torch.tensor(values, dtype=seq.dtype).to(seq.device)
    v = values.unsqueeze(-1)
    rows = seq if seq.dim() == 1 else seq.unsqueeze(-2)
    before = ~(rows > v) if (right or side == "right") else rows < v
    return before.sum(-1).to(torch.int32 if out_int32 else torch.int64)


@_composite(aten.histc.default)
def histc(x: torch.Tensor, bins: int = 100, min: float = 0, max: float = 0) -> torch.Tensor:
    """Counts in ``bins`` equal bins over [min, max] (the data's range when both are 0), as torch's CPU kernel."""
    lo: Any = min
    hi: Any = max
    if lo == hi:
        lo, hi = x.amin() if x.numel() else torch.zeros((), device=x.device), x.amax() if x.numel() else torch.zeros(
            (), device=x.device)
        same = lo == hi
        lo, hi = torch.where(same, lo - 1, lo), torch.where(same, hi + 1, hi)
    position = ((x - lo) / (hi - lo) * bins).to(torch.int64)
    position = torch.where(x == hi, bins - 1, position).clamp(0, bins - 1).flatten()
    inside = ((x >= lo) & (x <= hi)).flatten().to(x.dtype)
    return torch.zeros(bins, dtype=x.dtype, device=x.device).index_add(0, position, inside)


def _mask_order(mask: torch.Tensor) -> torch.Tensor:
    """For each position, how many true mask entries precede it (its slot in the source), clamped at 0."""
    return (mask.flatten().long().cumsum(0) - 1).clamp(min=0)


@_composite(aten.masked_scatter.default)
def masked_scatter(x: torch.Tensor, mask: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """Where ``mask`` is true, the next element of ``source`` in row-major order; elsewhere ``x``."""
    mask = mask.expand(x.shape)
    taken = source.flatten().index_select(0, _mask_order(mask).clamp(max=max(source.numel() - 1, 0)))
    return torch.where(mask, taken.view(x.shape), x)


@_composite(aten.masked_scatter_backward.default)
def masked_scatter_backward(grad: torch.Tensor, mask: torch.Tensor, sizes: Any) -> torch.Tensor:
    numel = math.prod(sizes)
    mask = mask.expand(grad.shape)
    picked = torch.where(mask, grad, torch.zeros_like(grad)).flatten()
    order = _mask_order(mask).clamp(max=max(numel - 1, 0))
    return torch.zeros(numel, dtype=grad.dtype, device=grad.device).index_add(0, order, picked).view(sizes)


@_composite(aten.put.default)
def put(x: torch.Tensor, index: torch.Tensor, source: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
    flat_index = index.flatten()
    flat_index = torch.where(flat_index < 0, flat_index + x.numel(), flat_index)
    flat = x.flatten()
    values = source.flatten().to(x.dtype)
    flat = flat.index_add(0, flat_index, values) if accumulate else flat.index_copy(0, flat_index, values)
    return flat.view(x.shape)


@_composite(aten._linalg_check_errors.default)
def linalg_check_errors(info: torch.Tensor, api_name: str, *, is_matrix: bool) -> None:
    """torch's error for a failed factorization (not positive definite, singular): it needs ``info``'s value,
    so the pending graph runs here, as the CPU checks its LAPACK status."""
    torch.ops.aten._linalg_check_errors.default(info.cpu(), api_name, is_matrix=is_matrix)
