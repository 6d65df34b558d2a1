"""Matrix factorizations and solves on pjrt tensors (batch-sharded where it matters) against torch on the CPU.

Cholesky, triangular solves, QR, eigh, LU and what torch builds on them run natively (no CPU
fallback); eigenvectors are checked by their defining properties, since their signs are arbitrary.
"""

from __future__ import annotations

import pytest
import torch

import pjrt_plugins.spmd as xs

from _exec_support import assert_close, engine  # noqa: F401


def _batch(x: torch.Tensor) -> torch.Tensor:
    """``x`` on pjrt, its leading (batch) dimension sharded over the 8 devices when it has 8 matrices."""
    d = x.to("pjrt")
    if x.dim() == 3 and x.shape[0] == 8:
        xs.mark_sharding(d, xs.Mesh(range(8), (8,), ("b",)), ("b", None, None))
    return d


def _compare(cases, grad_cases=(), tol: float = 1e-4) -> None:
    results = []
    for name, fn, args in cases:
        with_grad = name in grad_cases
        pairs = []
        for dev in (False, True):
            moved = [(_batch(a) if dev else a.clone()).requires_grad_(with_grad) for a in args]
            out = fn(*moved)
            outs = list(out) if isinstance(out, tuple) else [out]
            if with_grad:
                seed = torch.linspace(-1, 1, outs[0].numel()).reshape(outs[0].shape)
                outs += torch.autograd.grad(outs[0], moved, seed.to("pjrt") if dev else seed)
            pairs.append(outs)
        results.append((name, pairs))
    for name, (ref, got) in results:
        for i, (r, g) in enumerate(zip(ref, got)):
            assert_close(f"{name}[{i}]", g.cpu(), r.detach(), rtol=tol, atol=tol)
    assert xs.metrics().fallbacks == 0


def _spd(*batch: int, n: int = 4) -> torch.Tensor:
    a = torch.randn(*batch, n, n)
    return a @ a.mT + n * torch.eye(n)


def test_cholesky_and_triangular_solves_with_gradients(engine):
    torch.manual_seed(0)
    spd, a, b = _spd(8), torch.randn(8, 4, 4), torch.randn(8, 4, 2)
    _compare([
        ("cholesky", torch.linalg.cholesky, [spd]),
        ("cholesky_upper", lambda m: torch.linalg.cholesky(m, upper=True), [spd]),
        ("cholesky_ex", torch.linalg.cholesky_ex, [spd]),
        ("cholesky_solve", lambda r, m: torch.cholesky_solve(r, torch.linalg.cholesky(m)), [b, spd]),
        ("cholesky_inverse", lambda m: torch.cholesky_inverse(torch.linalg.cholesky(m[0]), upper=False), [spd]),
        ("solve_triangular", lambda m, r: torch.linalg.solve_triangular(m.triu() + 4 * torch.eye(4).to(m.device), r,
                                                                        upper=True), [a, b]),
        ("solve_triangular_right_unit", lambda m, r: torch.linalg.solve_triangular(m.tril(), r.mT, upper=False,
                                                                                   left=False, unitriangular=True),
         [a, b]),
        ("triangular_solve_transposed", lambda r, m: torch.triangular_solve(r, m.tril() + 4 * torch.eye(4).to(m.device),
                                                                            upper=False, transpose=True), [b, a]),
    ], grad_cases={"cholesky", "cholesky_solve", "cholesky_inverse", "solve_triangular"})


def test_qr_of_tall_wide_and_batched_matrices_in_every_mode(engine):
    torch.manual_seed(1)
    cases = []
    for shape in ((5, 3), (3, 5), (8, 4, 4)):
        m = torch.randn(*shape)
        for mode in ("reduced", "complete", "r"):
            cases.append((f"qr_{shape}_{mode}", lambda x, mode=mode: torch.linalg.qr(x, mode), [m]))
        cases.append((f"geqrf_{shape}", torch.geqrf, [m]))
    cases += [
        ("householder_product", torch.linalg.householder_product, [torch.randn(5, 3), torch.randn(3)]),
        ("ormqr", lambda v, t, c: torch.ormqr(v, t, c, left=False, transpose=True),
         [torch.randn(4, 3), torch.randn(3), torch.randn(2, 4)]),
    ]
    _compare(cases, grad_cases={"qr_(5, 3)_reduced", "qr_(8, 4, 4)_reduced"})


def test_symmetric_eigendecomposition_values_match_and_vectors_diagonalize(engine):
    torch.manual_seed(2)
    spd = _spd(8, n=5)
    _compare([("eigvalsh", torch.linalg.eigvalsh, [spd]),
              ("eigvalsh_upper", lambda m: torch.linalg.eigvalsh(m.triu(), UPLO="U"), [spd])],
             grad_cases={"eigvalsh"})
    values, vectors = torch.linalg.eigh(_batch(spd))
    values, vectors = values.cpu(), vectors.cpu()
    assert_close("eigenvalues", values, torch.linalg.eigvalsh(spd), rtol=1e-4, atol=1e-4)
    assert_close("A V = V diag(w)", spd @ vectors, vectors * values.unsqueeze(-2), rtol=1e-4, atol=1e-4)
    assert_close("V^T V = I", vectors.mT @ vectors, torch.eye(5).expand(8, 5, 5), rtol=1e-5, atol=1e-5)


