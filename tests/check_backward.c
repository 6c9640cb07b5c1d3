/* The attention backward (clattn_sdpa_backward_plan_create): dQ, dK, dV, a float mask's
 * gradient and the sinks' against the float64 reference (ref_sdpa_backward) on fresh random
 * problems at awkward sizes, every gradient buffer poisoned (NaN) first; the forward that
 * feeds it (out, lse) runs through clattn on the same buffers. Cases: a table of the score
 * rule's features one or a few at a time (causal alignments, windows, kv_seqlen, GQA, masks
 * of every rank with their gradient, key padding, softcap, ALiBi, relu, sinks with their
 * gradient, 16-bit storage, strided views), then random problems drawn over all of them
 * together (pb_sdpa_random_spec), then the refusals. The reference itself is checked against
 * central differences of the float64 forward. */
#include "problems.h"
#include "reference.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One problem: its spec, plus which gradients of the masks to ask for. */
typedef struct bwd_case {
    pb_sdpa_spec spec;
    int grad_mask, grad_sinks;
} bwd_case;

/* The path the backward plans of run_case take (test_backward_unfused sets it). */
static clattn_path backward_path_ = CLATTN_PATH_FUSED;
static int has_fp64_;
/* When set: the backward plan's info must hold it where it runs the CPU variant
 * (test_backward_key_blocks). */
static const char *expect_cpu_info_;

/* Whether a tensor's last dim (head_dim) has a stride other than 1. */
static int head_dim_strided(const clattn_tensor *t)
{
    size_t strides[CLATTN_MAX_RANK];
    pb_tensor_strides(t, strides);
    return t->rank > 0 && strides[t->rank - 1] != 1;
}

