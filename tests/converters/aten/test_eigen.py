"""The Jacobi converters of ``converters/aten/eigen.py`` (``_linalg_eigh``, ``_linalg_svd``, ``linalg_pinv``) and
their loop (``numeric/jacobi.py``): every declared case against PyTorch on ONNX Runtime and built by the real
TensorRT-RTX builder; the off-diagonal norm after the fixed sweeps at the largest side; repeated eigenvalues,
ill-conditioned and rank-deficient matrices; PyTorch's rank cutoff; the clear error past the side limit."""

from __future__ import annotations

import itertools

import numpy as np
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
import torch
from converter_cases import assert_case_lowers_matches_and_builds, own_cases
from rtx_build import assert_builds

import pipeline
from converters.aten.case_modules import Unary
from converters.aten.eigen import register_eigen_converters
from converters.aten.numeric import linalg_steps as steps
from converters.aten.numeric.jacobi import SWEEPS, jacobi, round_robin
from converters.cases import ConverterCase
from converters.context import ConverterContext
from converters.errors import ConversionError
from converters.registry import ConverterEntry
from converters.settings import Settings
from converters.targets import OpKey

OWN, REGISTRY, CASES = own_cases(register_eigen_converters)


@pytest.mark.parametrize(("entry", "case"), CASES, ids=[c.name for _, c in CASES])
def test_case_matches_pytorch_and_builds(entry: ConverterEntry, case: ConverterCase) -> None:
    assert_case_lowers_matches_and_builds(entry, case, REGISTRY, OWN)


# ---------------------------------------------------------------------------------------------- the loop


@pytest.mark.parametrize("n", [4, 7])
def test_round_robin_rotates_every_pair_once_per_sweep(n: int) -> None:
    partners, signs = round_robin(n)
    pairs = [(int(p), int(q)) for r in range(partners.shape[0]) for p, q in np.argwhere(np.triu(partners[r]))]
    assert sorted(pairs) == list(itertools.combinations(range(n), 2))
    assert (np.abs(signs).sum(-1) == 2 * (n // 2)).all()  # n // 2 disjoint pairs a round


def _loop_session(n: int, one_sided: bool, sweeps: int) -> ort.InferenceSession:
    """The Jacobi loop alone, ``(batch, n, n) -> (A_final, V)``, on ONNX Runtime."""
    a = gs.Variable("a", np.float32, ("batch", n, n))
    out = gs.Variable("out", np.float32, None)
    node = gs.Node("jacobi", "jacobi", inputs=[a], outputs=[out], domain="test")
    graph = gs.Graph(nodes=[node], inputs=[a], outputs=[], opset=18)
    ctx = ConverterContext(graph, node, OpKey("test", "jacobi"), Settings())
    final, vectors = jacobi(ctx, a, n, 3, one_sided=one_sided, sweeps=sweeps)
    graph.nodes.remove(node)
    final.dtype = vectors.dtype = np.dtype(np.float32)
    graph.outputs = [final, vectors]
    return ort.InferenceSession(gs.export_onnx(graph).SerializeToString(), providers=["CPUExecutionProvider"])


def test_sweeps_converge_at_the_largest_side() -> None:
    """After ``SWEEPS`` sweeps at side ``MAX_SIDE``, for a standard-normal matrix and the slowest measured (values
    spread 1 ... 1e-7 or 1e-6): the two-sided off-diagonal norm is below float32 rounding of ``||A||``; the
    one-sided columns are orthogonal to float32 rounding and their norms are float64's singular values."""
    n = steps.MAX_SIDE
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, n))
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    p, _ = np.linalg.qr(rng.standard_normal((n, n)))
    symmetric = np.stack([x + x.T, (q * np.logspace(0, -7, n)) @ q.T]).astype(np.float32)
    final, vectors = _loop_session(n, False, SWEEPS).run(None, {"a": symmetric})
    off = final - np.einsum("bii->bi", final)[..., None] * np.eye(n, dtype=np.float32)
    assert (np.linalg.norm(off, axis=(1, 2)) <= 6e-8 * np.linalg.norm(symmetric, axis=(1, 2))).all()
    np.testing.assert_allclose(vectors.transpose(0, 2, 1) @ vectors, np.broadcast_to(np.eye(n), (2, n, n)), atol=2e-5)
    general = np.stack([x, (q * np.logspace(0, -6, n)) @ p.T]).astype(np.float32)
    columns, _ = _loop_session(n, True, SWEEPS).run(None, {"a": general})
    gram = columns.transpose(0, 2, 1).astype(np.float64) @ columns
    norms = np.sqrt(np.einsum("bii->bi", gram))
    assert np.abs(gram[0] / norms[0, :, None] / norms[0, None, :] - np.eye(n)).max() < 1e-6
    exact = np.linalg.svd(general.astype(np.float64), compute_uv=False)
    error = np.abs(-np.sort(-norms, axis=-1) - exact)
    assert (error <= 5e-7 * exact[:, :1] + 2e-6 * exact).all(), error.max(axis=-1)  # PyTorch: 2.4e-7


