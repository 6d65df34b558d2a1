"""Op lowerings against plain torch: graphs of core ATen ops run sharded on the real CPU plugin (8 devices).

Each test traces one function with many outputs (one compile) and names the op of any mismatch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import pjrt_plugins.spmd as xs

from _exec_support import check_all, engine, run, spec  # noqa: F401

torch.manual_seed(1234)


def _named(pairs):
    names = [n for n, _ in pairs]
    return names, (lambda *args: [f(*args) for _, f in pairs])


def _compare(pairs, args, shardings, tolerances=None):
    names, fn = _named(pairs)
    outs, program = run(fn, args, shardings)
    refs = fn(*[a.clone() for a in args])
    check_all(names, outs, refs, tolerances)
    return program


FLOAT_BINARY = [
    ("add", lambda x, y: x + y),
    ("add_alpha", lambda x, y: torch.add(x, y, alpha=2.5)),
    ("sub", lambda x, y: x - 2 * y),
    ("rsub_scalar", lambda x, y: 2 - x),
    ("mul", lambda x, y: x * y),
    ("div", lambda x, y: x / y),
    ("div_floor", lambda x, y: torch.div(x, y, rounding_mode="floor")),
    ("div_trunc", lambda x, y: torch.div(x, y, rounding_mode="trunc")),
    ("remainder", lambda x, y: torch.remainder(x, y)),
    ("fmod", lambda x, y: torch.fmod(x, y)),
    ("pow_scalar", lambda x, y: x.pow(2)),
    ("pow_tensor", lambda x, y: x.abs().pow(y)),
    ("maximum", lambda x, y: torch.maximum(x, y)),
    ("minimum", lambda x, y: torch.minimum(x, y)),
    ("atan2", lambda x, y: torch.atan2(x, y)),
    ("clamp", lambda x, y: x.clamp(-0.5, 0.5)),
    ("clamp_min", lambda x, y: x.clamp(min=0.1)),
    ("where", lambda x, y: torch.where(x > y, x, y)),
    ("where_scalar", lambda x, y: torch.where(x > 0, x, 0.0)),
    ("masked_fill", lambda x, y: x.masked_fill(x < 0, 1.5)),
    ("broadcast_row", lambda x, y: x + y[0]),
    ("eq", lambda x, y: x == y),
    ("ne_scalar", lambda x, y: x != 0.5),
    ("lt", lambda x, y: x < y),
    ("le_scalar", lambda x, y: x <= 0.0),
    ("gt", lambda x, y: x > y),
    ("ge", lambda x, y: x >= y),
    ("logical_and", lambda x, y: torch.logical_and(x > 0, y > 0)),
    ("logical_not", lambda x, y: torch.logical_not(x > 0)),
    ("to_half", lambda x, y: x.to(torch.float16)),
    ("to_bfloat16", lambda x, y: x.to(torch.bfloat16)),
    ("to_double", lambda x, y: x.double()),
    ("to_int", lambda x, y: (x * 10).to(torch.int32)),
    ("to_bool", lambda x, y: x.to(torch.bool)),
    ("half_arith", lambda x, y: x.half() * y.half() + 1),
]


def test_elementwise_arithmetic_comparisons_where_and_casts_match_torch(engine):
    x, y = torch.randn(8, 12), torch.randn(8, 12)
    # float16: torch rounds the product to half before adding 1, XLA may fuse both into one rounding, so the two
    # can differ by one half-precision ulp of the product (2**-10 near 1), also where the sum is small.
    _compare(FLOAT_BINARY, [x, y], [spec(0, 1), spec(None, 1)], {"half_arith": (2.0**-10, 2.0**-10)})


INT_OPS = [
    ("add", lambda a, b: a + b),
    ("mul", lambda a, b: a * b),
    ("floordiv", lambda a, b: a // b),
    ("mod", lambda a, b: a % b),
    ("div_trunc", lambda a, b: torch.div(a, b, rounding_mode="trunc")),
    ("true_div", lambda a, b: a / b),
    ("and", lambda a, b: a & b),
    ("or", lambda a, b: a | b),
    ("xor", lambda a, b: a ^ b),
    ("not", lambda a, b: ~a),
    ("gt", lambda a, b: a > b),
    ("eq", lambda a, b: a == b),
    ("abs", lambda a, b: a.abs()),
    ("neg", lambda a, b: -a),
    ("sign", lambda a, b: a.sign()),
    ("where", lambda a, b: torch.where(a > 0, a, b)),
    ("to_float", lambda a, b: a.float() * 0.5),
    ("sum", lambda a, b: a.sum(1)),
    ("bool_sum", lambda a, b: (a > 0).sum()),
    ("round", lambda a, b: (a * b).round()),  # integers stay as they are, in their dtype
    ("ceil", lambda a, b: (a * b).ceil()),
    ("floor", lambda a, b: (a * b).floor()),
]


def test_integer_ops_match_torch_exactly(engine):
    a = torch.randint(-50, 50, (8, 12))
    b = torch.randint(1, 7, (8, 12)) * torch.where(torch.rand(8, 12) < 0.5, -1, 1)
    _compare(INT_OPS, [a, b], [spec(0, None), spec(1, 0)])


UNARY = [
    ("exp", lambda x: x.exp()),
    ("expm1", lambda x: x.expm1()),
    ("log", lambda x: x.abs().log()),
    ("log1p", lambda x: x.abs().log1p()),
    ("log2", lambda x: x.abs().log2()),
    ("log10", lambda x: x.abs().log10()),
    ("sqrt", lambda x: x.abs().sqrt()),
    ("rsqrt", lambda x: x.abs().rsqrt()),
    ("sin", lambda x: x.sin()),
    ("cos", lambda x: x.cos()),
    ("tan", lambda x: x.tan()),
    ("tanh", lambda x: x.tanh()),
    ("sigmoid", lambda x: x.sigmoid()),
    ("relu", lambda x: x.relu()),
    ("gelu", lambda x: F.gelu(x)),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh")),
    ("silu", lambda x: F.silu(x)),
    ("softplus", lambda x: F.softplus(x)),
    ("elu", lambda x: F.elu(x)),
    ("leaky_relu", lambda x: F.leaky_relu(x, 0.1)),
    ("erf", lambda x: torch.erf(x)),
    ("erfinv", lambda x: torch.erfinv(x.clamp(-0.9, 0.9))),
    ("atan", lambda x: x.atan()),
    ("asin", lambda x: x.clamp(-0.9, 0.9).asin()),
    ("sinh", lambda x: x.sinh()),
    ("neg", lambda x: -x),
    ("abs", lambda x: x.abs()),
    ("sign", lambda x: x.sign()),
    ("floor", lambda x: (x * 3).floor()),
    ("ceil", lambda x: (x * 3).ceil()),
    ("round", lambda x: (x * 3).round()),
    ("trunc", lambda x: (x * 3).trunc()),
    ("reciprocal", lambda x: x.reciprocal()),
    ("isnan", lambda x: torch.isnan(x.log())),
    ("nan_to_num", lambda x: torch.nan_to_num(x.log(), nan=0.0)),
]


def test_unary_math_matches_torch(engine):
    x = torch.randn(8, 12)
    # erfinv is a polynomial approximation in XLA; torch uses a different one.
    _compare(UNARY, [x], [spec(1, 0)], tolerances={"erfinv": (2e-5, 1e-6), "tan": (2e-5, 1e-6)})


REDUCTIONS = [
    ("sum", lambda x: x.sum()),
    ("sum_dim", lambda x: x.sum(0)),
    ("sum_keepdim", lambda x: x.sum(1, keepdim=True)),
    ("sum_dims", lambda x: x.sum((0, 1))),
    ("mean", lambda x: x.mean()),
    ("mean_dim", lambda x: x.mean(1)),
    ("amax", lambda x: x.amax(0)),
    ("amin", lambda x: x.amin(1, keepdim=True)),
    ("argmax", lambda x: x.argmax(1)),
    ("argmin", lambda x: x.argmin(0)),
    ("argmax_all", lambda x: x.argmax()),
    ("max_dim_values", lambda x: x.max(1).values),
    ("max_dim_indices", lambda x: x.max(1).indices),
    ("min_dim", lambda x: x.min(0).values),
    ("max_all", lambda x: x.max()),
    ("min_all", lambda x: x.min()),
    ("var", lambda x: x.var(0)),
    ("std", lambda x: x.std(1)),
    ("var_mean", lambda x: torch.var_mean(x, 1)[1]),
    ("prod", lambda x: x.prod(1)),
    ("any", lambda x: (x > 1).any(1)),
    ("all", lambda x: (x > -3).all()),
    ("softmax", lambda x: torch.softmax(x, 1)),
    ("softmax_dim0", lambda x: torch.softmax(x, 0)),
    ("log_softmax", lambda x: torch.log_softmax(x, 1)),
    ("logsumexp", lambda x: torch.logsumexp(x, 1)),
    ("cumsum", lambda x: x.cumsum(1)),
    ("norm", lambda x: x.norm()),
    ("normalize", lambda x: F.normalize(x, dim=1)),
    ("layer_norm", lambda x: F.layer_norm(x, (12,))),
]


def test_reductions_and_softmax_match_torch(engine):
    x = torch.randn(8, 12)
    _compare(REDUCTIONS, [x], [spec(0, 1)])


def test_argmax_prefers_the_first_of_equal_values_and_nan(engine):
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [float("nan"), 2.0, float("nan"), 1.0]] * 4)
    _compare([("argmax", lambda x: x.argmax(1)), ("argmin", lambda x: x.argmin(1)),
              ("amax", lambda x: x.amax(1))], [x], [spec(0, None)])


LINALG = [
    ("matmul_2d", lambda a, b, c, d, bias: a @ b),
    ("mm", lambda a, b, c, d, bias: torch.mm(a, b)),
    ("addmm", lambda a, b, c, d, bias: torch.addmm(bias, a, b)),
    ("addmm_scaled", lambda a, b, c, d, bias: torch.addmm(bias, a, b, beta=0.5, alpha=2.0)),
    ("bmm", lambda a, b, c, d, bias: torch.bmm(c, d)),
    ("matmul_3d", lambda a, b, c, d, bias: c @ d),
    ("linear", lambda a, b, c, d, bias: F.linear(a, b.t(), bias)),
    ("matmul_3d_2d", lambda a, b, c, d, bias: torch.matmul(c, b)),
    ("matvec", lambda a, b, c, d, bias: a @ b[:, 0]),
    ("vecmat", lambda a, b, c, d, bias: a[0] @ b),
    ("einsum", lambda a, b, c, d, bias: torch.einsum("bij,bjk->bik", c, d)),
]


def test_matrix_products_match_torch(engine):
    a, b = torch.randn(8, 16), torch.randn(16, 12)
    c, d = torch.randn(4, 8, 16), torch.randn(4, 16, 6)
    bias = torch.randn(12)
    # Sums of 16 products of N(0, 1) values: float32 summation in another order differs by a few 1e-6 in
    # absolute terms, which the default atol (1e-6) does not allow where a sum cancels to near zero. Which
    # draw cancels depends on the global RNG, so it failed after some tests (test_exec_training) only.
    products = {name: (1e-5, 2e-5) for name, _ in LINALG}
    _compare(LINALG, [a, b, c, d, bias], [spec(0, 1), spec(1, None), spec(None, 0, 1), spec(0, None, None), spec(None)],
             tolerances=products)


SHAPES = [
    ("view", lambda x, c: x.view(4, 24)),
    ("reshape", lambda x, c: x.reshape(96)),
    ("t", lambda x, c: x.t()),
    ("permute", lambda x, c: c.permute(2, 0, 1)),
    ("transpose", lambda x, c: c.transpose(1, 2)),
    ("expand", lambda x, c: x.unsqueeze(0).expand(3, 8, 12)),
    ("squeeze", lambda x, c: x[None, :, None].squeeze()),
    ("unsqueeze", lambda x, c: x.unsqueeze(1)),
    ("slice", lambda x, c: x[2:6]),
    ("slice_step", lambda x, c: x[:, 1:9:3]),
    ("slice_negative", lambda x, c: x[-3:]),
    ("select", lambda x, c: x[3]),
    ("select_negative", lambda x, c: x[:, -1]),
    ("cat0", lambda x, c: torch.cat([x, x * 2], 0)),
    ("cat1", lambda x, c: torch.cat([x, x], 1)),
    ("stack", lambda x, c: torch.stack([x, x], 1)),
    ("flip", lambda x, c: x.flip(0)),
    ("pad", lambda x, c: F.pad(x, (1, 2, 0, 1), value=0.5)),
    ("repeat", lambda x, c: x.repeat(2, 1)),
    ("split", lambda x, c: x.split(5, 1)[1]),
    ("chunk", lambda x, c: x.chunk(2, 0)[0]),
    ("flatten", lambda x, c: c.flatten(1)),
    ("unbind", lambda x, c: x.unbind(0)[2]),
    ("roll", lambda x, c: x.roll(2, 0)),
    ("narrow", lambda x, c: x.narrow(1, 2, 4)),
    ("tril", lambda x, c: torch.tril(x)),
    ("triu_batched", lambda x, c: torch.triu(c, 1)),
    ("roll_dims", lambda x, c: x.roll((1, -2), (0, 1))),
    ("roll_flat", lambda x, c: x.roll(5)),
    ("diagonal", lambda x, c: x.diagonal()),
]


def test_view_and_layout_ops_match_torch(engine):
    x, c = torch.randn(8, 12), torch.randn(4, 8, 6)
    _compare(SHAPES, [x, c], [spec(0, 1), spec(None, 0, 1)])


FACTORIES = [
    ("zeros", lambda x: torch.zeros(3, 4)),
    ("ones", lambda x: torch.ones(5)),
    ("full", lambda x: torch.full((2, 3), 7.0)),
    ("full_int", lambda x: torch.full((2, 3), 7)),
    ("arange", lambda x: torch.arange(10)),
    ("arange_float", lambda x: torch.arange(1, 4, 0.5)),
    ("arange_view", lambda x: torch.arange(6).view(2, 3)),
    ("zeros_like", lambda x: torch.zeros_like(x)),
    ("ones_like", lambda x: torch.ones_like(x) + x),
    ("full_like", lambda x: torch.full_like(x, 3)),
    ("empty_fill", lambda x: torch.empty(3).fill_(2.0)),
    ("linspace", lambda x: torch.linspace(0, 1, 5)),
    ("eye", lambda x: torch.eye(3)),
    ("scalar_tensor", lambda x: x * torch.scalar_tensor(3.0)),
]


def test_factories_match_torch(engine):
    _compare(FACTORIES, [torch.randn(8, 12)], [spec(0, 1)])


INDEXING = [
    ("embedding", lambda w, idx, idx1, x: F.embedding(idx, w)),
    ("index_select", lambda w, idx, idx1, x: w.index_select(0, idx1)),
    ("index_select_dim1", lambda w, idx, idx1, x: x.index_select(1, idx1)),
    ("index_rows", lambda w, idx, idx1, x: x[idx1]),
    ("index_cols", lambda w, idx, idx1, x: x[:, idx1]),
    ("index_pairs", lambda w, idx, idx1, x: x[idx1, idx1]),
    ("gather", lambda w, idx, idx1, x: torch.gather(x, 1, idx1.view(1, 6).expand(8, 6))),
    ("index_put_acc", lambda w, idx, idx1, x: x.index_put((idx1,), torch.ones(6, 12), accumulate=True)),
    ("index_put", lambda w, idx, idx1, x: x.index_put((idx1[:1],), torch.full((1, 12), 9.0))),
    ("index_put_pairs_acc", lambda w, idx, idx1, x: x.index_put((idx1, idx1), torch.ones(6), accumulate=True)),
    ("scatter_add", lambda w, idx, idx1, x: torch.zeros(8, 3).scatter_add(0, idx1.view(6, 1).expand(6, 3),
                                                                          torch.ones(6, 3))),
    ("scatter", lambda w, idx, idx1, x: torch.zeros(3, 8).scatter(1, idx1[:1].view(1, 1).expand(3, 1), 1.0)),
]


def test_gathers_and_scatters_match_torch(engine):
    w = torch.randn(20, 6)
    idx = torch.randint(0, 20, (4, 5))
    idx1 = torch.randint(0, 8, (6,))
    x = torch.randn(8, 12)
    _compare(INDEXING, [w, idx, idx1, x], [spec(None, 1), spec(0, None), spec(None), spec(0, 1)])


def test_mlp_training_step_graph_matches_torch(engine):
    """Forward, backward and SGD update of a 2-layer MLP, data x model parallel on mesh (2, 4)."""

    def step(x, y, w1, b1, w2, b2):
        params = [w1, b1, w2, b2]
        for p in params:
            p.requires_grad_(True)
        h = F.relu(F.linear(x, w1, b1))
        loss = F.mse_loss(F.linear(h, w2, b2), y)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            return [loss] + [p - 0.1 * g for p, g in zip(params, grads)]

    args = [torch.randn(16, 32), torch.randn(16, 8), torch.randn(64, 32) * 0.2, torch.randn(64), torch.randn(8, 64) * 0.2,
            torch.randn(8)]
    shardings = [spec(0, None), spec(0, None), spec(1, None), spec(1), spec(None, 1), spec(None)]
    outs, program = run(step, args, shardings)
    refs = step(*[a.clone() for a in args])
    check_all(["loss", "w1", "b1", "w2", "b2"], outs, refs)
    # The partitioner keeps each updated parameter laid out like the parameter.
    assert program.output_shardings[1] == shardings[2]
    assert program.output_shardings[3] == shardings[4]


def test_gathers_and_scatters_of_0d_tensors_and_the_backward_of_max_along_a_dim(engine):
    """torch takes a 0-d tensor as one element along dim 0 (the lowering indexed its missing dim 0)."""
    x, i, s = torch.tensor(3.0), torch.tensor(0), torch.tensor(5.0)
    cases = {
        "scatter": lambda x, i, s: torch.scatter(x, 0, i, s),
        "scatter_add": lambda x, i, s: torch.scatter_add(x, 0, i, s),
        "scatter_reduce": lambda x, i, s: torch.scatter_reduce(x, 0, i, s, "amax"),
        "gather": lambda x, i, s: torch.gather(x, 0, i),
    }
    for name, fn in cases.items():
        got = fn(x.to("pjrt"), i.to("pjrt"), s.to("pjrt")).cpu()
        assert torch.equal(got, fn(x, i, s)), name
    for reduction in (lambda t: t.max(0)[0], lambda t: t.median(0)[0], lambda t: t.cummax(0)[0]):
        t = torch.tensor(2.0).to("pjrt").requires_grad_()
        (grad,) = torch.autograd.grad(reduction(t).sum() * 3, [t])
        assert grad.cpu().item() == 3.0


def test_ops_with_empty_results_or_empty_operands(engine):
    """An op whose results have no elements is a constant of their shape (gathers of a zero-size dimension made
    XLA refuse the program: searchsorted into an empty sequence, combinations' backward)."""
    seq, values = torch.empty(0), torch.tensor([0.5, 1.5])
    assert torch.equal(torch.searchsorted(seq.to("pjrt"), values.to("pjrt")).cpu(), torch.searchsorted(seq, values))
    x = torch.empty(0, 3)
    picked = torch.index_select(x.to("pjrt"), 0, torch.empty(0, dtype=torch.long).to("pjrt"))
    assert picked.cpu().shape == (0, 3)
    one = torch.randn(1)
    xs.set_cpu_fallback(True)  # combinations' forward uses masked_select (the fixture is strict)
    t = one.to("pjrt").requires_grad_()
    (grad,) = torch.autograd.grad(torch.combinations(t, r=2).sum(), [t])
    ref = one.clone().requires_grad_()
    (want,) = torch.autograd.grad(torch.combinations(ref, r=2).sum(), [ref])
    assert torch.equal(grad.cpu(), want)
