"""selfsup's MAST loss against an independent NumPy transcription of the paper's Eqs. 2-7.

MAST (Huang et al., ICLR 2023, arXiv 2303.03679) has no public code, so the reference here is the paper itself,
written out per sample and per subspace with explicit matrices (``/work/shared/seeds/000_mast.txt`` §3.1,
``specs/mast.md`` §2.3), in float64, calling nothing of selfsup. Its gradients are central finite differences of
that NumPy function. The choices the paper leaves open follow the spec's defaults: the VICReg variance and
covariance terms act on the unmasked means of both views; K in lambda = 25 d / K is the mean number of active
subspaces per pair, K in lambda1 = 600 / (d K) the number of masks.

selfsup guards its divisions with ``EPS = 1e-6`` (a ReLU variance head can output zeros; the paper has no such
guard): the comparisons set it to 0, so that any difference is a difference of formula.

Measured 2026-11-25: the loss agrees to the last bit (relative 0) in all three stages, gradients within 1.3e-7
of finite differences of gradients up to 34. Bugs planted in selfsup/losses/mast.py and caught here (then
reverted): the mask squared in the trace (all 4 tests fail); lambda = 25 d / K with the number of masks instead of
the active subspaces (stages "one" and "composed" fail); the symmetric KL without its 1/2 (all 4); the VICReg
variance term on the variances instead of the means (the 3 loss tests).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import selfsup.losses.mast as mast

# ---------------------------------------------------------------------------------- the paper, in NumPy
LAMBDA_NUM, LAMBDA1_NUM, LAMBDA2, ALPHA, BETA = 25.0, 600.0, 25.0, 25.0, 1.0  # §3.2
VICREG_GAMMA, VICREG_EPS = 1.0, 1e-4  # VICReg's variance hinge (Bardes et al. 2022), which MAST keeps (Eq. 1)


def ref_d_me(z_a: np.ndarray, z_b: np.ndarray, masks: np.ndarray, active: np.ndarray) -> float:
    """Eq. 2: (1/n) sum_i sum_k ||z_i . m_k - z'_i . m_k||^2, over the subspaces trained for pair i."""
    n, k = len(z_a), masks.shape[1]
    total = 0.0
    for i in range(n):
        for kk in range(k):
            if active[i, kk]:
                diff = z_a[i] * masks[:, kk] - z_b[i] * masks[:, kk]
                total += float(diff @ diff)
    return total / n


def ref_d_mg(mu_a, var_a, mu_b, var_b, masks, active) -> float:
    """Eq. 4: (1/n) sum_i sum_k 2 ||mu~_k - mu~'_k||^2 / (tr Sigma~_k + tr Sigma~'_k), with mu~_k = mu . m_k and
    Sigma~_k = Sigma diag(m_k) (§3.1: the mask multiplies the covariance once)."""
    n, k = len(mu_a), masks.shape[1]
    total = 0.0
    for i in range(n):
        sigma_a, sigma_b = np.diag(var_a[i]), np.diag(var_b[i])
        for kk in range(k):
            if not active[i, kk]:
                continue
            m = masks[:, kk]
            mu_ta, mu_tb = mu_a[i] * m, mu_b[i] * m
            sig_ta, sig_tb = sigma_a @ np.diag(m), sigma_b @ np.diag(m)
            total += 2.0 * float((mu_ta - mu_tb) @ (mu_ta - mu_tb)) / (np.trace(sig_ta) + np.trace(sig_tb))
    return total / n


def ref_kl(mu_p, var_p, mu_q, var_q) -> float:
    """Eq. 6 as printed: 1/2 [tr(Sigma_q^-1 Sigma_p) + (mu_q - mu_p)^T Sigma_q^-1 (mu_q - mu_p) + log |Sigma_q|/|Sigma_p|]
    (no "-d"), with full matrices."""
    sigma_p, sigma_q = np.diag(var_p), np.diag(var_q)
    inv_q = np.linalg.inv(sigma_q)
    diff = mu_q - mu_p
    return 0.5 * (np.trace(inv_q @ sigma_p) + diff @ inv_q @ diff
                  + np.log(np.linalg.det(sigma_q) / np.linalg.det(sigma_p)))


def ref_sym_kl(mu_a, var_a, mu_b, var_b) -> float:
    """Eq. 5: (1/n) sum_i KL(N_i || N'_i) + KL(N'_i || N_i)."""
    n = len(mu_a)
    return sum(ref_kl(mu_a[i], var_a[i], mu_b[i], var_b[i]) + ref_kl(mu_b[i], var_b[i], mu_a[i], var_a[i])
               for i in range(n)) / n


def ref_variance(z: np.ndarray) -> float:
    """VICReg: (1/d) sum_j max(0, gamma - sqrt(Var(z^j) + eps)), unbiased variance."""
    n, d = z.shape
    total = 0.0
    for j in range(d):
        col = z[:, j]
        var = ((col - col.mean()) ** 2).sum() / (n - 1)
        total += max(0.0, VICREG_GAMMA - np.sqrt(var + VICREG_EPS))
    return total / d


def ref_covariance(z: np.ndarray) -> float:
    """VICReg: C = 1/(n-1) sum_i (z_i - zbar)(z_i - zbar)^T, c = (1/d) sum_{i != j} C_ij^2."""
    n, d = z.shape
    centred = z - z.mean(axis=0)
    c = sum(np.outer(centred[i], centred[i]) for i in range(n)) / (n - 1)
    return sum(c[a, b] ** 2 for a in range(d) for b in range(d) if a != b) / d