/* Runs the forward (out, lse) and the backward of `c` on ctx and checks every gradient. */
static void run_case(clattn_ctx *ctx, const bwd_case *c)
{
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &c->spec);
    tu_set_case("backward: %s grad_mask=%d grad_sinks=%d", p.label, c->grad_mask, c->grad_sinks);
    const pb_sdpa_spec *s = &p.spec;
    /* (packed sequences: the packed rows' counts) */
    const size_t q_count = p.q_count, k_count = p.k_count, v_count = p.v_count;
    const size_t o_count = p.out_count;
    const int want_mask = c->grad_mask && p.mask != NULL && s->mask == PB_MASK_FLOAT;
    const int want_sinks = c->grad_sinks && p.sinks != NULL;

    clattn_tensors bound;
    clattn_plan *forward = NULL, *backward = NULL;
    float *grad_out = tu_random_floats(o_count);
    pb_round_array(s->out_dtype, grad_out, o_count);
    if (pb_sdpa_upload(ctx, &p, &bound) != CL_SUCCESS)
        goto done;
    clattn_sdpa_desc desc;
    pb_sdpa_desc(&p, &desc);
    if (!tu_expect_status(clattn_sdpa_plan_create(ctx, &desc, &forward), CLATTN_SUCCESS,
                          "forward plan") ||
        !tu_expect_status(clattn_plan_execute(forward, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL,
                                              0, NULL, NULL),
                          CLATTN_SUCCESS, "forward") ||
        !pb_sdpa_check(ctx, NULL, &p, &bound))
        goto done;
    /* dO with out's dtype and layout; the gradients with their inputs', poisoned */
    if (pb_sdpa_upload_gradients(ctx, &p, grad_out, want_mask, want_sinks, &bound) !=
        CL_SUCCESS)
        goto done;
    CLATTN_BIND_ROLES(desc, bound); /* the layouts, now with the gradients' */
    desc.path = backward_path_;
    /* the unfused path's matmuls read rows: head_dim strided q, k, v or dO are refused */
    const int unfused_refuses =
        backward_path_ == CLATTN_PATH_UNFUSED &&
        (head_dim_strided(&bound.q) || head_dim_strided(&bound.k) ||
         head_dim_strided(&bound.v) || head_dim_strided(&bound.grad_out));
    if (!tu_expect_status(clattn_sdpa_backward_plan_create(ctx, &desc, &backward),
                          unfused_refuses ? CLATTN_ERR_UNSUPPORTED : CLATTN_SUCCESS,
                          "backward plan") ||
        unfused_refuses)
        goto done;
    if (backward_path_ != CLATTN_PATH_FUSED)
        tu_expect(strstr(clattn_plan_info(backward), "unfused") != NULL,
                  "the backward runs unfused: %s", clattn_plan_info(backward));
    if (expect_cpu_info_ && strstr(clattn_plan_info(backward), "CPU variant"))
        tu_expect(strstr(clattn_plan_info(backward), expect_cpu_info_) != NULL,
                  "the backward's plan lacks '%s': %s", expect_cpu_info_,
                  clattn_plan_info(backward));
    float *first[5] = {NULL, NULL, NULL, NULL, NULL}; /* the first run's gradients */
    for (int run = 0; run < 2 && !tu_failed(); ++run) { /* twice: the workspace is reused */
        if (run == 1) {
            /* the forward again on the same tensors, the gradients' roles (last) left out */
            tu_forward_again(ctx, forward, &bound, "forward, the gradients' roles left out");
            clattn_tensor *grads[5] = {&bound.grad_q, &bound.grad_k, &bound.grad_v,
                                       &bound.grad_attn_mask, &bound.grad_sinks};
            for (int i = 0; i < 5; ++i)
                if (grads[i]->mem != NULL)
                    pb_rewrite(ctx, NULL, grads[i], NULL);
        }
        if (!tu_expect_status(clattn_plan_execute(backward, bound.by_role, CLATTN_ROLE_COUNT,
                                                  NULL, NULL, 0, NULL, NULL),
                              CLATTN_SUCCESS, "backward"))
            break;
        double *dq = tu_doubles(q_count), *dk = tu_doubles(k_count), *dv = tu_doubles(v_count);
        double *dscores = tu_doubles(s->batch * s->heads * s->seq_q * s->seq_k);
        double *dsinks = tu_doubles(s->heads);
        /* the forward's out as stored (delta = dO . out reads it) */
        float *out = tu_floats(o_count);
        pb_download(ctx, NULL, &bound.out, out, NULL);
        pb_sdpa_backward_reference(&p, grad_out, out, 0, dq, dk, dv, dscores, dsinks);
        /* 16-bit storage: the inputs are exact (rounded), but out (in D = dO . out) and the
         * gradients are rounded once more */
        const int half = s->q_dtype != CLATTN_DTYPE_F32 || s->k_dtype != CLATTN_DTYPE_F32 ||
                         s->v_dtype != CLATTN_DTYPE_F32 || s->out_dtype != CLATTN_DTYPE_F32;
        const double tol = half ? 2e-2 : 2e-4;
        struct {
            const char *name;
            clattn_tensor *t;
            const double *ref;
            size_t count;
        } checks[5] = {{"grad_q", &bound.grad_q, dq, q_count},
                       {"grad_k", &bound.grad_k, dk, k_count},
                       {"grad_v", &bound.grad_v, dv, v_count},
                       {"grad_attn_mask", &bound.grad_attn_mask, NULL, p.mask_count},
                       {"grad_sinks", &bound.grad_sinks, dsinks, s->heads}};
        double *mask_ref = NULL;
        if (want_mask) {
            mask_ref = tu_doubles(p.mask_count);
            pb_reduce_to_mask(&p, dscores, mask_ref);
            checks[3].ref = mask_ref;
        }
        /* Each gradient's error scale: the same sums over the terms' magnitudes (relu's
         * 1 / normaliser amplifies rounding; a broadcast mask's and a sink's sums cancel) */
        double scales[5] = {0.0, 0.0, 0.0, 0.0, 0.0};
        {
            double *mq = tu_doubles(q_count), *mk = tu_doubles(k_count);
            double *mv = tu_doubles(v_count);
            double *ms = tu_doubles(s->batch * s->heads * s->seq_q * s->seq_k);
            double *msinks = tu_doubles(s->heads);
            double *mmask = tu_doubles(p.mask_count ? p.mask_count : 1);
            pb_sdpa_backward_reference(&p, grad_out, out, 1, mq, mk, mv, ms, msinks);
            if (want_mask)
                pb_reduce_to_mask(&p, ms, mmask);
            const double *m[5] = {mq, mk, mv, mmask, msinks};
            for (int i = 0; i < 5; ++i)
                for (size_t x = 0; x < checks[i].count && (i != 3 || want_mask); ++x)
                    scales[i] = fmax(scales[i], m[i][x]);
            free(mmask);
            free(msinks);
            free(ms);
            free(mv);
            free(mk);
            free(mq);
        }
        for (int i = 0; i < 5; ++i) {
            if (checks[i].t->mem == NULL)
                continue;
            float *got = tu_floats(checks[i].count);
            size_t stray = 0;
            if (pb_download(ctx, NULL, checks[i].t, got, &stray) == CL_SUCCESS) {
                tu_expect(stray == 0, "%s: %zu stray writes outside it", checks[i].name, stray);
                tu_expect_finite(checks[i].name, got, checks[i].count);
                tu_expect_close_scaled(checks[i].name, got, checks[i].ref, checks[i].count,
                                    scales[i],
                                    checks[i].t->dtype == CLATTN_DTYPE_F32 && !half ? tol
                                                                                  : 3e-2);
                /* deterministic: no atomics, a fixed order, so the rerun gives the same bits */
                if (run == 0) {
                    first[i] = got;
                    got = NULL;
                } else if (first[i] != NULL) {
                    tu_expect(memcmp(first[i], got, checks[i].count * sizeof(float)) == 0,
                              "%s: the rerun's bits differ from the first run's (the backward "
                              "is deterministic)",
                              checks[i].name);
                }
            }
            free(got);
        }
        free(mask_ref);
        free(out);
        free(dsinks);
        free(dscores);
        free(dv);
        free(dk);
        free(dq);
    }
    for (int i = 0; i < 5; ++i)
        free(first[i]);
done:
    clattn_plan_release(backward);
    clattn_plan_release(forward);
    pb_release_tensors(&bound);
    free(grad_out);
    pb_sdpa_free(&p);
}

static pb_sdpa_spec base_spec(size_t batch, size_t heads, size_t kv_heads, size_t seq_q,
                              size_t seq_k, size_t dk, size_t dv)
{
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    spec.batch = batch, spec.heads = heads, spec.kv_heads = kv_heads;
    spec.seq_q = seq_q, spec.seq_k = seq_k, spec.dk = dk, spec.dv = dv;
    spec.want_lse = 1;
    spec.path = CLATTN_PATH_FUSED;
    spec.q_gain = 2.0f;
    return spec;
}

