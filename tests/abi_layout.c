/* Prints the sizes and field offsets of the public structs the Python binding mirrors with
 * ctypes (python/clattn/_lib.py), one line per struct:
 *   NAME SIZE field=offset field=offset ...
 * tests/python/check_layout.py compares them with the ctypes classes (ctest abi_layout), so a
 * field added, moved or resized on one side only fails a test instead of corrupting calls. */
#include <stddef.h>
#include <stdio.h>

#include "clattn.h"

#define FIELD(type, field) printf(" %s=%zu", #field, offsetof(type, field))
#define BEGIN(type, name) printf("%s %zu", name, sizeof(type))
#define END() printf("\n")

int main(void)
{
    BEGIN(clattn_tensor, "Tensor");
    FIELD(clattn_tensor, mem), FIELD(clattn_tensor, offset), FIELD(clattn_tensor, dtype);
    FIELD(clattn_tensor, rank), FIELD(clattn_tensor, dims), FIELD(clattn_tensor, strides);
    END();

    BEGIN(clattn_tensors, "Tensors");
    FIELD(clattn_tensors, q), FIELD(clattn_tensors, out), FIELD(clattn_tensors, attn_mask);
    FIELD(clattn_tensors, kv_seqlen), FIELD(clattn_tensors, alibi_slopes);
    FIELD(clattn_tensors, position_ids), FIELD(clattn_tensors, score_weight);
    FIELD(clattn_tensors, block_table), FIELD(clattn_tensors, cu_seqlens_k);
    END();

    BEGIN(clattn_sdpa_desc, "SdpaDesc");
    FIELD(clattn_sdpa_desc, struct_size);
    FIELD(clattn_sdpa_desc, by_role), FIELD(clattn_sdpa_desc, num_roles);
    FIELD(clattn_sdpa_desc, causal), FIELD(clattn_sdpa_desc, scale), FIELD(clattn_sdpa_desc, norm);
    FIELD(clattn_sdpa_desc, path), FIELD(clattn_sdpa_desc, softcap);
    FIELD(clattn_sdpa_desc, window_align), FIELD(clattn_sdpa_desc, window_left);
    FIELD(clattn_sdpa_desc, window_right), FIELD(clattn_sdpa_desc, scores_mode);
    FIELD(clattn_sdpa_desc, softmax_f64), FIELD(clattn_sdpa_desc, rope);
    FIELD(clattn_sdpa_desc, rope_style), FIELD(clattn_sdpa_desc, rope_dims);
    FIELD(clattn_sdpa_desc, rope_base), FIELD(clattn_sdpa_desc, rope_start);
    FIELD(clattn_sdpa_desc, diag_offset);
    FIELD(clattn_sdpa_desc, max_seqlen_q), FIELD(clattn_sdpa_desc, max_seqlen_k);
    FIELD(clattn_sdpa_desc, dropout_p), FIELD(clattn_sdpa_desc, dropout_seed);
    FIELD(clattn_sdpa_desc, dropout_offset), FIELD(clattn_sdpa_desc, flex);
    FIELD(clattn_sdpa_desc, t5_num_buckets), FIELD(clattn_sdpa_desc, t5_max_distance);
    FIELD(clattn_sdpa_desc, t5_bidirectional), FIELD(clattn_sdpa_desc, reserved_);
    FIELD(clattn_sdpa_desc, k_scale), FIELD(clattn_sdpa_desc, v_scale);
    FIELD(clattn_sdpa_desc, kv_step);
    END();

    BEGIN(clattn_flex_desc, "FlexDesc");
    FIELD(clattn_flex_desc, source), FIELD(clattn_flex_desc, functions);
    FIELD(clattn_flex_desc, aux_names), FIELD(clattn_flex_desc, block_q);
    FIELD(clattn_flex_desc, block_k), FIELD(clattn_flex_desc, count_tiles);
    END();

    BEGIN(clattn_block_mask_desc, "BlockMaskDesc");
    FIELD(clattn_block_mask_desc, struct_size), FIELD(clattn_block_mask_desc, flex);
    FIELD(clattn_block_mask_desc, aux), FIELD(clattn_block_mask_desc, batch);
    FIELD(clattn_block_mask_desc, heads), FIELD(clattn_block_mask_desc, seq_q);
    FIELD(clattn_block_mask_desc, seq_k), FIELD(clattn_block_mask_desc, out);
    END();

    BEGIN(clattn_validation, "Validation");
    FIELD(clattn_validation, variant), FIELD(clattn_validation, unit);
    FIELD(clattn_validation, detail), FIELD(clattn_validation, result);
    FIELD(clattn_validation, max_error), FIELD(clattn_validation, tolerance);
    FIELD(clattn_validation, milliseconds);
    END();

    BEGIN(clattn_mha_desc, "MhaDesc");
    FIELD(clattn_mha_desc, struct_size);
    FIELD(clattn_mha_desc, by_role), FIELD(clattn_mha_desc, num_roles);
    FIELD(clattn_mha_desc, num_heads), FIELD(clattn_mha_desc, num_kv_heads);
    FIELD(clattn_mha_desc, layout), FIELD(clattn_mha_desc, causal), FIELD(clattn_mha_desc, scale);
    FIELD(clattn_mha_desc, norm), FIELD(clattn_mha_desc, need_weights);
    FIELD(clattn_mha_desc, path), FIELD(clattn_mha_desc, softcap);
    FIELD(clattn_mha_desc, window_align), FIELD(clattn_mha_desc, window_left);
    FIELD(clattn_mha_desc, window_right), FIELD(clattn_mha_desc, rope);
    FIELD(clattn_mha_desc, rope_style), FIELD(clattn_mha_desc, rope_dims);
    FIELD(clattn_mha_desc, rope_base), FIELD(clattn_mha_desc, rope_start);
    END();

    BEGIN(clattn_posenc_desc, "PosencDesc");
    FIELD(clattn_posenc_desc, struct_size);
    FIELD(clattn_posenc_desc, by_role), FIELD(clattn_posenc_desc, num_roles);
    FIELD(clattn_posenc_desc, kind), FIELD(clattn_posenc_desc, start);
    FIELD(clattn_posenc_desc, base);
    END();

    BEGIN(clattn_rope_desc, "RopeDesc");
    FIELD(clattn_rope_desc, struct_size);
    FIELD(clattn_rope_desc, by_role), FIELD(clattn_rope_desc, num_roles);
    FIELD(clattn_rope_desc, style), FIELD(clattn_rope_desc, rotary_dim);
    FIELD(clattn_rope_desc, base), FIELD(clattn_rope_desc, start);
    END();

    BEGIN(clattn_cascade_desc, "CascadeDesc");
    FIELD(clattn_cascade_desc, struct_size), FIELD(clattn_cascade_desc, q);
    FIELD(clattn_cascade_desc, prefix_k), FIELD(clattn_cascade_desc, prefix_v);
    FIELD(clattn_cascade_desc, k), FIELD(clattn_cascade_desc, v);
    FIELD(clattn_cascade_desc, kv_seqlen), FIELD(clattn_cascade_desc, block_table);
    FIELD(clattn_cascade_desc, out), FIELD(clattn_cascade_desc, lse);
    FIELD(clattn_cascade_desc, scale);
    END();

    BEGIN(clattn_kv_cache_desc, "KvCacheDesc");
    FIELD(clattn_kv_cache_desc, struct_size), FIELD(clattn_kv_cache_desc, batch);
    FIELD(clattn_kv_cache_desc, kv_heads), FIELD(clattn_kv_cache_desc, capacity);
    FIELD(clattn_kv_cache_desc, head_dim_qk), FIELD(clattn_kv_cache_desc, head_dim_v);
    FIELD(clattn_kv_cache_desc, dtype), FIELD(clattn_kv_cache_desc, page_size);
    FIELD(clattn_kv_cache_desc, num_pages), FIELD(clattn_kv_cache_desc, k_scale);
    FIELD(clattn_kv_cache_desc, v_scale);
    END();

    BEGIN(clattn_kv_commit_desc, "KvCommitDesc");
    FIELD(clattn_kv_commit_desc, struct_size), FIELD(clattn_kv_commit_desc, k);
    FIELD(clattn_kv_commit_desc, v), FIELD(clattn_kv_commit_desc, block_table);
    FIELD(clattn_kv_commit_desc, kv_seqlen), FIELD(clattn_kv_commit_desc, accepted);
    FIELD(clattn_kv_commit_desc, draft_len);
    END();
    return 0;
}
