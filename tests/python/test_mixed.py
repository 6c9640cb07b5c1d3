"""Issue 50 (items 3 and 4): packed queries over a paged KV cache, the mixed batch of decoding
requests (one row) and prefill chunks (many rows) in one launch: clattn.paged_varlen_attention
and flash-attn's flash_attn_varlen_func with block_table, each request against its own
float64 numpy reference."""

import numpy as np
import pytest

import clattn
from clattn.flash_attn import flash_attn_varlen_func


def mixed_problem(rng, rows, keys, H=4, Hkv=2, E=16, Ev=8, page=16):
    """Packed q, shuffled pages holding each request's keys (NaN elsewhere), the table."""
    B = len(rows)
    cq = np.concatenate([[0], np.cumsum(rows)]).astype(np.int32)
    need = [(n + page - 1) // page for n in keys]
    pages = sum(need) + 2
    perm = iter(rng.permutation(pages))
    table = -np.ones((B, max(need) + 1), np.int32)
    kp = np.full((pages, page, Hkv, E), np.nan, np.float32)
    vp = np.full((pages, page, Hkv, Ev), np.nan, np.float32)
    for b, n in enumerate(keys):
        for j in range(need[b]):
            table[b, j] = next(perm)
        for j in range(n):
            kp[table[b, j // page], j % page] = rng.uniform(-1, 1, (Hkv, E))
            vp[table[b, j // page], j % page] = rng.uniform(-1, 1, (Hkv, Ev))
    q = rng.uniform(-1, 1, (int(cq[-1]), H, E)).astype(np.float32)
    return q, kp, vp, cq, table, np.array(keys, np.int32)


def reference(q, kp, vp, cq, table, counts, causal, scale=None, softcap=0.0, sinks=None):
    """Each request alone in float64: (out (total_q, H, Ev), lse (H, total_q)); softcap caps
    the scaled scores, a sink joins each row's denominator (and its lse)."""
    page, H, Hkv = kp.shape[1], q.shape[1], kp.shape[2]
    out = np.zeros(q.shape[:2] + (vp.shape[3],))
    lse = np.full((H, q.shape[0]), -np.inf)
    for b in range(len(counts)):
        n, rows = int(counts[b]), slice(cq[b], cq[b + 1])
        nq = cq[b + 1] - cq[b]
        slots = [(table[b, j // page], j % page) for j in range(n)]
        K = np.array([kp[p, s] for p, s in slots], np.float64).reshape(n, Hkv, -1)
        V = np.array([vp[p, s] for p, s in slots], np.float64).reshape(n, Hkv, -1)
        for h in range(H):
            s = q[rows, h].astype(np.float64) @ K[:, h // (H // Hkv)].T
            s *= scale or q.shape[2] ** -0.5
            if softcap:
                s = softcap * np.tanh(s / softcap)
            keep = np.tril(np.ones((nq, n), bool), k=n - nq) if causal else np.ones((nq, n), bool)
            s = np.where(keep, s, -np.inf)
            m = np.max(s, axis=1, keepdims=True, initial=-np.inf)
            if sinks is not None:
                m = np.maximum(m, sinks[h])
            w = np.where(keep, np.exp(s - np.where(np.isfinite(m), m, 0)), 0.0)
            total = w.sum(1, keepdims=True)
            if sinks is not None:
                total = total + np.exp(sinks[h] - m)
            out[rows, h] = (w / np.maximum(total, 1e-300)) @ V[:, h // (H // Hkv)]
            lse[h, rows] = np.where(total[:, 0] > 0, m[:, 0] + np.log(np.maximum(total[:, 0],
                                                                                 1e-300)), -np.inf)
    return out, lse


@pytest.mark.parametrize("rows,keys,page,causal", [
    ([1, 1, 200, 1], [63, 129, 300, 1], 16, True),   # 3 decodes + a chunk over its cache
    ([1, 17, 65, 1], [1, 63, 129, 17], 1, False),
    ([17, 1, 65], [129, 63, 63], 48, True),          # a chunk with fewer keys than rows
])
def test_mixed_batch_matches_each_request(rows, keys, page, causal):
    rng = np.random.default_rng(50)
    q, kp, vp, cq, table, counts = mixed_problem(rng, rows, keys, page=page)
    out, lse = clattn.paged_varlen_attention(q, kp, vp, cq, table, counts, causal=causal,
                                             return_lse=True)
    want, want_lse = reference(q, kp, vp, cq, table, counts, causal)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=2e-6)


def test_softcap_and_sinks():
    rng = np.random.default_rng(54)
    q, kp, vp, cq, table, counts = mixed_problem(rng, [1, 33, 1], [50, 80, 1], page=16)
    q *= 4
    sinks = rng.uniform(-1, 1, 4).astype(np.float32)
    out, lse = clattn.paged_varlen_attention(q, kp, vp, cq, table, counts, causal=True,
                                             softcap=2.5, sinks=sinks, return_lse=True)
    want, want_lse = reference(q, kp, vp, cq, table, counts, True, softcap=2.5, sinks=sinks)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=2e-6)


def test_flash_attn_varlen_func_with_block_table():
    """flash-attn's signature: cu_seqlens_k's differences are the key counts; the fused
    launch and the lse as flash-attn returns it."""
    rng = np.random.default_rng(51)
    q, kp, vp, cq, table, counts = mixed_problem(rng, [1, 40, 1], [70, 45, 9], H=4, Hkv=1)
    ck = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    out, lse, probs = flash_attn_varlen_func(q, kp, vp, cq, ck, 40, 70, 0.0, 0.3, True,
                                             return_attn_probs=True, block_table=table)
    want, want_lse = reference(q, kp, vp, cq, table, counts, True, scale=0.3)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=2e-6)
    assert probs is None


def test_torch_tensors():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(52)
    q, kp, vp, cq, table, counts = mixed_problem(rng, [1, 17], [33, 17], page=16)
    got = clattn.paged_varlen_attention(*(torch.from_numpy(a) for a in (q, kp, vp, cq, table,
                                                                         counts)), causal=True)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), reference(q, kp, vp, cq, table, counts, True)[0],
                               rtol=1e-5, atol=2e-6)


def test_refusals():
    rng = np.random.default_rng(53)
    q, kp, vp, cq, table, counts = mixed_problem(rng, [1, 17], [33, 17], page=16)
    bad = cq.copy()
    bad[1] = 19  # past the next offset
    with pytest.raises(clattn.ArgumentError, match="never decrease"):
        clattn.paged_varlen_attention(q, kp, vp, bad, table, counts)
    bad_table = table.copy()
    bad_table[1, 0] = kp.shape[0] + 4
    with pytest.raises(clattn.ArgumentError, match=r"block_table\[1, 0\]"):
        clattn.paged_varlen_attention(q, kp, vp, cq, bad_table, counts)
    with pytest.raises(clattn.ArgumentError, match="seqlens_k"):
        clattn.paged_varlen_attention(q, kp, vp, cq, table, counts[:1])
