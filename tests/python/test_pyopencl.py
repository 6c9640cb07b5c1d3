"""pyopencl interop (skipped without pyopencl): arrays made on the device (never written from
the host) go in, the result comes back as a pyopencl array on the caller's queue, strided views
are read where they lie, and it matches the float64 reference."""

import numpy as np
import pytest

import clattn
from test_sdpa import reference

cl = pytest.importorskip("pyopencl")
cla = pytest.importorskip("pyopencl.array")
clrandom = pytest.importorskip("pyopencl.clrandom")


@pytest.fixture(scope="module")
def queue():
    for platform in cl.get_platforms():
        devices = platform.get_devices()
        if devices:
            return cl.CommandQueue(cl.Context(devices[:1]))
    pytest.skip("no OpenCL device")


@pytest.mark.parametrize("path", ["fused", "unfused"])
def test_device_arrays_stay_on_the_device(queue, path):
    # made by a kernel on the device: the host never wrote these buffers
    q = clrandom.rand(queue, (2, 4, 17, 8), np.float32, a=-1, b=1)
    k = clrandom.rand(queue, (2, 4, 23, 8), np.float32, a=-1, b=1)
    v = clrandom.rand(queue, (2, 4, 23, 8), np.float32, a=-1, b=1)
    out = clattn.scaled_dot_product_attention(q, k, v, is_causal=True, path=path)
    assert isinstance(out, cla.Array) and out.queue is queue
    assert out.shape == (2, 4, 17, 8)
    np.testing.assert_allclose(out.get(), reference(q.get(), k.get(), v.get(), causal=True),
                               rtol=1e-5, atol=2e-6)


def test_strided_views_and_masks(queue):
    base = clrandom.rand(queue, (3, 13, 4, 8), np.float32, a=-1, b=1)  # (B, L, H, d)
    view = base.transpose((0, 2, 1, 3))  # (B, H, L, d), strided: no copy
    mask = np.random.default_rng(0).random((13, 13)) < 0.7
    out = clattn.scaled_dot_product_attention(view, view, view, attn_mask=mask, path="fused")
    host = base.get().transpose(0, 2, 1, 3)
    np.testing.assert_allclose(out.get(), reference(host, host, host, mask=mask), rtol=1e-5,
                               atol=2e-6)


@pytest.mark.parametrize("path", ["fused", "unfused"])
@pytest.mark.parametrize("where", ["device", "host"])
def test_sinks_with_device_arrays(queue, path, where):
    """Attention sinks with pyopencl inputs: a float32 (Hq,) pyopencl array read where it lies
    (a strided view) or a numpy array; a repeat of the same layouts without sinks is
    unchanged, and a bad shape raises naming sinks."""
    rng = np.random.default_rng(11)
    q = clrandom.rand(queue, (2, 4, 9, 8), np.float32, a=-1, b=1)
    k = clrandom.rand(queue, (2, 2, 14, 8), np.float32, a=-1, b=1)
    v = clrandom.rand(queue, (2, 2, 14, 8), np.float32, a=-1, b=1)
    host = rng.uniform(-1, 3, size=4).astype(np.float32)
    host[2] = -np.inf  # no sink for head 2
    sinks = host
    if where == "device":
        spaced = np.zeros(8, np.float32)
        spaced[::2] = host
        sinks = cla.to_device(queue, spaced)[::2]  # stride 2: read in place
    out = clattn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                              path=path, sinks=sinks)
    want = reference(q.get(), k.get(), v.get(), causal=True, gqa=True, sinks=host)
    np.testing.assert_allclose(out.get(), want, rtol=1e-5, atol=2e-6)
    plain = clattn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                                path=path)
    np.testing.assert_allclose(plain.get(), reference(q.get(), k.get(), v.get(), causal=True,
                                                      gqa=True), rtol=1e-5, atol=2e-6)
    with pytest.raises(clattn.ArgumentError, match="sinks"):
        clattn.scaled_dot_product_attention(q, k, v, enable_gqa=True, sinks=host[:3])


def test_divisor_heads_need_enable_gqa(queue):
    # As torch (and the numpy path): 2 key/value heads for 8 query heads raise without
    # enable_gqa=True, also after the same layouts ran with it.
    q = clrandom.rand(queue, (2, 8, 5, 8), np.float32, a=-1, b=1)
    k = clrandom.rand(queue, (2, 2, 7, 8), np.float32, a=-1, b=1)
    v = clrandom.rand(queue, (2, 2, 7, 8), np.float32, a=-1, b=1)
    out = clattn.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    np.testing.assert_allclose(out.get(), reference(q.get(), k.get(), v.get(), gqa=True),
                               rtol=1e-5, atol=2e-6)
    with pytest.raises(clattn.ArgumentError, match="enable_gqa"):
        clattn.scaled_dot_product_attention(q, k, v, enable_gqa=False)


