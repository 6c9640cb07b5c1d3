"""clattn.KVCache.step (clattn_kv_cache_decode: a decode step's append fused into the
attention, one launch) against the float64 reference over the cache and the new row, and
against append-then-attend."""
import numpy as np
import pytest

import clattn
from test_sdpa import reference


@pytest.mark.parametrize("page_size,dtype", [(0, "float32"), (16, "float32"), (0, "q8_0")])
def test_kv_cache_step(page_size, dtype):
    rng = np.random.default_rng(5)
    b, hq, hkv, d, prompt, steps = 2, 4, 2, 32, 17, 3
    keys = rng.standard_normal((b, hkv, prompt + steps, d)).astype(np.float32)
    values = rng.standard_normal((b, hkv, prompt + steps, d)).astype(np.float32)
    fused = clattn.KVCache(b, hkv, 40, d, dtype=dtype, page_size=page_size)
    plain = clattn.KVCache(b, hkv, 40, d, dtype=dtype, page_size=page_size)
    for cache in (fused, plain):
        cache.append(keys[:, :, :prompt], values[:, :, :prompt])
    for t in range(prompt, prompt + steps):
        q = rng.standard_normal((b, hq, 1, d)).astype(np.float32)
        got = fused.step(q, keys[:, :, t:t + 1], values[:, :, t:t + 1])
        plain.append(keys[:, :, t:t + 1], values[:, :, t:t + 1])
        two = plain.attend(q, path="fused")
        assert len(fused) == t + 1
        if dtype == "float32":
            want = reference(q, keys[:, :, :t + 1], values[:, :, :t + 1], gqa=True)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
        # the new key is attended as given (the cache stores it quantized for later steps)
        np.testing.assert_allclose(got, two, rtol=0, atol=2e-6 if dtype == "float32" else 0.05)
    # the next step reads what the fused steps stored: the same as the plain cache's
    q = rng.standard_normal((b, hq, 1, d)).astype(np.float32)
    np.testing.assert_allclose(fused.attend(q, path="fused"), plain.attend(q, path="fused"),
                               rtol=0, atol=2e-6)
    fused.close()
    plain.close()


def test_kv_cache_step_refusals():
    cache = clattn.KVCache(1, 1, 4, 16)
    with pytest.raises(clattn.Error, match="one new token"):
        cache.step(np.zeros((1, 1, 2, 16), np.float32), np.zeros((1, 1, 1, 16), np.float32),
                   np.zeros((1, 1, 1, 16), np.float32))
    with pytest.raises(clattn.Error, match="k_new"):
        cache.step(np.zeros((1, 1, 1, 16), np.float32), np.zeros((1, 1, 2, 16), np.float32),
                   np.zeros((1, 1, 2, 16), np.float32))
    for _ in range(4):
        cache.step(np.zeros((1, 1, 1, 16), np.float32), np.zeros((1, 1, 1, 16), np.float32),
                   np.zeros((1, 1, 1, 16), np.float32))
    with pytest.raises(clattn.Error, match="full"):
        cache.step(np.zeros((1, 1, 1, 16), np.float32), np.zeros((1, 1, 1, 16), np.float32),
                   np.zeros((1, 1, 1, 16), np.float32))
    cache.close()
