"""clattn.positional_encoding, clattn.rotary_embedding and clattn.KVCache against float64
numpy references: sinusoid and learned tables with a start position, x added in place of
dtype; RoPE both styles, partial rotary dims, position ids; a KV cache grown by a prompt and
single steps, grouped-query heads, each step's attention equal to attention over every key so
far with the queries as the last rows; paged caches (the allocator's pages, the caller's)
equal to the same keys contiguous."""

import numpy as np
import pytest

import clattn
from test_sdpa import reference


def sinusoid(start, seq, dim, base=10000.0):
    pos = np.arange(start, start + seq, dtype=np.float64)[:, None]
    k = np.arange(dim)[None, :] // 2
    angle = pos * base ** (-2.0 * k / dim)
    return np.where(np.arange(dim)[None, :] % 2 == 0, np.sin(angle), np.cos(angle))


@pytest.mark.parametrize("seq, dim, start", [(1, 1, 0), (17, 7, 5), (65, 64, 1000)])
def test_sinusoid_table(seq, dim, start):
    got = clattn.positional_encoding(seq=seq, dim=dim, start=start)
    np.testing.assert_allclose(got, sinusoid(start, seq, dim), atol=2e-6)


def test_added_to_x_and_learned_table():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 13, 8)).astype(np.float32)
    np.testing.assert_allclose(clattn.positional_encoding(x, start=3),
                               x + sinusoid(3, 13, 8), atol=2e-6)
    table = rng.standard_normal((40, 8)).astype(np.float32)
    np.testing.assert_allclose(clattn.positional_encoding(x, table=table, start=20),
                               x + table[20:33], atol=1e-6)
    with pytest.raises(clattn.ArgumentError):
        clattn.positional_encoding(x, table=table, start=30)  # rows 30..42 of 40


def rope_reference(x, rot, pairs, positions, base=10000.0):
    x = np.asarray(x, np.float64)
    out = x.copy()
    half = rot // 2
    theta = positions[..., None] * base ** (-2.0 * np.arange(half) / rot)  # (B, S, half)
    c, s = np.cos(theta)[:, None], np.sin(theta)[:, None]
    if pairs:
        a, b = x[..., 0:rot:2], x[..., 1:rot:2]
        out[..., 0:rot:2], out[..., 1:rot:2] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., :half], x[..., half:rot]
        out[..., :half], out[..., half:rot] = a * c - b * s, a * s + b * c
    return out


@pytest.mark.parametrize("style", ["halves", "pairs"])
@pytest.mark.parametrize("rot", [None, 4, 8])
def test_rotary(style, rot):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 11, 8)).astype(np.float32)
    r = rot or 8
    positions = np.broadcast_to(np.arange(7, 18, dtype=np.float64), (2, 11))
    got = clattn.rotary_embedding(x, style=style, rotary_dim=rot, start=7)
    np.testing.assert_allclose(got, rope_reference(x, r, style == "pairs", positions),
                               atol=2e-6)
    ids = rng.integers(0, 5000, (2, 11))
    got = clattn.rotary_embedding(x, style=style, rotary_dim=rot, position_ids=ids)
    np.testing.assert_allclose(got, rope_reference(x, r, style == "pairs", ids.astype(float)),
                               atol=2e-5)
    with pytest.raises(clattn.ArgumentError):
        clattn.rotary_embedding(x, rotary_dim=5)
    with pytest.raises(clattn.ArgumentError, match="CLATTN_ROPE_WHOLE_HEAD"):
        clattn.rotary_embedding(x, rotary_dim=0)  # the whole head before 0.7: None now