def test_mixed_inputs_raise(queue):
    q = clrandom.rand(queue, (1, 1, 3, 4), np.float32)
    with pytest.raises(clattn.ArgumentError, match="pyopencl"):
        clattn.scaled_dot_product_attention(q, q.get(), q)


@pytest.mark.parametrize("path", ["fused", "unfused"])
def test_repeated_calls_rebind_buffers_and_offsets(queue, path):
    # Later calls of one layout bind each array's buffer and offset: views at different
    # offsets of one device buffer (same strides) must each be read where they lie.
    base = clrandom.rand(queue, (4, 3, 19, 8), np.float32, a=-1, b=1)
    mask = (clrandom.rand(queue, (19, 19), np.float32) < 0.7).astype(np.uint8)
    host, host_mask = base.get(), mask.get().astype(bool)
    for b in range(4):
        for m in (None, mask):
            q = base[b:b + 1]
            k = base[(b + 1) % 4:(b + 1) % 4 + 1]
            out = clattn.scaled_dot_product_attention(q, k, k, attn_mask=m, path=path)
            want = reference(host[b:b + 1], host[(b + 1) % 4:(b + 1) % 4 + 1],
                             host[(b + 1) % 4:(b + 1) % 4 + 1],
                             mask=None if m is None else host_mask)
            np.testing.assert_allclose(out.get(), want, rtol=1e-5, atol=2e-6)


