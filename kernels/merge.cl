/*
 * merge.cl: two partial attention states merged by their log-sum-exp (clattn_merge_states,
 * FlashInfer's merge_state). Each side attended a disjoint set of keys of the same query row
 * and left its normalised output o_x and its natural-log log-sum-exp lse_x; for each row, with
 * m = max(lse_a, lse_b), w_x = exp(lse_x - m):
 *
 *   o = (w_a o_a + w_b o_b) / (w_a + w_b),   lse = m + log(w_a + w_b)
 *
 * which is attention over the union of the keys. A side with lse = -inf saw no key: the other
 * side is copied as it is (its values and lse bit for bit, its other side never read); both
 * empty give zeros and -inf.
 *
 * Index layout: one work-item per row, gid = (i0 * d1 + i1) * d2 + i2 over the rows' three
 * dims (the leading ones 1 for fewer), looping over the dv columns, so o may be o_a or o_b
 * (in place): a row's inputs are read before its outputs are written, and no two work-items
 * touch one row. No local memory, no barriers; items past the rows store nothing.
 *
 *   o_a, o_b, o (d0, d1, d2, dv)   lse_a, lse_b, lse (d0, d1, d2)   any strides
 *   gid 0 -> row (0, 0, 0), gid 1 -> row (0, 0, 1), ...
 *
 * Tunables: HEADS_WG work-items per work-group (tuning key heads_wg); OA_DTYPE, OB_DTYPE,
 * O_DTYPE the outputs' storage (types.cl codes).
 */
#ifndef HEADS_WG
#define HEADS_WG 256 /* work-items per work-group */
#endif
#ifndef OA_DTYPE
#define OA_DTYPE 0
#endif
#ifndef OB_DTYPE
#define OB_DTYPE 0
#endif
#ifndef O_DTYPE
#define O_DTYPE 0
#endif

__kernel __attribute__((reqd_work_group_size(HEADS_WG, 1, 1)))
void merge_states(__global const ELEM_T(OA_DTYPE) *OA, __global const float *lse_a,
                  __global const ELEM_T(OB_DTYPE) *OB, __global const float *lse_b,
                  __global ELEM_T(O_DTYPE) *O, __global float *lse,
                  const clattn_merge_states_params params)
{
    CLATTN_UNPACK(CLATTN_MERGE_STATES_PARAMS)
    const ulong gid = get_global_id(0);
    if (gid >= (ulong)d0 * d1 * d2)
        return;
    const ulong i2 = gid % d2, rest = gid / d2;
    const ulong i1 = rest % d1, i0 = rest / d1;
    const float la = lse_a[la_offset + i0 * la_s0 + i1 * la_s1 + i2 * la_s2];
    const float lb = lse_b[lb_offset + i0 * lb_s0 + i1 * lb_s1 + i2 * lb_s2];
    const ulong a_row = oa_offset + i0 * oa_s0 + i1 * oa_s1 + i2 * oa_s2;
    const ulong b_row = ob_offset + i0 * ob_s0 + i1 * ob_s1 + i2 * ob_s2;
    const ulong o_row = o_offset + i0 * o_s0 + i1 * o_s1 + i2 * o_s2;
    float merged;
    if (lb == NEG_INF || la == NEG_INF) {
        /* one side empty (or both): the other copied as it is, zeros for none */
        const bool take_a = lb == NEG_INF && la != NEG_INF;
        const bool take_b = la == NEG_INF && lb != NEG_INF;
        for (uint c = 0; c < dv; ++c) {
            const float x = take_a   ? LOAD(OA_DTYPE, OA, a_row + c * oa_s3)
                            : take_b ? LOAD(OB_DTYPE, OB, b_row + c * ob_s3)
                                     : 0.0f;
            STORE(O_DTYPE, x, O, o_row + c * o_s3);
        }
        merged = take_a ? la : take_b ? lb : NEG_INF;
    } else {
        const float m = fmax(la, lb);
        const float wa = exp(la - m), wb = exp(lb - m);
        const float sum = wa + wb;
        const float ca = wa / sum, cb = wb / sum;
        for (uint c = 0; c < dv; ++c) {
            const float xa = LOAD(OA_DTYPE, OA, a_row + c * oa_s3);
            const float xb = LOAD(OB_DTYPE, OB, b_row + c * ob_s3);
            STORE(O_DTYPE, ca * xa + cb * xb, O, o_row + c * o_s3);
        }
        merged = m + log(sum);
    }
    if (has_lse)
        lse[l_offset + i0 * l_s0 + i1 * l_s1 + i2 * l_s2] = merged;
}
