"""clattn.merge_state and clattn.cascade_decode against float64 numpy references."""
import math

import numpy as np
import pytest

import clattn


def _attend(q, k, v, scale):
    """float64 attention of q (H, D) over k (n, Hkv, D), v (n, Hkv, Dv): out (H, Dv), lse (H)."""
    H, G = q.shape[0], k.shape[1]
    out, lse = np.zeros((H, v.shape[2])), np.zeros(H)
    for h in range(H):
        s = k[:, h // (H // G), :].astype(np.float64) @ q[h].astype(np.float64) * scale
        m = s.max()
        w = np.exp(s - m)
        out[h] = w @ v[:, h // (H // G), :] / w.sum()
        lse[h] = m + math.log(w.sum())
    return out, lse


def _merge_ref(va, sa, vb, sb):
    m = np.maximum(sa, sb)
    wa = np.where(sa == -np.inf, 0.0, np.exp(sa - np.where(m == -np.inf, 0, m)))
    wb = np.where(sb == -np.inf, 0.0, np.exp(sb - np.where(m == -np.inf, 0, m)))
    tot = wa + wb
    with np.errstate(invalid="ignore", divide="ignore"):
        v = (wa[..., None] * np.nan_to_num(va) + wb[..., None] * np.nan_to_num(vb)) / tot[..., None]
        s = m + np.log(tot)
    return np.where(tot[..., None] > 0, v, 0.0), np.where(tot > 0, s, -np.inf)


@pytest.mark.parametrize("shape", [(1, 1, 1), (17, 3, 64), (63, 5, 65)])
def test_merge_state(shape):
    rng = np.random.default_rng(7)
    va, vb = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    sa, sb = (rng.uniform(-4, 4, shape[:-1]).astype(np.float32) for _ in range(2))
    sb.flat[::3] = -np.inf  # empty sides
    sa.flat[::5] = -np.inf
    vb[sb == -np.inf] = np.nan  # never read
    v, s = clattn.merge_state(va, sa, vb, sb)
    rv, rs = _merge_ref(va.astype(np.float64), sa.astype(np.float64), vb.astype(np.float64),
                        sb.astype(np.float64))
    np.testing.assert_allclose(v, rv, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s, rs, rtol=1e-6, atol=1e-6)
    only_a = (sb == -np.inf) & (sa != -np.inf)
    assert np.array_equal(v[only_a], va[only_a]) and np.array_equal(s[only_a], sa[only_a])


def test_merge_state_torch_and_refusal():
    torch = pytest.importorskip("torch")
    va, vb = torch.randn(4, 2, 8), torch.randn(4, 2, 8)
    sa, sb = torch.randn(4, 2), torch.randn(4, 2)
    v, s = clattn.merge_state(va, sa, vb, sb)
    assert isinstance(v, torch.Tensor) and v.shape == (4, 2, 8) and s.shape == (4, 2)
    with pytest.raises(clattn.ArgumentError, match="s_b"):
        clattn.merge_state(va.numpy(), sa.numpy(), vb.numpy(), sb.numpy()[:3])


@pytest.mark.parametrize("paged", [False, True])
def test_cascade_decode(paged):
    rng = np.random.default_rng(11)
    B, H, G, P, S, D, Dv, page = 5, 6, 3, 67, 19, 32, 16, 4
    q = rng.standard_normal((B, H, D)).astype(np.float32)
    pk = rng.standard_normal((P, G, D)).astype(np.float32)
    pv = rng.standard_normal((P, G, Dv)).astype(np.float32)
    sk = rng.standard_normal((B, S, G, D)).astype(np.float32)
    sv = rng.standard_normal((B, S, G, Dv)).astype(np.float32)
    lens = np.array([3, 0, 19, 7, 1], np.int32)
    scale = 1 / math.sqrt(D)
    if paged:
        blocks = -(-S // page)
        order = rng.permutation(B * blocks)
        table = order.reshape(B, blocks).astype(np.int32)
        kp = np.zeros((B * blocks, page, G, D), np.float32)
        vp = np.zeros((B * blocks, page, G, Dv), np.float32)
        for b in range(B):
            for j in range(S):
                kp[table[b, j // page], j % page] = sk[b, j]
                vp[table[b, j // page], j % page] = sv[b, j]
        out, lse = clattn.cascade_decode(q, pk, pv, kp, vp, lens, table, return_lse=True)
    else:
        out, lse = clattn.cascade_decode(q, pk, pv, sk, sv, lens, return_lse=True)
    for b in range(B):
        k = np.concatenate([pk, sk[b, :lens[b]]])
        v = np.concatenate([pv, sv[b, :lens[b]]])
        ro, rl = _attend(q[b], k, v, scale)
        np.testing.assert_allclose(out[b], ro, rtol=1e-5, atol=2e-6)
        np.testing.assert_allclose(lse[b], rl, rtol=1e-5, atol=2e-6)