@pytest.mark.parametrize("path", ["fused", "unfused"])
def test_kv_cache_steps(path):
    rng = np.random.default_rng(2)
    b, hq, hkv, d, prompt, steps = 2, 4, 2, 16, 9, 4
    keys = rng.standard_normal((b, hkv, prompt + steps, d)).astype(np.float32)
    values = rng.standard_normal((b, hkv, prompt + steps, d)).astype(np.float32)
    cache = clattn.KVCache(b, hkv, 32, d)
    cache.append(keys[:, :, :prompt], values[:, :, :prompt])
    assert len(cache) == prompt
    for t in range(prompt, prompt + steps):
        cache.append(keys[:, :, t:t + 1], values[:, :, t:t + 1])
        q = rng.standard_normal((b, hq, 1, d)).astype(np.float32)
        got = cache.attend(q, path=path)
        want = reference(q, keys[:, :, :t + 1], values[:, :, :t + 1], gqa=True)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
    cache.reset()
    assert len(cache) == 0
    # numbers a user can act on: how many fit, and the capacity the append needs
    cap = 32
    with pytest.raises(clattn.Error, match=f"capacity >= {cap + 1}"):
        cache.append(np.zeros((b, hkv, cap + 1, d), np.float32),
                     np.zeros((b, hkv, cap + 1, d), np.float32))
    def zeros(n):
        return np.zeros((b, hkv, n, d), np.float32)
    cache.append(zeros(cap - 2), zeros(cap - 2))
    with pytest.raises(clattn.Error, match=rf"only 2 more fit .*capacity >= {cap + 1}"):
        cache.append(zeros(3), zeros(3))
    cache.append(zeros(2), zeros(2))
    with pytest.raises(clattn.Error, match=rf"full \({cap} of {cap} keys\).*capacity >= {cap + 1}"):
        cache.append(zeros(1), zeros(1))
    cache.close()


