"""One rank of test_ring.py's `mpirun -np N python ring_worker.py`: every rank draws the same
global problems, runs clattn.ring_attention on its own rows and checks them against a float64
numpy reference of the whole problem; prints "ring ok <rank> <cases>" or raises (non-zero
exit). Cases: self-attention zig-zag causal, cross-attention contiguous with uneven blocks,
bottom-right causal, a window and key padding, and float16 inputs (the ring in float16)."""
import os
import sys

# A PoCL kernel cache of each rank's own (set before the first OpenCL call): the ranks build the
# same new program variants at once, which a shared cache entry has failed (tests/check_mpi.c).
if os.environ.get("POCL_CACHE_DIR") and os.environ.get("OMPI_COMM_WORLD_RANK"):
    os.environ["POCL_CACHE_DIR"] = os.path.join(os.environ["POCL_CACHE_DIR"],
                                                "mpi-rank" + os.environ["OMPI_COMM_WORLD_RANK"])

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import clattn  # noqa: E402


def reference(q, k, v, keep, sinks=None):
    """float64 softmax attention with GQA; keep (B or 1, 1, Lq, Lk) bool; rows with no key 0;
    sinks (H,) join each row's denominator."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    s = np.where(keep, s, -np.inf)
    m = s.max(-1, keepdims=True)
    sink = None if sinks is None else np.asarray(sinks, np.float64).reshape(1, -1, 1, 1)
    if sink is not None:
        m = np.maximum(m, sink)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(keep, np.exp(s - m), 0.0)
    total = e.sum(-1, keepdims=True)
    if sink is not None:
        total = total + np.exp(sink - m)
    lse = np.where(total[..., 0] > 0, np.log(np.where(total > 0, total, 1))[..., 0] + m[..., 0],
                   -np.inf)
    return np.where(total > 0, e / np.where(total > 0, total, 1), 0) @ v, lse


def rows_of(layout, seq, ranks, rank):
    """The rows (a list of global indices) a rank holds, as clattn_mpi.h's layouts say."""
    if layout == "zigzag":
        chunks, base, extra = 2 * ranks, seq // (2 * ranks), seq % (2 * ranks)
        starts = [c * base + min(c, extra) for c in range(chunks + 1)]
        mine = [rank, chunks - 1 - rank]
        return [i for c in mine for i in range(starts[c], starts[c + 1])]
    weights = [r % 3 + 1 for r in range(ranks)]  # uneven blocks
    before, total = sum(weights[:rank]), sum(weights)
    return list(range(seq * before // total, seq * (before + weights[rank]) // total))


def main():
    comm = MPI.COMM_WORLD
    rank, ranks = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(2806)
    cases = [
        # B, H, Hkv, Lq, Lk, layout, causal, align, window, padding, dtype, sinks
        (2, 4, 2, 29, 29, "zigzag", True, "top-left", None, False, np.float32, True),
        (1, 2, 1, 13, 37, "contiguous", True, "bottom-right", (5, -1), True, np.float32, False),
        (2, 2, 2, 11, 19, "contiguous", False, "top-left", None, False, np.float16, False),
    ]
    for n, (B, H, Hkv, Lq, Lk, layout, causal, align, window, padding, dtype,
            with_sinks) in enumerate(cases):
        q = rng.uniform(-1, 1, (B, H, Lq, 16)).astype(dtype)
        k = rng.uniform(-1, 1, (B, Hkv, Lk, 16)).astype(dtype)
        v = rng.uniform(-1, 1, (B, Hkv, Lk, 8)).astype(dtype)
        pad = rng.random((B, Lk)) < 0.3 if padding else None
        i = np.arange(Lq)[:, None] + (Lk - Lq if align == "bottom-right" else 0)
        j = np.arange(Lk)[None, :]
        keep = np.ones((Lq, Lk), bool)
        if causal:
            keep &= j <= i
        if window is not None:
            keep &= j >= i - window[0]
        keep = keep[None, None]
        if pad is not None:
            keep = keep & ~pad[:, None, None, :]
        sinks = np.linspace(-1, 2, H).astype(np.float32) if with_sinks else None
        want, want_lse = reference(q, k, v, keep, sinks)
        qr, kr = rows_of(layout, Lq, ranks, rank), rows_of(layout, Lk, ranks, rank)
        out, lse = clattn.ring_attention(
            q[:, :, qr], k[:, :, kr], v[:, :, kr], comm, layout_name=layout, seq_len=Lq,
            kv_seq_len=Lk, causal=causal, causal_align=align, window=window,
            key_padding=None if pad is None else pad[:, kr], sinks=sinks, return_lse=True)
        tol = 2e-3 if dtype == np.float16 else 1e-5
        assert out.dtype == dtype and out.shape == (B, H, len(qr), 8), (n, out.dtype, out.shape)
        np.testing.assert_allclose(out.astype(np.float64), want[:, :, qr], rtol=tol, atol=tol,
                                   err_msg=f"case {n} rank {rank}")
        finite = np.isfinite(want_lse[:, :, qr])
        assert np.array_equal(np.isfinite(lse), finite), (n, "lse -inf rows")
        np.testing.assert_allclose(lse[finite], want_lse[:, :, qr][finite], rtol=1e-4, atol=1e-4)
    # a bad argument on one rank raises on every rank (none left waiting)
    bad = 3 if rank == 0 else 2
    try:
        clattn.ring_attention(np.zeros((1, bad, 4, 8), np.float32), np.zeros((1, 1, 4, 8), np.float32),
                              np.zeros((1, 1, 4, 8), np.float32), comm)
        raise AssertionError("a desc differing between ranks was accepted")
    except clattn.Error as e:
        assert "heads" in str(e) or "rank 0" in str(e), str(e)
    print(f"ring ok {rank} {len(cases)}", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
