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
