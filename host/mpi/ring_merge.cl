/* ring_merge.cl: the ring's own steps after its merges (ring attention, mpi/ring.c). Each
 * partial block is folded into a rank's running output and log-sum-exp by the library's
 * clattn_merge_states (kernels/merge.cl: for each row, with m = max(lse, lse_p),
 * out = (e^(lse - m) out + e^(lse_p - m) part) / (e^(lse - m) + e^(lse_p - m)),
 * lse = m + log(e^(lse - m) + e^(lse_p - m)), in place); what is left here is the store into a
 * 16-bit out and the attention sinks.
 *
 * Index layout: one work-item per element (ring_store) or per row (ring_sink), gid counting
 * the packed (batch, head, row[, col]) order. No local memory, no barriers: items past
 * `count` return at once. Tunables: none (the host launches work-groups of 64). */

/* A 16-bit out from the float32 running output (clattn_ring_desc.dtype F16 or BF16), rounded to
 * nearest even once: F16 through vstore_half_rte (core OpenCL, no cl_khr_fp16 needed), BF16 by
 * rounding the float's bits (NaN kept a quiet NaN). */
__kernel void ring_store(__global const float *acc, __global ushort *out, const ulong out_offset,
                         const uint count, const int bf16)
{
    const uint gid = get_global_id(0);
    if (gid >= count)
        return;
    const float x = acc[gid];
    if (!bf16) {
        vstore_half_rte(x, 0, (__global half *)(out + out_offset + gid));
        return;
    }
    const uint bits = as_uint(x);
    const bool nan = (bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0u;
    out[out_offset + gid] =
        nan ? (ushort)((bits >> 16) | 0x0040u) : (ushort)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

/* Attention sinks (clattn_ring_set_sinks): one logit s per query head joins every row's
 * softmax denominator once, after the last merge: lse' = log(e^lse + e^s) and out *= e^(lse -
 * lse') (a row with no visible key stays zeros, its lse becomes s). One work-item per row of
 * (batch, heads, rows); s = -inf is no sink. */
__kernel void ring_sink(__global float *out, const ulong out_offset, __global float *lse,
                        const ulong lse_offset, __global const float *sinks,
                        const ulong sinks_offset, const ulong sinks_stride, const uint heads,
                        const uint rows, const uint dv, const uint count)
{
    const uint gid = get_global_id(0);
    if (gid >= count)
        return;
    const uint head = (gid / rows) % heads;
    const float s = sinks[sinks_offset + head * sinks_stride];
    if (s == -INFINITY)
        return;
    __global float *l = lse + lse_offset + gid;
    const float la = *l;
    const float m = fmax(la, s);
    const float wa = la == -INFINITY ? 0.0f : exp(la - m);
    const float sum = wa + exp(s - m);
    const float scale = wa / sum;
    __global float *o = out + out_offset + (ulong)gid * dv;
    for (uint c = 0; c < dv; ++c)
        o[c] *= scale;
    *l = m + log(sum);
}