def test_lu_det_slogdet_solve_and_inverse_with_gradients(engine):
    torch.manual_seed(3)
    a, b = torch.randn(8, 4, 4) + 3 * torch.eye(4), torch.randn(8, 4, 2)  # well conditioned: float32 gradients agree
    rect = torch.randn(5, 3)
    _compare([
        ("det", torch.linalg.det, [a]),
        ("slogdet", lambda m: torch.linalg.slogdet(m)[::-1], [a]),
        ("logdet", lambda m: torch.logdet(m @ m.mT + torch.eye(4).to(m.device)), [a]),
        ("solve", torch.linalg.solve, [a, b]),
        ("solve_vector", lambda m, r: torch.linalg.solve(m, r[..., 0]), [a, b]),
        ("solve_right", lambda m, r: torch.linalg.solve(m, r.mT, left=False), [a, b]),
        ("inv", torch.linalg.inv, [a]),
        ("lu_factor", torch.linalg.lu_factor, [a]),
        ("lu_factor_rectangular", torch.linalg.lu_factor, [rect]),
        ("lu", lambda m: torch.linalg.lu(m)[::-1], [a]),
        ("lu_rectangular", lambda m: torch.linalg.lu(m)[::-1], [rect.mT]),
        ("lu_unpack", lambda m: torch.lu_unpack(*torch.linalg.lu_factor(m)), [a]),
        ("lu_solve", lambda m, r: torch.linalg.lu_solve(*torch.linalg.lu_factor(m), r), [a, b]),
        ("lu_solve_adjoint", lambda m, r: torch.linalg.lu_solve(*torch.linalg.lu_factor(m), r, adjoint=True), [a, b]),
        ("det_singular", torch.linalg.det, [torch.tensor([[1.0, 2.0], [2.0, 4.0]])]),
    ], grad_cases={"det", "slogdet", "logdet", "solve", "solve_right", "inv", "lu", "lu_solve"})


def test_inverse_and_solve_of_a_batch_of_empty_matrices(engine):
    """0x0 matrices: an empty inverse and solution, info 0 per matrix (no gather along a zero-size dimension)."""
    empty, rhs = torch.randn(3, 0, 0), torch.randn(3, 0, 2)
    _compare([
        ("inv", torch.linalg.inv, [empty]),
        ("inv_ex", torch.linalg.inv_ex, [empty]),
        ("solve", torch.linalg.solve, [empty, rhs]),
    ])


@pytest.mark.parametrize("fn, message", [
    (lambda m: torch.linalg.cholesky(m), "not positive-definite"),
    (lambda m: torch.linalg.inv(m), "could not be completed"),
])
def test_failed_factorizations_raise_torchs_error(engine, fn, message):
    with pytest.raises(torch.linalg.LinAlgError, match=message):
        fn(torch.tensor([[1.0, 2.0], [2.0, 4.0]]).to("pjrt"))


@pytest.fixture
def matmul_precision():
    before = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(before)


def test_products_follow_torchs_float32_matmul_precision(engine, matmul_precision):
    # torch's default ("highest") computes float32 products in float32; XLA's DEFAULT lets a GPU
    # use TF32 (seen on an H100: 1e-4 off torch). The setting is part of the program key.
    from pjrt_plugins.spmd import execution
    from pjrt_plugins.spmd.lowering import LoweringOptions

    a, w = torch.randn(4, 8), torch.randn(2, 3, 3, 3)
    image = torch.randn(1, 3, 6, 6)
    seen = {}
    for setting, level in [("highest", "HIGHEST"), ("high", "HIGH"), ("medium", "DEFAULT")]:
        matmul_precision(setting)
        product = (a.to("pjrt") @ a.to("pjrt").T).cpu()
        text = execution.last_program().lowered.text
        assert text.count(f"precision = [{level}, {level}]") == 1, text
        conv = torch.nn.functional.conv2d(image.to("pjrt"), w.to("pjrt")).cpu()
        conv_text = execution.last_program().lowered.text
        assert f"precision_config = [#stablehlo<precision {level}>, #stablehlo<precision {level}>]" in conv_text
        seen[setting] = product
        torch.testing.assert_close(conv, torch.nn.functional.conv2d(image, w))
    for product in seen.values():  # the CPU plugin computes float32 at every level
        torch.testing.assert_close(product, a @ a.T)
    with pytest.raises(ValueError, match="unknown matmul precision 'low'"):
        LoweringOptions(matmul_precision="low")
