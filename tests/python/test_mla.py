"""clattn.mla_decode (issue 50: DeepSeek's multi-head latent attention, absorbed, over a paged
latent cache in FlashInfer's argument style) against numpy float64 references: the absorbed
attention over the latent rows, and the non-absorbed form built from explicit W_UK / W_UV
matrices. Awkward key counts, shuffled pages, float32 / float16 / q8_0 caches, decode and a
few causal rows per request, the joined 576-wide cache and the refusals."""

import numpy as np
import pytest

import clattn

LATENT, ROPE, NOPE, DV = 512, 64, 128, 128
SCALE = 1.0 / np.sqrt(NOPE + ROPE)


def paged(rng, lens, page_size):
    """A shuffled pool of pages for requests of `lens` keys: (ckv, kpe) pools poisoned with
    NaN outside the requests' keys, FlashInfer's kv_indptr / kv_indices, and the per-request
    (keys, 512) latent and (keys, 64) rotary rows."""
    blocks = [-(-n // page_size) for n in lens]
    pages = sum(blocks) + 2
    perm = rng.permutation(pages)
    ckv = np.full((pages, page_size, LATENT), np.nan, np.float32)
    kpe = np.full((pages, page_size, ROPE), np.nan, np.float32)
    indptr, indices, latents, ropes = [0], [], [], []
    at = 0
    for n, nb in zip(lens, blocks):
        mine = perm[at:at + nb]
        at += nb
        c = rng.uniform(-1, 1, (n, LATENT)).astype(np.float32)
        r = rng.uniform(-1, 1, (n, ROPE)).astype(np.float32)
        for j in range(n):
            ckv[mine[j // page_size], j % page_size] = c[j]
            kpe[mine[j // page_size], j % page_size] = r[j]
        indices.extend(mine.tolist())
        indptr.append(len(indices))
        latents.append(c)
        ropes.append(r)
    return (ckv, kpe, np.array(indptr, np.int32), np.array(indices, np.int32),
            np.array(lens, np.int32), latents, ropes)


def absorbed_reference(q_nope, q_pe, latents, ropes, rows, causal):
    """float64 attention of each request's rows over [c, k_pe] (576), V = c: (nnz, H, 512)."""
    out = np.zeros(q_nope.shape, np.float64)
    for b, (c, r) in enumerate(zip(latents, ropes)):
        k = np.concatenate([c, r], axis=1).astype(np.float64)
        for i in range(rows):
            q = np.concatenate([q_nope[b * rows + i], q_pe[b * rows + i]], axis=1)
            s = q.astype(np.float64) @ k.T * SCALE
            n = k.shape[0]
            if causal:
                s[:, i + n - rows + 1:] = -np.inf
            w = np.exp(s - s.max(axis=1, keepdims=True))
            out[b * rows + i] = (w / w.sum(axis=1, keepdims=True)) @ c.astype(np.float64)
    return out


def rel(got, want):
    return np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want))


@pytest.mark.parametrize("lens,heads,page_size,rows,causal", [
    ([1], 16, 16, 1, False),
    ([17, 65], 16, 16, 1, False),
    ([1031], 16, 64, 1, False),
    ([33, 20], 128, 16, 1, False),
    ([65, 40], 16, 16, 3, True),
])
def test_mla_decode_float32(lens, heads, page_size, rows, causal):
    rng = np.random.default_rng(len(lens) * 1000 + heads + rows)
    ckv, kpe, indptr, indices, kv_len, latents, ropes = paged(rng, lens, page_size)
    nnz = len(lens) * rows
    q_nope = rng.uniform(-1, 1, (nnz, heads, LATENT)).astype(np.float32) * 0.2
    q_pe = rng.uniform(-1, 1, (nnz, heads, ROPE)).astype(np.float32)
    qo = np.arange(len(lens) + 1, dtype=np.int32) * rows if rows > 1 else None
    got = clattn.mla_decode(q_nope, q_pe, ckv, kpe, indptr, indices, kv_len, sm_scale=SCALE,
                            causal=causal, qo_indptr=qo)
    assert got.shape == (nnz, heads, LATENT) and got.dtype == np.float32
    want = absorbed_reference(q_nope, q_pe, latents, ropes, rows, causal)
    assert rel(got, want) < 1e-5


def test_mla_decode_matches_the_non_absorbed_form():
    """The absorbed call, mapped by W_UV, equals attention with k_h = [c W_UK[h], k_pe] and
    v_h = c W_UV[h] per head (float64, explicit matrices)."""
    rng = np.random.default_rng(7)
    heads, lens = 16, [37]
    ckv, kpe, indptr, indices, kv_len, latents, ropes = paged(rng, lens, 16)
    w_uk = rng.uniform(-0.15, 0.15, (heads, LATENT, NOPE))
    w_uv = rng.uniform(-0.1, 0.1, (heads, LATENT, DV))
    q_n = rng.uniform(-1, 1, (1, heads, NOPE))
    q_pe = rng.uniform(-1, 1, (1, heads, ROPE)).astype(np.float32)
    q_abs = np.einsum("bhe,hle->bhl", q_n, w_uk).astype(np.float32)
    got = clattn.mla_decode(q_abs, q_pe, ckv, kpe, indptr, indices, kv_len, sm_scale=SCALE)
    mapped = np.einsum("bhl,hle->bhe", got.astype(np.float64), w_uv)
    c, r = latents[0].astype(np.float64), ropes[0].astype(np.float64)
    want = np.zeros((1, heads, DV))
    for h in range(heads):
        k = np.concatenate([c @ w_uk[h], r], axis=1)
        s = np.concatenate([q_n[0, h], q_pe[0, h]]) @ k.T * SCALE
        w = np.exp(s - s.max())
        want[0, h] = (w / w.sum()) @ (c @ w_uv[h])
    assert rel(mapped, want) < 1e-5


@pytest.mark.parametrize("kind", ["float16", "q8_0"])
def test_mla_decode_compact_caches(kind):
    """A float16 cache (1152 bytes a token) and q8_0 (612): within their rounding."""
    rng = np.random.default_rng(11)
    lens, heads = [65, 17], 16
    ckv, kpe, indptr, indices, kv_len, latents, ropes = paged(rng, lens, 16)
    q_nope = rng.uniform(-1, 1, (2, heads, LATENT)).astype(np.float32) * 0.2
    q_pe = rng.uniform(-1, 1, (2, heads, ROPE)).astype(np.float32)
    want = absorbed_reference(q_nope, q_pe, latents, ropes, 1, False)
    if kind == "float16":
        got = clattn.mla_decode(q_nope.astype(np.float16), q_pe.astype(np.float16),
                                ckv.astype(np.float16), kpe.astype(np.float16), indptr, indices,
                                kv_len, sm_scale=SCALE)
        assert got.dtype == np.float16 and rel(got, want) < 3e-3
    else:
        ckv = np.nan_to_num(ckv)  # (quantized on the device: no NaN in a block's scale)
        kpe = np.nan_to_num(kpe)
        got = clattn.mla_decode(q_nope, q_pe, ckv, kpe, indptr, indices, kv_len, sm_scale=SCALE,
                                kv_dtype="q8_0")
        assert rel(got, want) < 3.0 / 254


def test_mla_decode_joined_cache():
    """kpe_cache=None: ckv_cache holds clattn's 576-wide rows [ckv, kpe] (no copy to join)."""
    rng = np.random.default_rng(5)
    ckv, kpe, indptr, indices, kv_len, latents, ropes = paged(rng, [40], 8)
    q_nope = rng.uniform(-1, 1, (1, 16, LATENT)).astype(np.float32) * 0.2
    q_pe = rng.uniform(-1, 1, (1, 16, ROPE)).astype(np.float32)
    joined = np.concatenate([ckv, kpe], axis=2)
    got = clattn.mla_decode(q_nope, q_pe, joined, None, indptr, indices, kv_len, sm_scale=SCALE)
    want = absorbed_reference(q_nope, q_pe, latents, ropes, 1, False)
    assert rel(got, want) < 1e-5


def test_mla_decode_refusals():
    rng = np.random.default_rng(3)
    ckv, kpe, indptr, indices, kv_len, _, _ = paged(rng, [20, 9], 8)
    q_nope = np.zeros((2, 16, LATENT), np.float32)
    q_pe = np.zeros((2, 16, ROPE), np.float32)
    args = (q_nope, q_pe, ckv, kpe, indptr, indices, kv_len)
    with pytest.raises(clattn.ArgumentError, match="q_nope"):
        clattn.mla_decode(q_nope[:, :, :256], *args[1:], sm_scale=SCALE)
    with pytest.raises(clattn.ArgumentError, match="kpe_cache"):
        clattn.mla_decode(q_nope, q_pe, ckv, kpe[:, :, :32], *args[4:], sm_scale=SCALE)
    with pytest.raises(clattn.ArgumentError, match="kv_len"):
        clattn.mla_decode(*args[:6], np.array([20, 99], np.int32), sm_scale=SCALE)
    bad = indices.copy()
    bad[0] = 999
    with pytest.raises(clattn.ArgumentError, match="kv_indices"):
        clattn.mla_decode(*args[:5], bad, kv_len, sm_scale=SCALE)
    with pytest.raises(clattn.ArgumentError, match="ragged"):
        clattn.mla_decode(np.zeros((3, 16, LATENT), np.float32), np.zeros((3, 16, ROPE),
                          np.float32), *args[2:], sm_scale=SCALE,
                          qo_indptr=np.array([0, 1, 3], np.int32))
    with pytest.raises(clattn.ArgumentError, match="kv_dtype"):
        clattn.mla_decode(*args, sm_scale=SCALE, kv_dtype="q4_0")


def test_mla_decode_torch_tensors():
    """torch tensors in give a torch tensor out, the same values as numpy's."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(13)
    ckv, kpe, indptr, indices, kv_len, latents, ropes = paged(rng, [30], 16)
    q_nope = rng.uniform(-1, 1, (1, 16, LATENT)).astype(np.float32) * 0.2
    q_pe = rng.uniform(-1, 1, (1, 16, ROPE)).astype(np.float32)
    got = clattn.mla_decode(torch.from_numpy(q_nope), torch.from_numpy(q_pe),
                            torch.from_numpy(ckv), torch.from_numpy(kpe),
                            torch.from_numpy(indptr), torch.from_numpy(indices),
                            torch.from_numpy(kv_len), sm_scale=SCALE)
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == (1, 16, LATENT)
    want = absorbed_reference(q_nope, q_pe, latents, ropes, 1, False)
    assert rel(got.numpy(), want) < 1e-5
