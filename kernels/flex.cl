/*
 * flex.cl: a block mask from the user's mask_mod (PyTorch's create_block_mask), on the device.
 * The host puts the user's source ahead of score.cl (host/attn/flex.c; score.cl says what the
 * functions are), built with FLEX_MASK.
 *
 *   out[b, h, qb, kb] = 0 (empty) when mask_mod keeps no (q, k) with q in query block qb
 *                       (q < seq_q) and k in key block kb (k < seq_k), 2 (full) when it keeps
 *                       every one, else 1 (partial)
 *
 * One work-item per block, numbered (b, h, qb, kb) row-major (the row of key blocks of one
 * query block are neighbours); work-items past the last block leave. A work-item stops at the
 * first pair that makes its block partial. No local memory, no barriers.
 */
__kernel void flex_block_mask(__global uchar *out, __global uchar *flex,
                              const clattn_block_mask_params params)
{
    CLATTN_UNPACK(CLATTN_BLOCK_MASK_PARAMS)
    const ulong index = get_global_id(0);
    const ulong blocks = (ulong)batch * heads * q_blocks * k_blocks;
    if (index >= blocks)
        return;
    /* (remainders as x - (x / y) * y: no LLVM `freeze` for Oclgrind) */
    const ulong row = index / k_blocks;
    const uint kb = (uint)(index - row * k_blocks);
    const ulong bh = row / q_blocks;
    const uint qb = (uint)(row - bh * q_blocks);
    const ulong b = bh / heads, h = bh - b * heads;
    const ulong4 aux = (ulong4)(aux0, aux1, aux2, aux3);
    const uint q_end = min(seq_q, (qb + 1) * block_q), k_end = min(seq_k, (kb + 1) * block_k);
    bool any = false, all = true;
    for (uint q = qb * block_q; q < q_end && (all || !any); ++q)
        for (uint k = kb * block_k; k < k_end && (all || !any); ++k) {
            const bool keep = flex_user_mask_mod((int)b, (int)h, (int)q, (int)k
                                                 FLEX_AUX_FROM(flex, aux)) != 0;
            any = any || keep;
            all = all && keep;
        }
    out[out_offset + index] = !any ? 0 : all ? 2 : 1;
}
