/*
 * check_softmax: clattn_softmax_rows against the float64 reference: scale, causal, additive and
 * key-padding masks, fully masked rows, relu normalisation, large scores, in place and out of
 * place, awkward row lengths.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference.h"
#include "testutil.h"

#define COUNT_OF(array) ((int)(sizeof(array) / sizeof((array)[0])))

enum fully_masked_kind {
    FULLY_MASKED_NONE = 0,
    FULLY_MASKED_BY_PADDING = 1,   /* every key of batch entry 0 is padding */
    FULLY_MASKED_BY_ATTN_MASK = 2, /* attn_mask row 0 is all -inf */
    FULLY_MASKED_BY_CAUSAL = 3     /* causal plus padding of key 0: query 0 keeps nothing */
};

typedef struct softmax_case {
    size_t batch, heads, seq_q, seq_k;
    float scale;
    clattn_norm norm;
    int causal, use_attn_mask, use_padding, in_place;
    float magnitude; /* scores are uniform in [-magnitude, magnitude) */
    enum fully_masked_kind fully_masked;
} softmax_case;

static void describe(const softmax_case *sc)
{
    tu_set_case("batch=%zu heads=%zu seq_q=%zu seq_k=%zu scale=%g norm=%s causal=%d attn_mask=%d "
                "padding=%d in_place=%d magnitude=%g fully_masked=%d",
                sc->batch, sc->heads, sc->seq_q, sc->seq_k, (double)sc->scale,
                sc->norm == CLATTN_NORM_RELU ? "relu" : "softmax", sc->causal, sc->use_attn_mask,
                sc->use_padding, sc->in_place, (double)sc->magnitude, (int)sc->fully_masked);
}

/* Additive mask: values in [-2, 2) with about one entry in five -inf. */
static float *make_attn_mask(const softmax_case *sc)
{
    size_t count = sc->seq_q * sc->seq_k;
    float *mask = tu_floats(count);
    tu_fill_uniform(mask, count, -2.0f, 2.0f);
    for (size_t i = 0; i < count; ++i) {
        if (tu_rand_below(5) == 0) {
            mask[i] = -INFINITY;
        }
    }
    if (sc->fully_masked == FULLY_MASKED_BY_ATTN_MASK) {
        for (size_t key = 0; key < sc->seq_k; ++key) {
            mask[key] = -INFINITY;
        }
    }
    return mask;
}

/* Key padding: about three keys in ten ignored; values other than 1 count as "ignore" too. */
static uint8_t *make_padding(const softmax_case *sc)
{
    uint8_t *padding = tu_bytes(sc->batch * sc->seq_k);
    for (size_t i = 0; i < sc->batch * sc->seq_k; ++i) {
        size_t draw = tu_rand_below(10);
        padding[i] = draw < 3 ? (uint8_t)(draw == 0 ? 255 : 1) : 0;
    }
    if (sc->fully_masked == FULLY_MASKED_BY_PADDING) {
        memset(padding, 1, sc->seq_k);
    }
    if (sc->fully_masked == FULLY_MASKED_BY_CAUSAL) {
        for (size_t b = 0; b < sc->batch; ++b) {
            padding[b * sc->seq_k] = 1;
        }
    }
    return padding;
}

/* Rows whose reference is all zeros (fully masked, or relu with no positive score) must be
 * exactly zero in the result, not merely close. */
static void expect_zero_rows_exact(const float *got, const double *ref, size_t rows, size_t seq_k)
{
    for (size_t row = 0; row < rows; ++row) {
        int ref_all_zero = 1;
        for (size_t key = 0; key < seq_k && ref_all_zero; ++key) {
            ref_all_zero = ref[row * seq_k + key] == 0.0;
        }
        if (!ref_all_zero) {
            continue;
        }
        for (size_t key = 0; key < seq_k; ++key) {
            if (got[row * seq_k + key] != 0.0f) {
                tu_expect(0, "row %zu has no kept key but element %zu is %g, not 0", row, key,
                          (double)got[row * seq_k + key]);
                return;
            }
        }
    }
}