# ---------------------------------------------------------------------------------------------- accuracy


def _orthogonal(n: int, seed: int) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    return q


def _converted(function: object, sample: torch.Tensor, **kwargs: object) -> pipeline.ConvertedModule:
    return pipeline.convert(Unary(function).eval(), (sample,), converters=REGISTRY, **kwargs)


def _eigh_invariants(a: torch.Tensor) -> tuple[torch.Tensor, ...]:
    values, vectors = torch.linalg.eigh(a, UPLO="U")
    return values, (vectors * values.unsqueeze(-2)) @ vectors.mT, vectors.mT @ vectors


@pytest.mark.parametrize(
    "spectrum",
    [[1.0, 1.0, 1.0, 2.0, 2.0, -3.0], [10.0**-k for k in range(6)]],
    ids=["repeated", "ill_conditioned"],
)
def test_eigh_repeated_and_ill_conditioned(spectrum: list[float]) -> None:
    q = _orthogonal(len(spectrum), 1)
    a = (q * torch.tensor(spectrum, dtype=torch.float64)) @ q.mT
    a = a.float().triu() + torch.randn(len(spectrum), len(spectrum)).tril(-1)  # UPLO="U": the lower part is noise
    module = _converted(_eigh_invariants, a)
    values, rebuilt, gram = module(a)
    assert torch.allclose(values.double(), torch.tensor(sorted(spectrum), dtype=torch.float64), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(rebuilt, a.triu() + a.triu(1).mT, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(gram, torch.eye(len(spectrum)), atol=1e-5, rtol=0)


def _svd_invariants(a: torch.Tensor) -> tuple[torch.Tensor, ...]:
    u, s, vh = torch.linalg.svd(a, full_matrices=True)
    k = s.shape[-1]
    return s, u.mT @ u, vh @ vh.mT, (u[..., :k] * s.unsqueeze(-2)) @ vh[..., :k, :]


@pytest.mark.parametrize(
    ("shape", "singular"),
    [((6, 4), [1.0, 1e-2, 1e-4, 1e-6]), ((4, 6), [3.0, 1.0, 0.0, 0.0]), ((5, 5), [2.0, 2.0, 1.0, 0.0, 0.0])],
    ids=["ill_conditioned", "rank_2_wide", "repeated_rank_3"],
)
def test_svd_full_matrices_ill_conditioned_and_rank_deficient(shape: tuple[int, int], singular: list[float]) -> None:
    m, n = shape
    u, v = _orthogonal(m, 2)[:, : len(singular)], _orthogonal(n, 3)[:, : len(singular)]
    a = ((u * torch.tensor(singular, dtype=torch.float64)) @ v.mT).float()
    module = _converted(_svd_invariants, a)
    s, u_gram, v_gram, rebuilt = module(a)
    torch.testing.assert_close(s, torch.linalg.svdvals(a), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(u_gram, torch.eye(m), atol=1e-5, rtol=0)  # the completed U is orthogonal
    torch.testing.assert_close(v_gram, torch.eye(n), atol=1e-5, rtol=0)
    torch.testing.assert_close(rebuilt, a, atol=1e-5, rtol=1e-4)


def test_svdvals_keep_small_singular_values() -> None:
    """A graded matrix (columns scaled 1 ... 1e-6): one-sided Jacobi's singular values agree with float64 to
    float32 rounding relative to each value, the smallest included."""
    scale = torch.tensor([10.0**-k for k in range(6)], dtype=torch.float64)
    a = (torch.randn(8, 6, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * scale).float()
    module = _converted(torch.linalg.svdvals, a)
    exact = torch.linalg.svdvals(a.double())
    assert ((module(a).double() - exact).abs() / exact).max() < 1e-5


# ---------------------------------------------------------------------------------------------- pinv


def _rank_two(shape: tuple[int, ...]) -> torch.Tensor:
    generator = torch.Generator().manual_seed(5)
    left = torch.randn(*shape[:-1], 2, generator=generator)
    return left @ torch.randn(*shape[:-2], 2, shape[-1], generator=generator)


@pytest.mark.parametrize(
    ("function", "sample"),
    [
        (torch.linalg.pinv, _rank_two((2, 6, 4))),
        (lambda a: torch.linalg.pinv(a, atol=0.5), torch.randn(3, 5, generator=torch.Generator().manual_seed(6))),
        (lambda a: torch.linalg.pinv(a, atol=torch.tensor(0.3), rtol=torch.tensor(0.2)), _rank_two((5, 5)) + 0.1),
        (lambda a: torch.linalg.pinv(a @ a.mT - 4.0 * a.mT @ a, hermitian=True), _rank_two((5, 5))),
    ],
    ids=["rank_deficient", "atol", "atol_rtol_tensors", "hermitian_indefinite"],
)
def test_pinv_matches_pytorch_cutoff(function: object, sample: torch.Tensor) -> None:
    module = _converted(function, sample)
    torch.testing.assert_close(module(sample), Unary(function)(sample), atol=1e-5, rtol=1e-4)


def test_pinv_drops_singular_values_below_the_default_cutoff() -> None:
    """Singular values 1 and 1e-8 (below ``eps * max(m, n) * 1``): the pseudo-inverse keeps only the first."""
    u, v = _orthogonal(4, 7)[:, :2], _orthogonal(3, 8)[:, :2]
    a = ((u * torch.tensor([1.0, 1e-8], dtype=torch.float64)) @ v.mT).float()
    module = _converted(torch.linalg.pinv, a)
    expected = torch.linalg.pinv(a)
    assert expected.abs().max() < 2  # PyTorch drops the 1e-8 too
    torch.testing.assert_close(module(a), expected, atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------------------------------------- limits


def test_largest_side_converts_and_builds() -> None:
    """The SVD with both full factors at side ``MAX_SIDE``: the graph is one Jacobi loop and one for the
    completion, whatever the side."""
    n = steps.MAX_SIDE
    a = torch.randn(n, n, generator=torch.Generator().manual_seed(9))
    module = _converted(_svd_invariants, a)
    loops = [node for node in module.onnx.graph.node if node.op_type == "Loop"]
    assert len(loops) == 2 and len(module.onnx.graph.node) < 100
    assert_builds(module)


@pytest.mark.parametrize(
    ("shape", "dynamic"),
    [((2, steps.MAX_SIDE + 1, 3), None), ((2, 4, 4), {"a": {1: ("rows", 2, 4, 8), 2: ("cols", 2, 4, 8)}})],
    ids=["too_large", "dynamic_side"],
)
def test_unsupported_side_is_a_clear_conversion_error(shape: tuple[int, ...], dynamic: object) -> None:
    with pytest.raises(
        ConversionError, match=r"(?s)sides must be static and at most 64.*fix: mark only batch dimensions dynamic"
    ):
        _converted(torch.linalg.svdvals, torch.randn(*shape), **({"dynamic": dynamic} if dynamic else {}))