@pytest.mark.parametrize("page_size", [1, 5, 64])
def test_kv_cache_paged(page_size):
    rng = np.random.default_rng(3)
    b, hq, hkv, d, prompt, steps, cap = 2, 4, 2, 16, 9, 4, 24
    keys = rng.standard_normal((b, hkv, prompt + steps, d)).astype(np.float32)
    values = rng.standard_normal((b, hkv, prompt + steps, d)).astype(np.float32)
    blocks = -(-cap // page_size)
    cache = clattn.KVCache(b, hkv, cap, d, page_size=page_size, num_pages=2 * blocks + 3)
    # sequence 1 takes the pool's top pages, last first; sequence 0 the allocator's
    table = np.full((b, blocks), -1, np.int32)
    table[1] = np.arange(2 * blocks + 2, blocks + 2, -1)
    cache.map_pages(table)
    cache.append(keys[:, :, :prompt], values[:, :, :prompt])
    for t in range(prompt, prompt + steps):
        cache.append(keys[:, :, t:t + 1], values[:, :, t:t + 1])
        q = rng.standard_normal((b, hq, 1, d)).astype(np.float32)
        want = reference(q, keys[:, :, :t + 1], values[:, :, :t + 1], gqa=True)
        np.testing.assert_allclose(cache.attend(q), want, rtol=1e-5, atol=2e-6)
    q = rng.standard_normal((b, hq, 3, d)).astype(np.float32)  # a causal block, bottom-right
    n = prompt + steps
    bottom_right = np.arange(n)[None, :] <= np.arange(3)[:, None] + n - 3
    want = reference(q, keys, values, mask=bottom_right, gqa=True)
    np.testing.assert_allclose(cache.attend(q), want, rtol=1e-5, atol=2e-6)
    # sequence 0's first block holds the allocator's page 0: remapping it is refused
    bad = np.full((b, blocks), -1, np.int32)
    bad[0, 0] = 1
    with pytest.raises(clattn.Error, match=r"table\[0, 0\] = 1: that block holds keys"):
        cache.map_pages(bad)
    with pytest.raises(clattn.Error, match="paged cache .* fused path only"):
        cache.attend(q, path="unfused")
    cache.close()


def _dequantize(blocks, kind, e):
    """llama.cpp's dequantize_row_q8_0 / _q4_0 on (..., e // 32 * size) uint8 blocks."""
    size = 34 if kind == "q8_0" else 18
    b = blocks.reshape(-1, size)
    d = b[:, :2].copy().view(np.float16).astype(np.float32)
    if kind == "q8_0":
        q = b[:, 2:].view(np.int8).astype(np.float32)
    else:
        q = np.concatenate([b[:, 2:] & 15, b[:, 2:] >> 4], axis=1).astype(np.float32) - 8
    return (q * d).reshape(blocks.shape[:-1] + (e,))


def _quantize_ref(x, kind):
    """llama.cpp's quantize_row_q8_0_ref / _q4_0_ref in numpy float32."""
    x = np.asarray(x, np.float32).reshape(-1, 32)
    out = []
    for row in x:
        if kind == "q8_0":
            d = np.float32(np.abs(row).max()) / np.float32(127)
            inv = np.float32(1) / d if d else np.float32(0)
            s = row * inv
            q = (np.sign(s) * np.floor(np.abs(s) + np.float32(0.5))).astype(np.int8)
            out.append(np.concatenate([np.array([d], np.float16).view(np.uint8), q.view(np.uint8)]))
        else:
            m = row[np.argmax(np.abs(row))]
            d = np.float32(m) / np.float32(-8)
            inv = np.float32(1) / d if d else np.float32(0)
            q = np.minimum(15, np.trunc(row * inv + np.float32(8.5))).astype(np.uint8)
            out.append(np.concatenate([np.array([d], np.float16).view(np.uint8),
                                       q[:16] | (q[16:] << 4)]))
    return np.stack(out)


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_quantize_matches_llama_cpp(kind):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 5, 64)).astype(np.float32)
    got = clattn.quantize(x, kind)
    assert got.dtype == np.uint8 and got.shape == (3, 5, 2 * (34 if kind == "q8_0" else 18))
    np.testing.assert_array_equal(got.reshape(-1, got.shape[-1] // 2), _quantize_ref(x, kind))
    with pytest.raises(clattn.ArgumentError, match="multiple of 32"):
        clattn.quantize(x[..., :48], kind)


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_quantized_kv_cache_and_paged(kind):
    rng = np.random.default_rng(5)
    b, hq, hkv, d, n = 2, 4, 2, 64, 11
    keys = rng.standard_normal((b, hkv, n, d)).astype(np.float32)
    values = rng.standard_normal((b, hkv, n, d)).astype(np.float32)
    kq = _dequantize(clattn.quantize(keys, kind), kind, d)
    vq = _dequantize(clattn.quantize(values, kind), kind, d)
    cache = clattn.KVCache(b, hkv, 16, d, dtype=kind, page_size=4)
    cache.append(keys[:, :, :7], values[:, :, :7])
    for t in range(7, n):
        cache.append(keys[:, :, t:t + 1], values[:, :, t:t + 1])
        q = rng.standard_normal((b, hq, 1, d)).astype(np.float32)
        want = reference(q, kq[:, :, :t + 1], vq[:, :, :t + 1], gqa=True)
        np.testing.assert_allclose(cache.attend(q), want, rtol=1e-5, atol=2e-6)
    cache.close()
    # paged_attention over a ggml cache handed over as blocks, and over float pools
    page = 3
    pages = np.arange(8)[::-1].copy()  # sequence b's block j is page pages[4 * b + j]
    kp = np.zeros((8, page, hkv, d), np.float32)
    vp = np.zeros((8, page, hkv, d), np.float32)
    for bb in range(b):
        for j in range(n):
            kp[pages[4 * bb + j // page], j % page] = keys[bb, :, j]
            vp[pages[4 * bb + j // page], j % page] = values[bb, :, j]
    table = pages.reshape(b, 4).astype(np.int32)
    q = rng.standard_normal((b, hq, 2, d)).astype(np.float32)
    bottom_right = np.arange(n)[None, :] <= np.arange(2)[:, None] + n - 2
    want = reference(q, kq, vq, mask=bottom_right, gqa=True)
    counts = np.array([n, n], np.int32)
    for pools in ((kp, vp), (clattn.quantize(kp, kind), clattn.quantize(vp, kind))):
        got = clattn.paged_attention(q, *pools, table, counts, is_causal=True, kv_dtype=kind)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
    exact = reference(q, keys, values, mask=bottom_right, gqa=True)
    print(f"{kind}: max error against unquantized attention "
          f"{np.abs(got - exact).max():.3g}")