static void run_softmax_case(const softmax_case *sc)
{
    describe(sc);
    size_t rows = sc->batch * sc->heads * sc->seq_q;
    size_t count = rows * sc->seq_k;
    size_t scores_offset = 1 + tu_rand_below(16), out_offset = tu_rand_below(16);
    size_t mask_offset = tu_rand_below(8), padding_offset = tu_rand_below(8);
    int causal = sc->causal || sc->fully_masked == FULLY_MASKED_BY_CAUSAL;
    int use_attn_mask = sc->use_attn_mask || sc->fully_masked == FULLY_MASKED_BY_ATTN_MASK;
    int use_padding = sc->use_padding || sc->fully_masked == FULLY_MASKED_BY_PADDING ||
                      sc->fully_masked == FULLY_MASKED_BY_CAUSAL;

    float *scores = tu_floats(count);
    tu_fill_uniform(scores, count, -sc->magnitude, sc->magnitude);
    if (sc->norm == CLATTN_NORM_RELU && sc->seq_q > 1) {
        /* Query 1 of every head has only negative scores: relu sum 0 gives a zero row. */
        for (size_t r = 1; r < rows; r += sc->seq_q) {
            for (size_t key = 0; key < sc->seq_k; ++key) {
                scores[r * sc->seq_k + key] = -fabsf(scores[r * sc->seq_k + key]) - 0.01f;
            }
        }
    }
    float *attn_mask = use_attn_mask ? make_attn_mask(sc) : NULL;
    uint8_t *padding = use_padding ? make_padding(sc) : NULL;

    clattn_host_masks host_masks = {causal, attn_mask, padding};
    double *ref = tu_doubles(count);
    clattn_softmax_desc desc = {
        .batch = sc->batch,
        .heads = sc->heads,
        .seq_q = sc->seq_q,
        .seq_k = sc->seq_k,
        .scale = sc->scale,
        .norm = sc->norm,
    };
    ref_softmax_rows(&desc, &host_masks, scores, ref);

    cl_mem scores_mem = tu_upload_padded(scores, count, scores_offset, 5);
    cl_mem out_mem = sc->in_place ? NULL : tu_nan_buffer(out_offset + count + 3);
    cl_mem mask_mem = NULL, padding_mem = NULL;
    desc.masks.causal = causal;
    if (attn_mask != NULL) {
        mask_mem = tu_upload_padded(attn_mask, sc->seq_q * sc->seq_k, mask_offset, 0);
        desc.masks.attn_mask = tu_tensor(mask_mem, mask_offset);
    }
    if (padding != NULL) {
        uint8_t *padded = tu_bytes(padding_offset + sc->batch * sc->seq_k);
        memset(padded, 1, padding_offset); /* the bytes before the tensor would mask everything */
        memcpy(padded + padding_offset, padding, sc->batch * sc->seq_k);
        padding_mem = tu_upload_bytes(padded, padding_offset + sc->batch * sc->seq_k);
        desc.masks.key_padding_mask = tu_tensor(padding_mem, padding_offset);
        free(padded);
    }

    clattn_tensor scores_tensor = tu_tensor(scores_mem, scores_offset);
    clattn_tensor out_tensor = sc->in_place ? scores_tensor : tu_tensor(out_mem, out_offset);
    clattn_status status =
        clattn_softmax_rows(tu_ctx(), &desc, scores_tensor, out_tensor, 0, NULL, NULL);
    if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_softmax_rows")) {
        size_t scores_total = scores_offset + count + 5;
        float *scores_after = tu_floats(scores_total);
        tu_read_floats(scores_mem, 0, scores_total, scores_after);
        const float *got = scores_after + scores_offset;
        float *out_after = NULL;
        if (sc->in_place) {
            tu_expect_nan_outside("scores (in place)", scores_after, scores_total, scores_offset,
                                  count);
        } else {
            size_t out_total = out_offset + count + 3;
            out_after = tu_floats(out_total);
            tu_read_floats(out_mem, 0, out_total, out_after);
            tu_expect_nan_outside("out", out_after, out_total, out_offset, count);
            tu_expect(memcmp(scores_after + scores_offset, scores, count * sizeof(float)) == 0,
                      "out of place: the scores were modified");
            got = out_after + out_offset;
        }
        tu_expect_finite("weights", got, count);
        tu_expect_close("weights", got, ref, count, TU_TOL);
        expect_zero_rows_exact(got, ref, rows, sc->seq_k);
        free(out_after);
        free(scores_after);
    }

    tu_release_mem(padding_mem);
    tu_release_mem(mask_mem);
    tu_release_mem(out_mem);
    tu_release_mem(scores_mem);
    free(ref);
    free(padding);
    free(attn_mask);
    free(scores);
}