enum { CASES = 21 };

/* Dropout's fields on a spec (the backward regenerates the forward's mask from them). */
static void with_dropout(pb_sdpa_spec *s, double p, uint64_t seed, uint64_t offset)
{
    s->dropout_p = p;
    s->dropout_seed = seed;
    s->dropout_offset = offset;
}

static bwd_case make_case(int i)
{
    bwd_case c = {.grad_mask = 0, .grad_sinks = 0};
    pb_sdpa_spec *s = &c.spec;
    switch (i) {
    case 0: /* one row, one key */
        *s = base_spec(1, 1, 0, 1, 1, 1, 1);
        break;
    case 1: /* plain, awkward sizes, Lq != Lk */
        *s = base_spec(2, 3, 0, 17, 65, 16, 8);
        break;
    case 2: /* causal top-left, head sizes 63 / 65 */
        *s = base_spec(1, 2, 0, 33, 33, 63, 65);
        s->causal = CLATTN_CAUSAL_TOP_LEFT;
        break;
    case 3: /* causal bottom-right, GQA 4:1 */
        *s = base_spec(2, 4, 1, 7, 129, 32, 32);
        s->causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
        break;
    case 4: /* a float mask (Lq, Lk), broadcast over batch and heads, with its gradient */
        *s = base_spec(2, 3, 0, 13, 31, 8, 8);
        s->mask = PB_MASK_FLOAT;
        s->mask_rank = 2;
        c.grad_mask = 1;
        break;
    case 5: /* a rank-4 F16 mask broadcast over heads and rows, its gradient; key padding */
        *s = base_spec(3, 2, 0, 9, 17, 16, 4);
        s->mask = PB_MASK_FLOAT;
        s->mask_dtype = CLATTN_DTYPE_F16;
        s->mask_rank = 4;
        s->mask_ones = PB_MASK_ONES_H | PB_MASK_ONES_LQ;
        s->padding = 1;
        c.grad_mask = 1;
        break;
    case 6: /* a bool mask (rank 3), a sliding window */
        *s = base_spec(1, 3, 0, 40, 40, 16, 16);
        s->mask = PB_MASK_BOOL;
        s->mask_rank = 3;
        s->window_align = CLATTN_CAUSAL_TOP_LEFT;
        s->window_left = 5, s->window_right = 2;
        break;
    case 7: /* kv_seqlen, ONNX's causal rule */
        *s = base_spec(3, 2, 0, 5, 47, 24, 24);
        s->kv_len = 1;
        s->causal = CLATTN_CAUSAL_ONNX;
        break;
    case 8: /* softcap and ALiBi (B, H) */
        *s = base_spec(2, 2, 0, 19, 23, 32, 16);
        s->softcap = 2.5f;
        s->alibi = 2;
        s->causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
        break;
    case 9: /* relu normalisation with a float mask and its gradient (d = 16: the CPU variant,
             * whose dropped lanes once gave relu 0 * -inf) */
        *s = base_spec(1, 2, 0, 11, 29, 16, 16);
        s->norm = CLATTN_NORM_RELU;
        s->mask = PB_MASK_FLOAT;
        s->mask_rank = 4;
        c.grad_mask = 1;
        break;
    case 10: /* sinks with their gradient, GQA 3:1, a rank-1 mask */
        *s = base_spec(2, 6, 2, 10, 37, 16, 16);
        s->sinks = 1;
        s->mask = PB_MASK_FLOAT;
        s->mask_rank = 1;
        c.grad_sinks = 1;
        c.grad_mask = 1;
        break;
    case 11: /* F16 storage everywhere, strided and padded layouts */
        *s = base_spec(2, 2, 0, 21, 18, 16, 16);
        s->q_dtype = s->k_dtype = s->v_dtype = s->out_dtype = CLATTN_DTYPE_F16;
        s->q_layout = PB_SEQ_MAJOR, s->k_layout = PB_PADDED, s->v_layout = PB_STRIDED_LAST;
        s->out_layout = PB_SEQ_MAJOR_PADDED;
        break;
    case 12: /* BF16 storage, causal, sinks */
        *s = base_spec(1, 4, 2, 16, 16, 32, 32);
        s->q_dtype = s->k_dtype = s->v_dtype = s->out_dtype = CLATTN_DTYPE_BF16;
        s->causal = CLATTN_CAUSAL_TOP_LEFT;
        s->sinks = 1;
        c.grad_sinks = 1;
        break;
    case 13: /* a fully masked row (every key of query 0), sinks */
        *s = base_spec(2, 2, 0, 6, 9, 8, 8);
        s->fully_masked = 2;
        s->sinks = 1;
        c.grad_sinks = 1;
        c.grad_mask = 1;
        break;
    case 14: /* a decode row against many keys, GQA 8:1, d = 128 */
        *s = base_spec(1, 8, 1, 1, 257, 128, 128);
        s->causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
        break;
    case 16: /* dropout: GQA 2:1, causal bottom-right, d = 16 (the CPU variants), Lk = 70 */
        *s = base_spec(2, 4, 2, 33, 70, 16, 16);
        s->causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
        with_dropout(s, 0.3, 0x0123456789abcdefull, 0);
        break;
    case 17: /* dropout with relu, a float mask and its gradient, key counts; d = 24 (the
              * generic kernels) */
        *s = base_spec(2, 2, 0, 19, 45, 24, 24);
        s->norm = CLATTN_NORM_RELU;
        s->mask = PB_MASK_FLOAT;
        s->mask_rank = 3;
        s->kv_len = 1;
        c.grad_mask = 1;
        with_dropout(s, 0.5, 77, 1000);
        break;
    case 18: /* dropout with sinks and their gradient, softcap, key padding, d = 64 */
        *s = base_spec(1, 3, 0, 65, 129, 64, 64);
        s->sinks = 1;
        s->softcap = 3.0f;
        s->padding = 1;
        c.grad_sinks = 1;
        with_dropout(s, 0.2, 0xfffffffffffffff1ull, 0xfffffffffffffff0ull);
        break;
    case 19: /* dropout_p = 1: every weight dropped, out and the gradients of q, k, v zero */
        *s = base_spec(1, 2, 0, 9, 17, 16, 8);
        with_dropout(s, 1.0, 5, 0);
        break;
    case 20: /* the GPU backward's edges (flash_bwd_gpu.cl): d = 128, where its tiles shrink to
              * fit the local memory (Oclgrind's 32 KiB: 16 keys, 8 rows); GQA 2:1, causal
              * top-left, 37 rows over 35 keys (partial key blocks and row tiles, a last tile of
              * rows that is not a multiple of 4) */
        *s = base_spec(1, 2, 1, 37, 35, 128, 128);
        s->causal = CLATTN_CAUSAL_TOP_LEFT;
        break;
    default: /* a larger prefill: 127 x 127 at d = 64, causal, a window */
        *s = base_spec(1, 2, 0, 127, 127, 64, 64);
        s->causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
        s->window_align = CLATTN_CAUSAL_BOTTOM_RIGHT;
        s->window_left = 31, s->window_right = 0;
        break;
    }
    return c;
}