def test_out_of_order_queue(queue):
    props = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
    try:
        ooq = cl.CommandQueue(queue.context, properties=props)
    except cl.Error:
        pytest.skip("the device has no out-of-order queues")
    q = clrandom.rand(ooq, (1, 2, 9, 8), np.float32, a=-1, b=1)
    for _ in range(3):
        out = clattn.scaled_dot_product_attention(q, q, q, is_causal=True)
        np.testing.assert_allclose(out.get(), reference(q.get(), q.get(), q.get(), causal=True),
                                   rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("path", ["fused", "unfused"])
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("masks", ["none", "device", "host"])
def test_multihead_attention_on_device_arrays(queue, path, batch_first, masks):
    from test_modules import random_state, reference as mha_reference
    rng = np.random.default_rng(5)
    e, h, n, l, s = 16, 4, 2, 13, 7
    ctx = clattn.Context.from_pyopencl(queue)
    state = random_state(rng, e)
    mha = clattn.NumpyMultiheadAttention(e, h, batch_first=batch_first, ctx=ctx, path=path)
    mha.load_state_dict(state)
    q = clrandom.rand(queue, (n, l, e) if batch_first else (l, n, e), np.float32, a=-1, b=1)
    kv = clrandom.rand(queue, (n, s, e) if batch_first else (s, n, e), np.float32, a=-1, b=1)
    attn = padding = None
    if masks != "none":
        attn = rng.standard_normal((l, s)).astype(np.float32)
        attn[rng.random((l, s)) < 0.2] = -np.inf
        padding = np.zeros((n, s), bool)
        padding[1, -3:] = True
    if masks == "device":
        attn_d, padding_d = cla.to_device(queue, attn), cla.to_device(queue, padding)
    else:
        attn_d, padding_d = attn, padding
    need = path == "unfused"
    out, weights = mha(q, kv, kv, key_padding_mask=padding_d, attn_mask=attn_d,
                       need_weights=need, average_attn_weights=False)
    assert isinstance(out, cla.Array) and out.shape == q.shape
    qh, kvh = q.get(), kv.get()
    if not batch_first:
        qh, kvh = qh.transpose(1, 0, 2), kvh.transpose(1, 0, 2)
    want, want_w = mha_reference(state, h, qh, kvh, kvh, key_padding_mask=padding,
                                 attn_mask=attn)
    got = out.get() if batch_first else out.get().transpose(1, 0, 2)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    if need:
        np.testing.assert_allclose(weights.get(), want_w, rtol=2e-5, atol=2e-6)
    else:
        assert weights is None
    # a second call of the same layouts (the cached plan) on new data
    q2 = clrandom.rand(queue, q.shape, np.float32, a=-1, b=1)
    out2, _ = mha(q2, kv, kv, key_padding_mask=padding_d, attn_mask=attn_d, need_weights=need,
                  average_attn_weights=False)
    q2h = q2.get() if batch_first else q2.get().transpose(1, 0, 2)
    want2, _ = mha_reference(state, h, q2h, kvh, kvh, key_padding_mask=padding,
                             attn_mask=attn)
    got2 = out2.get() if batch_first else out2.get().transpose(1, 0, 2)
    np.testing.assert_allclose(got2, want2, rtol=2e-5, atol=2e-5)


def test_multihead_attention_needs_the_arrays_context(queue):
    mha = clattn.NumpyMultiheadAttention(8, 2, batch_first=True)  # the default context
    from test_modules import random_state
    mha.load_state_dict(random_state(np.random.default_rng(0), 8))
    x = clrandom.rand(queue, (1, 3, 8), np.float32)
    with pytest.raises(clattn.ArgumentError, match="from_pyopencl"):
        mha(x, x, x)


@pytest.mark.parametrize("path", ["fused", "unfused"])
def test_kv_cache_on_device_arrays(queue, path):
    # keys, values and queries made on the device (strided (B, T, H, d) views for the keys),
    # appended and attended without a host copy; compared step by step with float64
    b, hq, hkv, d, prompt, steps = 2, 4, 2, 8, 7, 3
    ctx = clattn.Context.from_pyopencl(queue)
    cache = clattn.KVCache(b, hkv, 16, d, ctx=ctx)
    keys = clrandom.rand(queue, (b, prompt + steps, hkv, d), np.float32, a=-1, b=1)
    values = clrandom.rand(queue, (b, hkv, prompt + steps, d), np.float32, a=-1, b=1)
    k_view = keys.transpose((0, 2, 1, 3))  # (B, H, T, d), strided
    kh, vh = keys.get().transpose(0, 2, 1, 3), values.get()
    cache.append(k_view[:, :, :prompt], values[:, :, :prompt])
    assert len(cache) == prompt
    for t in range(prompt, prompt + steps):
        cache.append(k_view[:, :, t:t + 1], values[:, :, t:t + 1])
        q = clrandom.rand(queue, (b, hq, 1, d), np.float32, a=-1, b=1)
        got = cache.attend(q, path=path)
        assert isinstance(got, cla.Array)
        want = reference(q.get(), kh[:, :, :t + 1], vh[:, :, :t + 1], gqa=True)
        np.testing.assert_allclose(got.get(), want, rtol=1e-5, atol=2e-6)
    with pytest.raises(clattn.ArgumentError, match="pyopencl"):
        cache.append(k_view[:, :, :1], vh[:, :, :1])
    cache.close()


@pytest.mark.parametrize("case", ["rank3", "past_mask", "short_mask", "nonpad", "scores"])
def test_onnx_attention_on_device_arrays(queue, case):
    # The device call must give what the numpy call gives (which ONNX's node tests check),
    # with its outputs left on the device as pyopencl arrays.
    rng = np.random.default_rng(11)
    b, hq, hkv, lq, lk, d, past = 2, 4, 2, 5, 7, 8, 3

    def r(*shape):
        return rng.uniform(-1, 1, shape).astype(np.float32)

    kw, args = {}, {}
    if case == "rank3":
        args = dict(Q=r(b, lq, hq * d), K=r(b, lk, hkv * d), V=r(b, lk, hkv * d))
        kw = dict(q_num_heads=hq, kv_num_heads=hkv, is_causal=1)
    else:
        args = dict(Q=r(b, hq, lq, d), K=r(b, hkv, lk, d), V=r(b, hkv, lk, d))
    total = lk
    if case in ("past_mask", "scores"):
        args.update(past_key=r(b, hkv, past, d), past_value=r(b, hkv, past, d))
        total = lk + past
    if case == "past_mask":
        args["attn_mask"] = rng.random((lq, total)) < 0.7
    if case == "short_mask":
        args["attn_mask"] = rng.standard_normal((b, 1, lq, lk - 2)).astype(np.float32)
    if case == "nonpad":
        args["nonpad_kv_seqlen"] = np.array([lk, 4], np.int64)
    if case == "scores":
        kw.update(want_qk_matmul_output=True, qk_matmul_output_mode=3)
    want = clattn.onnx_attention(**args, **kw)
    dev = {name: cla.to_device(queue, np.ascontiguousarray(a)) for name, a in args.items()}
    got = clattn.onnx_attention(**dev, **kw)
    if case == "rank3":  # Q, K, V as strided (B, H, L, d) views of (B, L, H, d) buffers
        def split(name, h, n):
            return args[name].reshape(b, n, h, d)  # (B, L, H, d), contiguous

        views = [cla.to_device(queue, split(name, h, n)).transpose((0, 2, 1, 3))
                 for name, h, n in (("Q", hq, lq), ("K", hkv, lk), ("V", hkv, lk))]
        assert not views[0].flags.c_contiguous
        got4 = clattn.onnx_attention(*views, is_causal=1)
        np.testing.assert_allclose(got4["Y"].get(), want["Y"].reshape(b, lq, hq, d)
                                   .transpose(0, 2, 1, 3), rtol=1e-6, atol=1e-6)
    assert set(got) == set(want)
    for name in want:
        assert isinstance(got[name], cla.Array), name
        np.testing.assert_allclose(got[name].get(), want[name], rtol=1e-6, atol=1e-6,
                                   err_msg=name)
