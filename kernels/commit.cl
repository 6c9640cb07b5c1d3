/*
 * commit.cl: speculative decoding's commit (clattn_kv_commit). After a verification step
 * wrote the draft tokens' keys and values after each sequence's committed keys (draft token t
 * of sequence b at key lengths[b] + t), the accepted path's rows move down to follow the
 * committed keys and the key counts grow by the path's length:
 *
 *   for i = 0, 1, .. while entry i of accepted[b, :] is valid:
 *       row lengths[b] + i  <-  row lengths[b] + accepted[b, i]       (kv_commit)
 *   lengths[b] += the number of valid entries                          (kv_commit_lengths)
 *
 * An entry is valid while it is above the one before it (the first: >= 0), below draft_len,
 * and both rows lie in the cache (paged: in a page of the pool): the list ends at the first
 * entry that is not. Because the entries rise, every row is read before any later step of the
 * same sequence writes it (the destination lengths[b] + i is never a later source), so the
 * moves run in place, in order, with no scratch.
 *
 * Rows are moved as bytes (any storage type: float, 16-bit, block-quantized, 8-bit): the host
 * gives byte offsets, strides and row lengths. Work-item (c, 2h + s, b) moves byte c of head h's
 * rows of sequence b in the keys (s = 0) or values (s = 1), through all the entries in order;
 * no two work-items touch the same byte, so there is no barrier and no local memory.
 *
 *   dim 0: bytes of a row (rounded up to COMMIT_WG)   dim 1: 2 x heads   dim 2: batch
 *
 * Tunable: COMMIT_WG (work-items per group along the row). COMMIT_PAGED: the caches are pools
 * (pages, page_size, heads, row) read through table (batch, blocks); else (batch, heads,
 * capacity, row).
 */
#ifndef COMMIT_WG
#define COMMIT_WG 64 /* work-items per work-group, along a row's bytes */
#endif
#ifndef COMMIT_PAGED
#define COMMIT_PAGED 0
#endif

/* The byte offset of key `pos` of sequence b and head h in a cache of byte strides s0, s1, s2
 * from `offset`, or -1 when it lies outside (past capacity, or in no page of the pool). */
inline long commit_row(const clattn_commit_params p, __global const int *table,
                       const ulong offset, const ulong s0, const ulong s1, const ulong s2,
                       const uint b, const uint h, const ulong pos)
{
    if (pos >= p.capacity)
        return -1;
#if COMMIT_PAGED
    const ulong block = pos / p.page_size;
    const int page = table[p.bt_offset + b * p.bt_s0 + block];
    if (page < 0 || (uint)page >= p.num_pages)
        return -1;
    return (long)(offset + (ulong)page * s0 + (pos - block * p.page_size) * s1 + h * s2);
#else
    return (long)(offset + b * s0 + h * s1 + pos * s2);
#endif
}

/* Entry i of sequence b's accepted list, or -1 where the list has ended: not above `prev`, not
 * below draft_len, or a row outside the cache (checked in the keys' cache: both caches have
 * the same pages and capacity). */
inline int commit_entry(const clattn_commit_params p, __global const int *table,
                        __global const int *accepted, const uint b, const uint i,
                        const int prev, const ulong base)
{
    const int t = accepted[p.acc_offset + b * p.acc_s0 + i * p.acc_s1];
    if (t <= prev || (uint)t >= p.draft_len)
        return -1;
    if (commit_row(p, table, 0, p.k_s0, p.k_s1, p.k_s2, b, 0, base + (ulong)t) < 0 ||
        commit_row(p, table, 0, p.k_s0, p.k_s1, p.k_s2, b, 0, base + i) < 0)
        return -1;
    return t;
}

__kernel __attribute__((reqd_work_group_size(COMMIT_WG, 1, 1)))
void kv_commit(__global const int *table, __global const int *accepted,
               __global const int *lengths, __global uchar *k, __global uchar *v,
               const clattn_commit_params params)
{
    const clattn_commit_params p = params;
    const uint c = get_global_id(0), b = get_global_id(2);
    const bool values = (get_global_id(1) & 1) != 0;
    const uint h = get_global_id(1) >> 1;
    const int length = lengths[p.len_offset + b * p.len_s0];
    if (c >= (values ? p.v_row : p.k_row) || length < 0)
        return;
    __global uchar *mem = values ? v : k;
    const ulong offset = values ? p.v_offset : p.k_offset;
    const ulong s0 = values ? p.v_s0 : p.k_s0, s1 = values ? p.v_s1 : p.k_s1;
    const ulong s2 = values ? p.v_s2 : p.k_s2;
    int prev = -1;
    for (uint i = 0; i < p.max_accepted; ++i) {
        const int t = commit_entry(p, table, accepted, b, i, prev, (ulong)length);
        if (t < 0)
            break;
        prev = t;
        if ((uint)t == i)
            continue; /* already in place */
        const long from = commit_row(p, table, offset, s0, s1, s2, b, h, (ulong)length + t);
        const long to = commit_row(p, table, offset, s0, s1, s2, b, h, (ulong)length + i);
        mem[to + c] = mem[from + c];
    }
}

/* One work-item per sequence, after kv_commit: the key count grows by the valid entries. */
__kernel void kv_commit_lengths(__global const int *table, __global const int *accepted,
                                __global int *lengths, const clattn_commit_params params)
{
    const clattn_commit_params p = params;
    const uint b = get_global_id(0);
    if (b >= p.batch)
        return;
    const int length = lengths[p.len_offset + b * p.len_s0];
    if (length < 0)
        return;
    int prev = -1;
    uint count = 0;
    while (count < p.max_accepted) {
        const int t = commit_entry(p, table, accepted, b, count, prev, (ulong)length);
        if (t < 0)
            break;
        prev = t;
        ++count;
    }
    lengths[p.len_offset + b * p.len_s0] = length + (int)count;
}