/* --- tables ------------------------------------------------------------------------------- */

/* Every awkward row length, with the options rotating over the table. */
/* clang-format off */
static const softmax_case awkward_cases[] = {
    {1, 1, 1, 1, 0.0f, CLATTN_NORM_SOFTMAX, 0, 0, 0, 0, 1.0f, FULLY_MASKED_NONE},
    {2, 3, 4, 1, 0.5f, CLATTN_NORM_SOFTMAX, 0, 1, 0, 1, 3.0f, FULLY_MASKED_NONE},
    {1, 2, 3, 3, 0.0f, CLATTN_NORM_SOFTMAX, 1, 0, 0, 0, 4.0f, FULLY_MASKED_NONE},
    {3, 2, 5, 17, 0.125f, CLATTN_NORM_SOFTMAX, 0, 0, 1, 1, 8.0f, FULLY_MASKED_NONE},
    {2, 4, 7, 63, 1.7f, CLATTN_NORM_SOFTMAX, 1, 1, 1, 0, 2.0f, FULLY_MASKED_NONE},
    {1, 3, 65, 65, 0.3f, CLATTN_NORM_SOFTMAX, 1, 0, 0, 1, 5.0f, FULLY_MASKED_NONE},
    {2, 2, 9, 127, 0.0f, CLATTN_NORM_SOFTMAX, 0, 1, 0, 0, 10.0f, FULLY_MASKED_NONE},
    {1, 2, 129, 129, 0.7f, CLATTN_NORM_SOFTMAX, 1, 1, 1, 1, 3.0f, FULLY_MASKED_NONE},
    {2, 3, 5, 1000, 0.25f, CLATTN_NORM_SOFTMAX, 0, 1, 1, 0, 6.0f, FULLY_MASKED_NONE},
    {1, 1, 3, 1000, 0.0f, CLATTN_NORM_SOFTMAX, 1, 0, 0, 1, 20.0f, FULLY_MASKED_NONE},
    {2, 2, 3, 17, 0.9f, CLATTN_NORM_RELU, 0, 0, 0, 0, 1.0f, FULLY_MASKED_NONE},
    {1, 3, 6, 65, 0.0f, CLATTN_NORM_RELU, 1, 1, 0, 1, 2.0f, FULLY_MASKED_NONE},
    {3, 1, 4, 129, 2.0f, CLATTN_NORM_RELU, 0, 1, 1, 0, 1.0f, FULLY_MASKED_NONE},
    {2, 2, 5, 1000, 0.5f, CLATTN_NORM_RELU, 1, 0, 1, 1, 1.0f, FULLY_MASKED_NONE},
    {1, 4, 2, 3, 0.0f, CLATTN_NORM_RELU, 0, 0, 0, 1, 1.0f, FULLY_MASKED_NONE},
    {2, 2, 63, 63, 0.0f, CLATTN_NORM_RELU, 1, 0, 0, 0, 1.0f, FULLY_MASKED_NONE},
};
/* clang-format on */

/* Causal masks with seq_q == seq_k, seq_q < seq_k and seq_q > seq_k (top-left aligned). */
/* clang-format off */
static const softmax_case causal_cases[] = {
    {2, 3, 17, 17, 0.5f, CLATTN_NORM_SOFTMAX, 1, 0, 0, 0, 4.0f, FULLY_MASKED_NONE},
    {1, 2, 5, 63, 0.0f, CLATTN_NORM_SOFTMAX, 1, 0, 0, 0, 4.0f, FULLY_MASKED_NONE},
    {2, 1, 65, 17, 1.0f, CLATTN_NORM_SOFTMAX, 1, 0, 0, 1, 4.0f, FULLY_MASKED_NONE},
    {1, 2, 129, 3, 0.0f, CLATTN_NORM_SOFTMAX, 1, 1, 0, 0, 4.0f, FULLY_MASKED_NONE},
    {2, 2, 3, 129, 0.8f, CLATTN_NORM_RELU, 1, 0, 0, 0, 1.0f, FULLY_MASKED_NONE},
    {1, 1, 65, 65, 0.0f, CLATTN_NORM_RELU, 1, 0, 1, 1, 1.0f, FULLY_MASKED_NONE},
};
/* clang-format on */

