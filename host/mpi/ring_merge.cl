/* ring_merge: folds one partial attention result into a rank's running output (ring attention,
 * mpi/ring.c). For each (batch, head, row) of the partial block, with m = max(lse, lse_p):
 *   out = (e^(lse - m) out + e^(lse_p - m) part) / (e^(lse - m) + e^(lse_p - m)),
 *   lse = m + log(e^(lse - m) + e^(lse_p - m)),
 * exact for softmax attention split over disjoint key sets. A partial row with lse_p = -inf saw
 * no key and changes nothing; a running row with lse = -inf takes the partial one as it is.
 *
 * Index layout: one work-item per partial row, gid = (batch * heads + head) * qlen + i; it
 * owns row `row0 + i` of its (batch, head) in out (rows per (batch, head): `rows`) and loops
 * over the dv columns. No local memory, no barriers: items past `count` return at once.
 *
 *   part (B*H, qlen, dv)          out (B*H, rows, dv)
 *   gid 0 .. qlen-1   ------->    rows row0 .. row0+qlen-1 of (b, h) = (0, 0)
 *   gid qlen ..       ------->    the same rows of (0, 1), ...
 *
 * Tunables: none (the host launches work-groups of 64). */
__kernel void ring_merge(__global float *out, const ulong out_offset, __global float *lse,
                         const ulong lse_offset, __global const float *part_out,
                         __global const float *part_lse, const uint rows, const uint row0,
                         const uint qlen, const uint dv, const uint count)
{
    const uint gid = get_global_id(0);
    if (gid >= count)
        return;
    const float lp = part_lse[gid];
    if (lp == -INFINITY)
        return;
    const ulong row = (ulong)(gid / qlen) * rows + row0 + gid % qlen;
    __global float *l = lse + lse_offset + row;
    const float la = *l;
    const float m = fmax(la, lp);
    const float wa = la == -INFINITY ? 0.0f : exp(la - m);
    const float wp = exp(lp - m);
    const float sum = wa + wp;
    const float ca = wa / sum, cp = wp / sum;
    __global float *o = out + out_offset + row * dv;
    __global const float *p = part_out + (ulong)gid * dv;
    for (uint c = 0; c < dv; ++c)
        o[c] = ca * o[c] + cp * p[c];
    *l = m + log(sum);
}

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