START_TEST(test_backward_cases)
{
    TU_BEGIN_TEST();
    const bwd_case c = make_case(_i);
    run_case(tu_ctx(), &c);
    TU_END_TEST();
}
END_TEST

/* The cases on the unfused reference path: where q, k, v and out are rows (head_dim stride 1)
 * and the sinks' gradient (which needs lse) is not asked for, the forward runs unfused too
 * (every other case in double, where the device has it) without lse and the backward on AUTO
 * takes the unfused path for want of lse; otherwise the forward is fused and the backward
 * asks for UNFUSED (refused where head_dim is strided). */
START_TEST(test_backward_unfused)
{
    TU_BEGIN_TEST();
    bwd_case c = make_case(_i);
    pb_sdpa_spec *s = &c.spec;
    const int rows = s->q_layout == PB_PACKED && s->k_layout == PB_PACKED &&
                     s->v_layout == PB_PACKED && s->out_layout == PB_PACKED;
    if (rows && !c.grad_sinks) {
        s->path = CLATTN_PATH_UNFUSED;
        s->want_lse = 0;
        s->softmax_f64 = has_fp64_ && _i % 2 == 1;
        backward_path_ = CLATTN_PATH_AUTO;
    } else {
        backward_path_ = CLATTN_PATH_UNFUSED;
    }
    run_case(tu_ctx(), &c);
    backward_path_ = CLATTN_PATH_FUSED;
    TU_END_TEST();
}
END_TEST

/* Packed variable-length batches (cu_seqlens_q/_k): sequences of their own lengths packed
 * without padding (pb_sdpa_spec.varlen; 2: one sequence without query rows, another without
 * keys), q, k, v, out, dO and the gradients rank 3 over the packed rows, lse (H, total_q); the
 * reference runs each sequence alone. Head sizes of 16s take the CPU variants (bwd_dkdv_cpu,
 * bwd_dq_cpu) where the tuning is the CPU's, the others the generic kernels. */
enum { VARLEN_CASES = 9 };