/* Rows with every key masked: exact zeros, never NaN, for both normalisations. */
/* clang-format off */
static const softmax_case fully_masked_cases[] = {
    {2, 3, 4, 17, 0.0f, CLATTN_NORM_SOFTMAX, 0, 0, 0, 0, 3.0f, FULLY_MASKED_BY_PADDING},
    {2, 2, 5, 3, 0.5f, CLATTN_NORM_SOFTMAX, 0, 0, 0, 1, 3.0f, FULLY_MASKED_BY_ATTN_MASK},
    {3, 2, 7, 65, 0.0f, CLATTN_NORM_SOFTMAX, 0, 1, 0, 0, 3.0f, FULLY_MASKED_BY_CAUSAL},
    {1, 1, 1, 1, 0.0f, CLATTN_NORM_SOFTMAX, 0, 0, 0, 0, 3.0f, FULLY_MASKED_BY_PADDING},
    {2, 2, 3, 129, 0.0f, CLATTN_NORM_SOFTMAX, 1, 1, 1, 1, 3.0f, FULLY_MASKED_BY_ATTN_MASK},
    {2, 3, 4, 17, 0.0f, CLATTN_NORM_RELU, 0, 0, 0, 0, 1.0f, FULLY_MASKED_BY_PADDING},
    {2, 2, 5, 63, 1.5f, CLATTN_NORM_RELU, 0, 0, 0, 1, 1.0f, FULLY_MASKED_BY_ATTN_MASK},
    {2, 1, 6, 1000, 0.0f, CLATTN_NORM_RELU, 0, 0, 0, 0, 1.0f, FULLY_MASKED_BY_CAUSAL},
};
/* clang-format on */

/* Scores of magnitude 1e4: no overflow and no NaN. The scales are powers of two so that the
 * float32 product scale * score is exact and the float64 reference is a fair target. */
/* clang-format off */
static const softmax_case large_score_cases[] = {
    {2, 2, 3, 3, 1.0f, CLATTN_NORM_SOFTMAX, 0, 0, 0, 0, 1e4f, FULLY_MASKED_NONE},
    {1, 2, 5, 65, 0.5f, CLATTN_NORM_SOFTMAX, 0, 0, 0, 1, 1e4f, FULLY_MASKED_NONE},
    {2, 1, 4, 1000, 0.0f, CLATTN_NORM_SOFTMAX, 1, 0, 1, 0, 1e4f, FULLY_MASKED_NONE},
    {1, 1, 7, 129, 2.0f, CLATTN_NORM_SOFTMAX, 0, 0, 0, 0, 3e4f, FULLY_MASKED_NONE},
    {1, 2, 4, 63, 0.25f, CLATTN_NORM_RELU, 0, 0, 0, 0, 1e4f, FULLY_MASKED_NONE},
};
/* clang-format on */

START_TEST(test_softmax_awkward)
{
    TU_BEGIN_TEST();
    run_softmax_case(&awkward_cases[_i]);
    TU_END_TEST();
}
END_TEST

START_TEST(test_softmax_causal)
{
    TU_BEGIN_TEST();
    run_softmax_case(&causal_cases[_i]);
    TU_END_TEST();
}
END_TEST

START_TEST(test_softmax_fully_masked)
{
    TU_BEGIN_TEST();
    run_softmax_case(&fully_masked_cases[_i]);
    TU_END_TEST();
}
END_TEST

START_TEST(test_softmax_large_scores)
{
    TU_BEGIN_TEST();
    run_softmax_case(&large_score_cases[_i]);
    TU_END_TEST();
}
END_TEST

/* Every row length from the awkward list, in place and out of place, all masks at once. */
START_TEST(test_softmax_all_masks_both_placements)
{
    TU_BEGIN_TEST();
    static const size_t lengths[] = {1, 3, 17, 63, 65, 127, 129, 1000};
    /* clang-format off */
    softmax_case sc = {2, 3, 3, lengths[_i], 0.37f, CLATTN_NORM_SOFTMAX, 1, 1, 1, 0, 4.0f,
                       FULLY_MASKED_NONE};
    /* clang-format on */
    run_softmax_case(&sc);
    sc.in_place = 1;
    run_softmax_case(&sc);
    TU_END_TEST();
}
END_TEST