def ref_mast(mu_a, var_a, mu_b, var_b, masks, active) -> float:
    """Eq. 7: lambda D_mg + lambda1 ||M||_1 + lambda2 l_kl + alpha l_var + beta l_cov."""
    d, k = masks.shape
    k_active = active.sum(axis=1).mean()
    lam, lam1 = LAMBDA_NUM * d / k_active, LAMBDA1_NUM / (d * k)
    return (lam * ref_d_mg(mu_a, var_a, mu_b, var_b, masks, active)
            + lam1 * np.abs(masks).sum()  # Eq. 3
            + LAMBDA2 * ref_sym_kl(mu_a, var_a, mu_b, var_b)
            + ALPHA * (ref_variance(mu_a) + ref_variance(mu_b))
            + BETA * (ref_covariance(mu_a) + ref_covariance(mu_b)))


def finite_difference_grads(fn, arrays: list[np.ndarray], h: float = 1e-6) -> list[np.ndarray]:
    grads = []
    for a in arrays:
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            old = a[idx]
            a[idx] = old + h
            up = fn()
            a[idx] = old - h
            down = fn()
            a[idx] = old
            g[idx] = (up - down) / (2 * h)
        grads.append(g)
    return grads


# ------------------------------------------------------------------------------------------- inputs
def make_inputs(seed: int, stage: str, n: int = 6, d: int = 8, k: int = 3) -> dict[str, np.ndarray]:
    """Means with std around 1 (so VICReg's hinge is active in some dimensions), variances in [0.3, 2],
    strictly positive masks (||M||_1 is then differentiable), and the active subspaces of a stage."""
    rng = np.random.default_rng(seed)
    mu_a = rng.normal(size=(n, d)) * np.linspace(0.5, 1.5, d)
    mu_b = mu_a + 0.3 * rng.normal(size=(n, d))
    var_a, var_b = rng.uniform(0.3, 2.0, size=(n, d)), rng.uniform(0.3, 2.0, size=(n, d))
    masks = rng.uniform(0.05, 1.2, size=(d, k))
    if stage == "one":  # stage 1: one augmentation per pair
        active = np.eye(k)[rng.integers(0, k, size=n)]
    elif stage == "composed":  # stage 2: 1..K augmentations per pair
        active = (rng.uniform(size=(n, k)) < 0.5).astype(float)
        active[np.arange(n), rng.integers(0, k, size=n)] = 1.0
    else:
        active = np.ones((n, k))
    return {"mu_a": mu_a, "var_a": var_a, "mu_b": mu_b, "var_b": var_b, "masks": masks, "active": active}


NAMES = ["mu_a", "var_a", "mu_b", "var_b", "masks"]


@pytest.fixture(autouse=True)
def no_division_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mast, "EPS", 0.0)


def selfsup_loss(x: dict[str, np.ndarray]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    tensors = {name: torch.tensor(x[name], dtype=torch.float64, requires_grad=True) for name in NAMES}
    loss, _ = mast.mast_loss(*(tensors[n] for n in NAMES[:4]), tensors["masks"],
                             torch.tensor(x["active"], dtype=torch.float64))
    loss.backward()
    return loss, {name: t.grad for name, t in tensors.items()}


# -------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("stage", ["one", "composed", "all"])
def test_mast_loss_and_gradients_match_the_paper(stage: str) -> None:
    """Eq. 7 with the paper's coefficients, stage-1 (one active subspace per pair), stage-2 (several) and all
    active: the loss within 1e-10 and every gradient within 1e-5 of the finite differences of the reference."""
    x = make_inputs(seed={"one": 0, "composed": 1, "all": 2}[stage], stage=stage)
    loss, grads = selfsup_loss(x)
    expected = ref_mast(*(x[n] for n in NAMES), x["active"])
    assert loss.item() == pytest.approx(expected, rel=1e-10)
    ref_grads = finite_difference_grads(lambda: ref_mast(*(x[n] for n in NAMES), x["active"]),
                                        [x[n] for n in NAMES])
    for name, ref in zip(NAMES, ref_grads):
        np.testing.assert_allclose(grads[name].numpy(), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max(),
                                   err_msg=f"d loss / d {name}")


def test_mast_terms_match_the_paper() -> None:
    """Each term on its own: D_mg (Eq. 4), the symmetric KL (Eqs. 5-6), D_me (Eq. 2)."""
    x = make_inputs(seed=3, stage="composed")
    t = {name: torch.tensor(v, dtype=torch.float64) for name, v in x.items()}
    args = (t["mu_a"], t["var_a"], t["mu_b"], t["var_b"])
    assert mast.masked_gaussian_distance(*args, t["masks"], t["active"]).item() == pytest.approx(
        ref_d_mg(x["mu_a"], x["var_a"], x["mu_b"], x["var_b"], x["masks"], x["active"]), rel=1e-12)
    assert mast.symmetric_kl(*args).item() == pytest.approx(
        ref_sym_kl(x["mu_a"], x["var_a"], x["mu_b"], x["var_b"]), rel=1e-12)
    assert mast.masked_distance(t["mu_a"], t["mu_b"], t["masks"], t["active"]).item() == pytest.approx(
        ref_d_me(x["mu_a"], x["mu_b"], x["masks"], x["active"]), rel=1e-12)