static bwd_case make_varlen_case(int i)
{
    bwd_case c = {.grad_mask = 0, .grad_sinks = 0};
    pb_sdpa_spec *s = &c.spec;
    switch (i) {
    case 0: /* plain, d = 16, an empty sequence of each kind */
        *s = base_spec(4, 2, 0, 17, 17, 16, 16);
        break;
    case 1: /* GQA 4:1, causal bottom-right, Lq != Lk, d = 24 (generic) */
        *s = base_spec(3, 4, 1, 7, 65, 24, 24);
        s->causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
        break;
    case 2: /* sinks with their gradient, GQA 3:1, causal top-left, Lk = 63 */
        *s = base_spec(5, 6, 2, 33, 63, 16, 16);
        s->sinks = 1;
        s->causal = CLATTN_CAUSAL_TOP_LEFT;
        c.grad_sinks = 1;
        break;
    case 3: /* a sliding window (bottom-right), ALiBi (B, H), softcap; d = 32 / 16 */
        *s = base_spec(3, 2, 0, 40, 40, 32, 16);
        s->window_align = CLATTN_CAUSAL_BOTTOM_RIGHT;
        s->window_left = 5, s->window_right = 2;
        s->alibi = 2;
        s->softcap = 2.5f;
        break;
    case 4: /* F16 storage, strided and padded layouts, Lq > Lk, causal bottom-right, MQA */
        *s = base_spec(3, 2, 1, 29, 13, 16, 16);
        s->q_dtype = s->k_dtype = s->v_dtype = s->out_dtype = CLATTN_DTYPE_F16;
        s->q_layout = PB_PADDED, s->k_layout = PB_PADDED, s->v_layout = PB_STRIDED_LAST;
        s->out_layout = PB_PADDED;
        s->causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
        break;
    case 5: /* decode rows (Lq = 1) against 129 keys, head sizes 1 and 3, relu */
        *s = base_spec(2, 3, 0, 1, 129, 1, 3);
        s->norm = CLATTN_NORM_RELU;
        break;
    case 6: /* d = 64, BF16 q and k, causal bottom-right, sinks (their gradient), ALiBi (H) */
        *s = base_spec(4, 2, 0, 65, 65, 64, 64);
        s->q_dtype = s->k_dtype = CLATTN_DTYPE_BF16;
        s->causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
        s->sinks = 1;
        s->alibi = 1;
        c.grad_sinks = 1;
        break;
    case 7: /* one sequence (batch 1), three rows and keys, d = 8 */
        *s = base_spec(1, 1, 0, 3, 3, 8, 8);
        break;
    default: /* ONNX's causal rule (bottom-right per sequence), relu with softcap, d = 17 / 9 */
        *s = base_spec(3, 2, 0, 17, 17, 17, 9);
        s->causal = CLATTN_CAUSAL_ONNX;
        s->norm = CLATTN_NORM_RELU;
        s->softcap = 3.0f;
        break;
    }
    s->varlen = s->batch >= 3 ? 2 : 1;
    return c;
}

START_TEST(test_backward_varlen)
{
    TU_BEGIN_TEST();
    const bwd_case c = make_varlen_case(_i);
    run_case(tu_ctx(), &c);
    TU_END_TEST();
}
END_TEST

/* The refusal tests' base: the gradients' F32 packed layouts (rank `rank`: q's, k's (and v's)
 * and out's dims) added to t, the descriptor over t, and the base problem accepted. */
static clattn_sdpa_desc refusal_base(clattn_ctx *ctx, const pb_sdpa_problem *p, clattn_tensors *t,
                                     int rank, const size_t *q_dims, const size_t *k_dims,
                                     const size_t *o_dims, const char *what)
{
    pb_make_layout(&t->grad_out, CLATTN_DTYPE_F32, rank, o_dims, PB_PACKED);
    pb_make_layout(&t->grad_q, CLATTN_DTYPE_F32, rank, q_dims, PB_PACKED);
    pb_make_layout(&t->grad_k, CLATTN_DTYPE_F32, rank, k_dims, PB_PACKED);
    pb_make_layout(&t->grad_v, CLATTN_DTYPE_F32, rank, k_dims, PB_PACKED);
    clattn_sdpa_desc desc;
    pb_sdpa_desc(p, &desc);
    desc.by_role = t->by_role;
    desc.num_roles = CLATTN_ROLE_COUNT;
    clattn_plan *plan = NULL;
    tu_expect_status(clattn_sdpa_backward_plan_create(ctx, &desc, &plan), CLATTN_SUCCESS, what);
    clattn_plan_release(plan);
    return desc;
}

/* d (over its tensors) is refused with `want` and a message holding `word`, no plan made. */
static void expect_refused(clattn_ctx *ctx, const clattn_sdpa_desc *d, clattn_status want,
                           const char *word, const char *what)
{
    clattn_plan *plan = NULL;
    const clattn_status got = clattn_sdpa_backward_plan_create(ctx, d, &plan);
    const char *message = clattn_last_error(ctx);
    tu_expect(got == want && plan == NULL && strstr(message, word),
              "%s: got %s (%s), want %s naming %s", what, clattn_status_string(got), message,
              clattn_status_string(want), word);
    clattn_plan_release(plan);
}