/* Very long rows, and more rows than one grid dimension holds on some devices (65535). */
/* clang-format off */
static const softmax_case long_cases[] = {
    {1, 1, 2, 20000, 0.0f, CLATTN_NORM_SOFTMAX, 0, 1, 1, 0, 8.0f, FULLY_MASKED_NONE},
    {2, 1, 3, 4097, 0.5f, CLATTN_NORM_SOFTMAX, 1, 0, 0, 1, 8.0f, FULLY_MASKED_NONE},
    {1, 1, 2, 20000, 0.0f, CLATTN_NORM_RELU, 0, 0, 1, 0, 1.0f, FULLY_MASKED_NONE},
    {3, 1100, 21, 3, 0.0f, CLATTN_NORM_SOFTMAX, 1, 1, 1, 0, 4.0f, FULLY_MASKED_NONE},
    {1, 70000, 1, 2, 1.0f, CLATTN_NORM_SOFTMAX, 0, 0, 1, 1, 4.0f, FULLY_MASKED_BY_PADDING},
};
/* clang-format on */

START_TEST(test_softmax_long)
{
    TU_BEGIN_TEST();
    run_softmax_case(&long_cases[_i]);
    TU_END_TEST();
}
END_TEST

/* Random configurations over every option. */
START_TEST(test_softmax_random)
{
    TU_BEGIN_TEST();
    static const size_t lengths[] = {1, 3, 17, 63, 65, 127, 129, 1000};
    softmax_case sc = {
        .batch = 1 + tu_rand_below(3),
        .heads = 1 + tu_rand_below(4),
        .seq_q = lengths[tu_rand_below(7)],
        .seq_k = lengths[tu_rand_below(8)],
        .scale = tu_rand_below(3) == 0 ? 0.0f : (float)(0.1 + 2.0 * tu_rand_unit()),
        .norm = tu_rand_below(3) == 0 ? CLATTN_NORM_RELU : CLATTN_NORM_SOFTMAX,
        .causal = (int)tu_rand_below(2),
        .use_attn_mask = (int)tu_rand_below(2),
        .use_padding = (int)tu_rand_below(2),
        .in_place = (int)tu_rand_below(2),
        .magnitude = (float)(1.0 + 9.0 * tu_rand_unit()),
        .fully_masked = (enum fully_masked_kind)tu_rand_below(4),
    };
    run_softmax_case(&sc);
    TU_END_TEST();
}
END_TEST

/* Row max far from zero and a single dominant key: the result is one-hot, no NaN. */
START_TEST(test_softmax_extreme_rows)
{
    TU_BEGIN_TEST();
    const size_t seq_k = 65, rows = 4;
    tu_set_case("extreme rows seq_k=%zu", seq_k);
    float *scores = tu_floats(rows * seq_k);
    for (size_t key = 0; key < seq_k; ++key) {
        scores[0 * seq_k + key] = key == 7 ? 3e4f : -3e4f; /* one-hot at key 7 */
        scores[1 * seq_k + key] = -1e30f;                  /* all equal, huge negative */
        scores[2 * seq_k + key] = 1e30f;                   /* all equal, huge positive */
        scores[3 * seq_k + key] = key == seq_k - 1 ? 0.0f : -FLT_MAX;
    }
    clattn_softmax_desc desc = {.batch = 1, .heads = 1, .seq_q = rows, .seq_k = seq_k};
    double *ref = tu_doubles(rows * seq_k);
    ref_softmax_rows(&desc, NULL, scores, ref);
    cl_mem scores_mem = tu_upload_floats(scores, rows * seq_k);
    cl_mem out_mem = tu_nan_buffer(rows * seq_k);
    clattn_status status = clattn_softmax_rows(tu_ctx(), &desc, tu_tensor(scores_mem, 0),
                                               tu_tensor(out_mem, 0), 0, NULL, NULL);
    if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_softmax_rows")) {
        float *got = tu_floats(rows * seq_k);
        tu_read_floats(out_mem, 0, rows * seq_k, got);
        tu_expect_finite("weights", got, rows * seq_k);
        tu_expect_close("weights", got, ref, rows * seq_k, TU_TOL);
        free(got);
    }
    tu_release_mem(out_mem);
    tu_release_mem(scores_mem);
    free(ref);
    free(scores);
    TU_END_TEST();
}
END_TEST

