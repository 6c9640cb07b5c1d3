/*
 * common.cl: definitions shared by every clattn kernel. It is prepended to each kernel source
 * when a program is built, so it holds only macros and small inline helpers.
 *
 * Index convention: every tensor is row-major float32 in a __global buffer; the host passes a
 * base offset in elements (ulong) so that callers' sub-ranges need no sub-buffers.
 */
#ifndef CLATTN_COMMON_CL
#define CLATTN_COMMON_CL

/* The sentinel for a masked score. exp(NEG_INF - m) == 0 for any finite m. */
#define NEG_INF (-INFINITY)

/* Reduces `value` over a work-group of `size` work-items (a power of two) through `scratch`
 * (at least `size` floats of local memory). Every work-item of the group must call it; every
 * work-item gets the result. OpenCL 1.2 has no work-group collectives, hence the tree. */
inline float wg_reduce_max(__local float *scratch, float value, uint lid, uint size)
{
    scratch[lid] = value;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint span = size / 2; span > 0; span /= 2) {
        if (lid < span)
            scratch[lid] = fmax(scratch[lid], scratch[lid + span]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float result = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE); /* scratch is reused by the caller's next reduction */
    return result;
}

inline float wg_reduce_sum(__local float *scratch, float value, uint lid, uint size)
{
    scratch[lid] = value;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint span = size / 2; span > 0; span /= 2) {
        if (lid < span)
            scratch[lid] += scratch[lid + span];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float result = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return result;
}

#endif