/* What the backward refuses with packed sequences, each with a message naming the argument. */
START_TEST(test_backward_varlen_refusals)
{
    TU_BEGIN_TEST();
    clattn_ctx *ctx = tu_ctx();
    pb_sdpa_spec spec = base_spec(3, 2, 0, 4, 6, 8, 8);
    spec.varlen = 1;
    spec.sinks = 1;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    tu_set_case("varlen refusals: %s", p.label);
    clattn_tensors t = p.layouts;
    const size_t o_dims[3] = {p.total_q, 2, 8}, q_dims[3] = {p.total_q, 2, 8};
    const size_t k_dims[3] = {p.total_k, 2, 8};
    const clattn_sdpa_desc desc = refusal_base(ctx, &p, &t, 3, q_dims, k_dims, o_dims,
                                               "backward plan (packed sequences)");
    const tu_refusal refusals[] = {
        {"grad_attn_mask (no mask can be given)", "grad_attn_mask", CLATTN_ERR_UNSUPPORTED},
        {"attn_mask", "attn_mask", CLATTN_ERR_UNSUPPORTED},
        {"key_padding_mask", "key_padding_mask", CLATTN_ERR_UNSUPPORTED},
        {"grad_k with total_q rows", "grad_k", CLATTN_ERR_INVALID_SHAPE},
        {"grad_out of rank 4", "grad_out", CLATTN_ERR_INVALID_SHAPE},
        {"grad_v's head size", "(total_k, kv_heads, head_dim_v)", CLATTN_ERR_INVALID_SHAPE},
        {"lse (batch, heads, seq_q)", "(heads, total_q)", CLATTN_ERR_INVALID_SHAPE},
        {"no lse", "lse", CLATTN_ERR_INVALID_ARGUMENT},
        {"path UNFUSED", "UNFUSED", CLATTN_ERR_UNSUPPORTED},
        {"dropout", "packed sequences", CLATTN_ERR_UNSUPPORTED},
        {"cu_seqlens_k absent", "cu_seqlens_k", CLATTN_ERR_INVALID_ARGUMENT},
    };
    for (size_t r = 0; r < sizeof refusals / sizeof refusals[0]; ++r) {
        clattn_tensors u = t;
        clattn_sdpa_desc d = desc;
        d.by_role = u.by_role;
        const size_t mask_dims[2] = {4, 6}, wrong_k[3] = {p.total_q + 1, 2, 8};
        const size_t four[4] = {3, 2, 4, 8}, wrong_v[3] = {p.total_k, 2, 7};
        const size_t lse_dims[3] = {3, 2, 4};
        switch (r) {
        case 0:
            pb_make_layout(&u.grad_attn_mask, CLATTN_DTYPE_F32, 2, mask_dims, PB_PACKED);
            break;
        case 1: pb_make_layout(&u.attn_mask, CLATTN_DTYPE_F32, 2, mask_dims, PB_PACKED); break;
        case 2:
            pb_make_layout(&u.key_padding_mask, CLATTN_DTYPE_U8, 2, mask_dims, PB_PACKED);
            break;
        case 3:
            pb_make_layout(&u.grad_k, CLATTN_DTYPE_F32, 3, wrong_k, PB_PACKED);
            break;
        case 4: pb_make_layout(&u.grad_out, CLATTN_DTYPE_F32, 4, four, PB_PACKED); break;
        case 5: pb_make_layout(&u.grad_v, CLATTN_DTYPE_F32, 3, wrong_v, PB_PACKED); break;
        case 6: pb_make_layout(&u.lse, CLATTN_DTYPE_F32, 3, lse_dims, PB_PACKED); break;
        case 7: memset(&u.lse, 0, sizeof u.lse); break;
        case 8: d.path = CLATTN_PATH_UNFUSED; break;
        case 9: d.dropout_p = 0.5; break;
        default: memset(&u.cu_seqlens_k, 0, sizeof u.cu_seqlens_k); break;
        }
        expect_refused(ctx, &d, refusals[r].want, refusals[r].needle, refusals[r].given);
    }
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* Random problems over every feature the backward takes, together. */
START_TEST(test_backward_random)
{
    TU_BEGIN_TEST();
    bwd_case c = {.grad_mask = 1, .grad_sinks = 1};
    pb_sdpa_spec *s = &c.spec;
    pb_sdpa_random_spec(s, PB_RANDOM_ALL | (tu_small() ? PB_RANDOM_SMALL : 0));
    /* what the backward refuses: the forward's past, rope, weights, double softmax, UNFUSED */
    s->past = 0;
    s->rope = 0;
    s->want_weights = 0;
    s->softmax_f64 = 0;
    s->want_lse = 1;
    s->path = CLATTN_PATH_FUSED;
    if (s->mask_zero_strides) /* full dims of stride 0: the gradient's own dims, packed */
        c.grad_mask = tu_rand_below(2);
    if (tu_rand_below(4) == 0) { /* packed sequences: no masks, key counts or dropout there */
        s->varlen = 1;
        s->dropout_p = 0.0;
    }
    run_case(tu_ctx(), &c);
    TU_END_TEST();
}
END_TEST

/* ref_sdpa_backward against central differences of the float64 forward's loss
 * L = sum(dO * out): q, k and v entries of problems with a mask, softcap, ALiBi and GQA, then
 * sinks and a causal bound, then key counts and padding. Inputs are floats: a step of 2^-8 is
 * exact, so the quotient's error is the O(h^2) term. (Not relu: its kink at 0 is not
 * differentiable; tests/python checks its gradient against torch's autograd.) */
START_TEST(test_reference_by_differences)
{
    TU_BEGIN_TEST();
    pb_sdpa_spec spec = base_spec(1, 2, 1, 5, 7, 4, 3);
    spec.mask = PB_MASK_FLOAT;
    spec.softcap = 3.0f;
    spec.alibi = 1;
    spec.sinks = _i == 1;
    spec.kv_len = _i == 2;
    spec.padding = _i == 2;
    spec.causal = _i == 1 ? CLATTN_CAUSAL_BOTTOM_RIGHT : CLATTN_CAUSAL_NONE;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    tu_set_case("differences: %s", p.label);
    float *alibi = NULL;
    const ref_sdpa_shape shape = pb_sdpa_problem_ref_shape(&p, &alibi);
    float *mask = pb_expand_mask(&p);
    float *grad_out = tu_random_floats(p.out_count);
    double *grads[3] = {tu_doubles(p.q_count), tu_doubles(p.k_count), tu_doubles(p.v_count)};
    ref_sdpa_backward(&shape, p.q, p.k, p.v, mask, p.padding, grad_out, NULL, 0, grads[0],
                      grads[1], grads[2], NULL, NULL);
    float *inputs[3] = {p.q, p.k, p.v};
    const size_t counts[3] = {p.q_count, p.k_count, p.v_count};
    double *out = tu_doubles(p.out_count);
    const float step = 1.0f / 256.0f;
    for (int t = 0; t < 3; ++t) {
        double worst = 0.0, largest = 1e-30;
        for (size_t i = 0; i < counts[t]; ++i)
            largest = fmax(largest, fabs(grads[t][i]));
        for (size_t i = 0; i < counts[t]; ++i) {
            const float keep = inputs[t][i];
            double loss[2];
            for (int side = 0; side < 2; ++side) {
                inputs[t][i] = keep + (side ? step : -step);
                ref_sdpa(&shape, p.q, p.k, p.v, mask, p.padding, out, NULL, NULL);
                loss[side] = 0.0;
                for (size_t x = 0; x < p.out_count; ++x)
                    loss[side] += (double)grad_out[x] * out[x];
            }
            inputs[t][i] = keep;
            const double numeric = (loss[1] - loss[0]) / (2.0 * step);
            worst = fmax(worst, fabs(numeric - grads[t][i]));
        }
        tu_expect(worst <= 2e-3 * largest, "%s: the reference's gradient is %g from central "
                  "differences (largest entry %g)", t == 0 ? "q" : t == 1 ? "k" : "v", worst,
                  largest);
    }
    free(out);
    for (int t = 0; t < 3; ++t)
        free(grads[t]);
    free(grad_out);
    free(mask);
    free(alibi);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* What the backward refuses, each with a message naming the argument. */
START_TEST(test_backward_refusals)
{
    TU_BEGIN_TEST();
    clattn_ctx *ctx = tu_ctx();
    pb_sdpa_spec spec = base_spec(1, 2, 0, 4, 6, 8, 8);
    spec.mask = PB_MASK_BOOL;
    spec.sinks = 0;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    tu_set_case("refusals: %s", p.label);
    clattn_tensors t = p.layouts;
    const size_t q_dims[4] = {1, 2, 4, 8}, o_dims[4] = {1, 2, 4, 8};
    const size_t k_dims[4] = {1, 2, 6, 8};
    const clattn_sdpa_desc desc =
        refusal_base(ctx, &p, &t, 4, q_dims, k_dims, o_dims, "backward plan");
    const tu_refusal refusals[] = {
        {"no lse", "lse", CLATTN_ERR_INVALID_ARGUMENT},
        {"no grad_out", "grad_out", CLATTN_ERR_INVALID_ARGUMENT},
        {"grad_k of the wrong dims", "grad_k", CLATTN_ERR_INVALID_SHAPE},
        {"grad_attn_mask of a bool mask", "grad_attn_mask", CLATTN_ERR_INVALID_ARGUMENT},
        {"grad_sinks without sinks", "grad_sinks", CLATTN_ERR_INVALID_ARGUMENT},
        {"softmax_f64 on path FUSED", "softmax_f64", CLATTN_ERR_INVALID_ARGUMENT},
        {"rope", "rope=1", CLATTN_ERR_UNSUPPORTED},
        {"weights", "weights", CLATTN_ERR_INVALID_ARGUMENT},
        {"UNFUSED with q's head_dim strided", "stride", CLATTN_ERR_UNSUPPORTED},
        {"UNFUSED without lse, with grad_sinks", "lse", CLATTN_ERR_INVALID_ARGUMENT},
        {"path 7", "path=7", CLATTN_ERR_INVALID_ARGUMENT},
    };
    for (size_t r = 0; r < sizeof refusals / sizeof refusals[0]; ++r) {
        clattn_tensors u = t;
        clattn_sdpa_desc d = desc;
        d.by_role = u.by_role;
        const size_t bad[4] = {1, 2, 7, 8}, heads[1] = {2}, mask_dims[2] = {4, 6};
        switch (r) {
        case 0: memset(&u.lse, 0, sizeof u.lse); break;
        case 1: memset(&u.grad_out, 0, sizeof u.grad_out); break;
        case 2: pb_make_layout(&u.grad_k, CLATTN_DTYPE_F32, 4, bad, PB_PACKED); break;
        case 3:
            pb_make_layout(&u.grad_attn_mask, CLATTN_DTYPE_F32, 2, mask_dims, PB_PACKED);
            break;
        case 4: pb_make_layout(&u.grad_sinks, CLATTN_DTYPE_F32, 1, heads, PB_PACKED); break;
        case 5: d.softmax_f64 = 1; break;
        case 6: d.rope = 1; break;
        case 7: pb_make_layout(&u.weights, CLATTN_DTYPE_F32, 4, bad, PB_PACKED); break;
        case 8:
            pb_make_layout(&u.q, CLATTN_DTYPE_F32, 4, q_dims, PB_STRIDED_LAST);
            d.path = CLATTN_PATH_UNFUSED;
            break;
        case 9:
            pb_make_layout(&u.sinks, CLATTN_DTYPE_F32, 1, heads, PB_PACKED);
            pb_make_layout(&u.grad_sinks, CLATTN_DTYPE_F32, 1, heads, PB_PACKED);
            memset(&u.lse, 0, sizeof u.lse);
            d.path = CLATTN_PATH_UNFUSED;
            break;
        default: d.path = (clattn_path)7; break;
        }
        expect_refused(ctx, &d, refusals[r].want, refusals[r].needle, refusals[r].given);
    }
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* The CPU backward's key blocks (tuning key flash_bwd_nv: 16, 32 or 64 keys; the CPU row of
 * host/tuning/table.h gives head size 64 blocks of 32 through an @head_dim=64 record, which a
 * row without selectors does not override): each on a context whose row sets it (d = 32, 48,
 * 128), then the built-in record at d = 64 and the default beside it at d = 80, every
 * gradient against float64 at awkward sizes (GQA, causal bottom-right, key padding, key
 * counts that are no multiple of the block). Where the CPU variant runs (not under
 * CLATTN_PARAMS=gpu), its plan must say the block it took. */
START_TEST(test_backward_key_blocks)
{
    TU_BEGIN_TEST();
    static const unsigned nv[] = {1, 2, 4, 0, 0, 4, 2}; /* 0: the context's own rows */
    /* rows a step (flash_bwd_rb; 0: the default's): 5 and 7 divide neither the 67 rows nor
     * the 64 of a dQ work-item (rounded down to 60 and 63) */
    static const unsigned rb[] = {3, 8, 0, 0, 0, 5, 7};
    static const size_t dims[] = {32, 48, 128, 64, 80, 96, 128};
    static const size_t keys[] = {16, 32, 64, 32, 64, 64, 32};
    clattn_ctx *ctx = tu_ctx();
    char row[96], want[64];
    if (nv[_i]) {
        if (rb[_i])
            snprintf(row, sizeof row, "any | * | * | flash_bwd_nv=%u flash_bwd_rb=%u", nv[_i],
                     rb[_i]);
        else
            snprintf(row, sizeof row, "any | * | * | flash_bwd_nv=%u", nv[_i]);
        clattn_ctx_desc desc;
        clattn_ctx_desc_init(&desc);
        desc.queue = clattn_ctx_queue(tu_ctx());
        desc.tuning_rows = row;
        char message[512] = "";
        ctx = NULL;
        tu_expect_status(clattn_ctx_create_desc(&desc, &ctx, message, sizeof message),
                         CLATTN_SUCCESS, row);
    }
    if (rb[_i])
        snprintf(want, sizeof want, "dK/dV per %zu keys, %u rows a step", keys[_i], rb[_i]);
    else
        snprintf(want, sizeof want, "dK/dV per %zu keys", keys[_i]);
    bwd_case c = {.grad_mask = 0, .grad_sinks = 0};
    c.spec = base_spec(1, 4, 2, 67, 131, dims[_i], dims[_i]);
    c.spec.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
    c.spec.padding = 1;
    if (ctx != NULL) {
        expect_cpu_info_ = want;
        run_case(ctx, &c);
        expect_cpu_info_ = NULL;
    }
    if (nv[_i])
        clattn_ctx_release(ctx);
    TU_END_TEST();
}
END_TEST

int main(void)
{
    tu_suite_begin("check_backward");
    has_fp64_ = tu_device_has_fp64();
    Suite *suite = suite_create("backward");
    TCase *tc = tu_tcase(suite, "backward", 900);
    /* Small scale (Oclgrind, rusticl): the d = 128 decode and the 127 x 127 prefill stay out
     * (minutes there); every feature still runs in the other cases. */
    static const int heavy[] = {14, 15};
    if (tu_small())
        tu_not_run("test_backward_cases 14-15 (a 257-key decode at d = 128, a 127 x 127 "
                   "prefill): minutes on Oclgrind");
    tu_add_loop_except(tc, test_backward_cases, 0, CASES, heavy, tu_small() ? 2 : 0);
    /* The unfused path at small scale: six cases (a mask's gradient broadcast, relu with a
     * mask, sinks with a fully masked row, dropout with relu, p = 1; one row): its matmuls run
     * in the matmul suites, and on Oclgrind these take 3-7 times the fused cases' time. */
    static const int unfused_small_skip[] = {1, 2, 3, 4, 6, 7, 8, 10, 11, 12, 14, 15, 16, 18};
    if (tu_small())
        tu_not_run("test_backward_unfused 1-4, 6-8, 10-12, 14-16, 18 (the unfused path's "
                   "other cases): its matmuls take minutes on Oclgrind");
    tu_add_loop_except(tc, test_backward_unfused, 0, CASES, tu_small() ? unfused_small_skip : heavy,
                       tu_small() ? 14 : 0);
    tcase_add_loop_test(tc, test_backward_varlen, 0, VARLEN_CASES);
    tcase_add_test(tc, test_backward_varlen_refusals);
    tcase_add_loop_test(tc, test_backward_random, 0, tu_small() ? 4 : 24);
    tcase_add_loop_test(tc, test_reference_by_differences, 0, 3);
    tcase_add_test(tc, test_backward_refusals);
    tcase_add_loop_test(tc, test_backward_key_blocks, 0, tu_small() ? 1 : 7);
    return tu_run_suite(suite);
}