/* The returned event completes the work, and a wait list is honoured. */
START_TEST(test_softmax_events)
{
    TU_BEGIN_TEST();
    const size_t rows = 6, seq_k = 33;
    tu_set_case("events rows=%zu seq_k=%zu", rows, seq_k);
    float *scores = tu_random_floats(rows * seq_k);
    clattn_softmax_desc desc = {.batch = 2, .heads = 3, .seq_q = 1, .seq_k = seq_k, .scale = 2.0f};
    double *ref = tu_doubles(rows * seq_k);
    ref_softmax_rows(&desc, NULL, scores, ref);
    cl_mem scores_mem = tu_nan_buffer(rows * seq_k);
    cl_mem out_mem = tu_nan_buffer(rows * seq_k);

    cl_event written = NULL, done = NULL;
    cl_int err = clEnqueueWriteBuffer(clattn_ctx_queue(tu_ctx()), scores_mem, CL_FALSE, 0,
                                      rows * seq_k * sizeof(float), scores, 0, NULL, &written);
    tu_expect(err == CL_SUCCESS, "clEnqueueWriteBuffer: %d", err);
    clattn_status status = clattn_softmax_rows(tu_ctx(), &desc, tu_tensor(scores_mem, 0),
                                               tu_tensor(out_mem, 0), 1, &written, &done);
    if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_softmax_rows") &&
        tu_expect(done != NULL, "no event returned")) {
        tu_expect(clWaitForEvents(1, &done) == CL_SUCCESS, "clWaitForEvents failed");
        cl_int state = 0;
        clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof state, &state, NULL);
        tu_expect(state == CL_COMPLETE, "event status %d after wait", state);
        float *got = tu_floats(rows * seq_k);
        tu_read_floats(out_mem, 0, rows * seq_k, got);
        tu_expect_close("weights", got, ref, rows * seq_k, TU_TOL);
        free(got);
    }
    if (done != NULL) {
        clReleaseEvent(done);
    }
    if (written != NULL) {
        clWaitForEvents(1, &written);
        clReleaseEvent(written);
    }
    tu_release_mem(out_mem);
    tu_release_mem(scores_mem);
    free(ref);
    free(scores);
    TU_END_TEST();
}
END_TEST

static Suite *softmax_suite(void)
{
    Suite *suite = suite_create("softmax");
    TCase *shapes = tcase_create("shapes");
    tcase_set_timeout(shapes, 600);
    tcase_add_loop_test(shapes, test_softmax_awkward, 0, COUNT_OF(awkward_cases));
    tcase_add_loop_test(shapes, test_softmax_all_masks_both_placements, 0, 8);
    tcase_add_loop_test(shapes, test_softmax_random, 0, 24);
    /* A reduced run (CLATTN_TEST_SCALE=small, for Oclgrind) leaves out the last two long cases:
     * 69300 and 70000 rows, six minutes each there with 256-wide work-groups. */
    const int small = tu_small();
    if (small)
        tu_not_run("test_softmax_long 3-4 (69300 and 70000 rows: the launches past 65535 rows "
                   "do not run): minutes each on Oclgrind");
    tcase_add_loop_test(shapes, test_softmax_long, 0, COUNT_OF(long_cases) - (small ? 2 : 0));
    suite_add_tcase(suite, shapes);

    TCase *masks = tcase_create("masks");
    tcase_set_timeout(masks, 600);
    tcase_add_loop_test(masks, test_softmax_causal, 0, COUNT_OF(causal_cases));
    tcase_add_loop_test(masks, test_softmax_fully_masked, 0, COUNT_OF(fully_masked_cases));
    suite_add_tcase(suite, masks);

    TCase *numerics = tcase_create("numerics");
    tcase_set_timeout(numerics, 600);
    tcase_add_loop_test(numerics, test_softmax_large_scores, 0, COUNT_OF(large_score_cases));
    tcase_add_test(numerics, test_softmax_extreme_rows);
    tcase_add_test(numerics, test_softmax_events);
    suite_add_tcase(suite, numerics);
    return suite;
}

int main(void)
{
    tu_suite_begin("check_softmax");
    return tu_run_suite(softmax_suite());
}
