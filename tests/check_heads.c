/*
 * check_heads: clattn_split_heads and clattn_concat_heads against the reference. Both are pure
 * copies, so results must be bit-exact. Unused elements of every buffer hold NaN: reading one
 * shows up as NaN in the result, writing one shows up as a non-NaN element where NaN was left.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference.h"
#include "testutil.h"

#define COUNT_OF(array) ((int)(sizeof(array) / sizeof((array)[0])))

typedef struct heads_case {
    size_t batch, seq, heads, head_dim;
    size_t row_gap; /* row_stride = heads * head_dim + row_gap; row_gap 0 passes row_stride 0 */
    size_t src_offset, dst_offset;
} heads_case;

/* clang-format off */
static const heads_case heads_cases[] = {
    {1, 1, 1, 1, 0, 0, 0},    {2, 3, 4, 17, 0, 3, 0},    {3, 17, 2, 63, 5, 0, 7},
    {1, 65, 3, 5, 0, 11, 2},  {2, 127, 16, 3, 1, 0, 0},  {1, 129, 1, 65, 0, 1, 1},
    {2, 5, 8, 64, 64, 4, 0},  {3, 63, 5, 1, 2, 0, 9},    {1, 2, 16, 129, 0, 0, 0},
    {2, 33, 12, 7, 13, 6, 5},
};
/* clang-format on */

static size_t row_stride_of(const heads_case *hc)
{
    return hc->heads * hc->head_dim + hc->row_gap;
}

static clattn_heads_desc desc_of(const heads_case *hc)
{
    clattn_heads_desc desc = {
        .batch = hc->batch,
        .seq = hc->seq,
        .heads = hc->heads,
        .head_dim = hc->head_dim,
        .row_stride = hc->row_gap ? row_stride_of(hc) : 0,
    };
    return desc;
}

/* Elements of the (batch, seq, ...) side: the last row ends at heads * head_dim. */
static size_t strided_extent(const heads_case *hc)
{
    return (hc->batch * hc->seq - 1) * row_stride_of(hc) + hc->heads * hc->head_dim;
}

static void describe(const char *op, const heads_case *hc)
{
    tu_set_case("%s batch=%zu seq=%zu heads=%zu head_dim=%zu row_stride=%zu src_offset=%zu "
                "dst_offset=%zu",
                op, hc->batch, hc->seq, hc->heads, hc->head_dim,
                hc->row_gap ? row_stride_of(hc) : 0, hc->src_offset, hc->dst_offset);
}

/* NaN in ref marks an element that must stay NaN; every other element must equal ref exactly. */
static void expect_layout(const char *what, const float *got, const double *ref, size_t total)
{
    size_t value_count = 0;
    for (size_t i = 0; i < total; ++i) {
        value_count += !isnan(ref[i]);
    }
    float *got_values = tu_floats(value_count);
    double *ref_values = tu_doubles(value_count);
    size_t next = 0;
    int reported = 0;
    for (size_t i = 0; i < total; ++i) {
        if (!isnan(ref[i])) {
            got_values[next] = got[i];
            ref_values[next] = ref[i];
            ++next;
        } else if (!isnan(got[i]) && !reported) {
            reported = 1;
            tu_expect(0, "%s: element %zu is not part of the tensor but was written (%g)", what, i,
                      (double)got[i]);
        }
    }
    tu_expect_close(what, got_values, ref_values, value_count, 0.0);
    free(ref_values);
    free(got_values);
}

/* A NaN buffer of `total` floats whose rows of the (batch, seq, row_stride) view starting at
 * `offset` hold random values in their heads * head_dim columns. */
static float *strided_input(const heads_case *hc, size_t offset, size_t total)
{
    float *values = tu_nan_floats(total);
    size_t width = hc->heads * hc->head_dim;
    for (size_t row = 0; row < hc->batch * hc->seq; ++row) {
        tu_fill_uniform(values + offset + row * row_stride_of(hc), width, -1.0f, 1.0f);
    }
    return values;
}

static void run_split(const heads_case *hc)
{
    describe("split", hc);
    clattn_heads_desc desc = desc_of(hc);
    size_t count = hc->batch * hc->seq * hc->heads * hc->head_dim;
    size_t src_total = hc->src_offset + strided_extent(hc);
    size_t dst_total = hc->dst_offset + count + 4;
    float *src = strided_input(hc, hc->src_offset, src_total);
    double *ref = tu_doubles(dst_total);
    for (size_t i = 0; i < dst_total; ++i) {
        ref[i] = NAN;
    }
    ref_split_heads(&desc, src + hc->src_offset, ref + hc->dst_offset);

    cl_mem src_mem = tu_upload_floats(src, src_total);
    cl_mem dst_mem = tu_nan_buffer(dst_total);
    clattn_status status = clattn_split_heads(tu_ctx(), &desc, tu_tensor(src_mem, hc->src_offset),
                                              tu_tensor(dst_mem, hc->dst_offset), 0, NULL, NULL);
    if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_split_heads")) {
        float *got = tu_floats(dst_total);
        tu_read_floats(dst_mem, 0, dst_total, got);
        expect_layout("split dst", got, ref, dst_total);
        free(got);
    }
    tu_release_mem(dst_mem);
    tu_release_mem(src_mem);
    free(ref);
    free(src);
}

static void run_concat(const heads_case *hc)
{
    describe("concat", hc);
    clattn_heads_desc desc = desc_of(hc);
    size_t count = hc->batch * hc->seq * hc->heads * hc->head_dim;
    size_t dst_total = hc->dst_offset + strided_extent(hc);
    float *src = tu_random_floats(count);
    double *ref = tu_doubles(dst_total);
    for (size_t i = 0; i < dst_total; ++i) {
        ref[i] = NAN;
    }
    ref_concat_heads(&desc, src, ref + hc->dst_offset);

    cl_mem src_mem = tu_upload_padded(src, count, hc->src_offset, 2);
    cl_mem dst_mem = tu_nan_buffer(dst_total);
    clattn_status status = clattn_concat_heads(tu_ctx(), &desc, tu_tensor(src_mem, hc->src_offset),
                                               tu_tensor(dst_mem, hc->dst_offset), 0, NULL, NULL);
    if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_concat_heads")) {
        float *got = tu_floats(dst_total);
        tu_read_floats(dst_mem, 0, dst_total, got);
        expect_layout("concat dst", got, ref, dst_total);
        free(got);
    }
    tu_release_mem(dst_mem);
    tu_release_mem(src_mem);
    free(ref);
    free(src);
}

START_TEST(test_split_heads)
{
    TU_BEGIN_TEST();
    run_split(&heads_cases[_i]);
    TU_END_TEST();
}
END_TEST

START_TEST(test_concat_heads)
{
    TU_BEGIN_TEST();
    run_concat(&heads_cases[_i]);
    TU_END_TEST();
}
END_TEST

/* Splitting each part of a packed (batch, seq, 3E) projection: offset part*E, row_stride 3E.
 * The buffer is exactly batch*seq*3E floats, so the v part's last row ends at the buffer's end. */
START_TEST(test_split_packed_qkv)
{
    TU_BEGIN_TEST();
    static const size_t shapes[][4] = {{2, 17, 4, 3}, {1, 65, 2, 16}, {3, 5, 16, 1}};
    const size_t batch = shapes[_i][0], seq = shapes[_i][1], heads = shapes[_i][2];
    const size_t head_dim = shapes[_i][3], embed = heads * head_dim;
    const size_t total = batch * seq * 3 * embed, count = batch * seq * embed;
    float *packed = tu_random_floats(total);
    cl_mem packed_mem = tu_upload_floats(packed, total);
    cl_mem dst_mem = tu_nan_buffer(count);
    double *ref = tu_doubles(count);
    float *got = tu_floats(count);
    float *poison = tu_nan_floats(count);
    for (size_t part = 0; part < 3; ++part) {
        tu_set_case("packed qkv part=%zu batch=%zu seq=%zu heads=%zu head_dim=%zu", part, batch,
                    seq, heads, head_dim);
        clattn_heads_desc desc = {batch, seq, heads, head_dim, 3 * embed};
        ref_split_heads(&desc, packed + part * embed, ref);
        tu_write_floats(dst_mem, 0, poison, count);
        clattn_status status =
            clattn_split_heads(tu_ctx(), &desc, tu_tensor(packed_mem, part * embed),
                               tu_tensor(dst_mem, 0), 0, NULL, NULL);
        if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_split_heads")) {
            tu_read_floats(dst_mem, 0, count, got);
            tu_expect_close("split part", got, ref, count, 0.0);
        }
    }
    free(poison);
    free(got);
    free(ref);
    tu_release_mem(dst_mem);
    tu_release_mem(packed_mem);
    free(packed);
    TU_END_TEST();
}
END_TEST

/* split then concat (chained by events) gives the input back, bit for bit, and leaves the row
 * gaps of the destination untouched. */
START_TEST(test_heads_round_trip)
{
    TU_BEGIN_TEST();
    const heads_case *hc = &heads_cases[_i];
    describe("round trip", hc);
    clattn_heads_desc desc = desc_of(hc);
    size_t count = hc->batch * hc->seq * hc->heads * hc->head_dim;
    size_t strided_total = hc->src_offset + strided_extent(hc);
    float *input = strided_input(hc, hc->src_offset, strided_total);
    cl_mem input_mem = tu_upload_floats(input, strided_total);
    cl_mem middle_mem = tu_nan_buffer(count);
    cl_mem output_mem = tu_nan_buffer(strided_total);
    cl_event split_done = NULL, concat_done = NULL;
    clattn_status status = clattn_split_heads(tu_ctx(), &desc, tu_tensor(input_mem, hc->src_offset),
                                              tu_tensor(middle_mem, 0), 0, NULL, &split_done);
    if (tu_expect_status(status, CLATTN_SUCCESS, "clattn_split_heads")) {
        status = clattn_concat_heads(tu_ctx(), &desc, tu_tensor(middle_mem, 0),
                                     tu_tensor(output_mem, hc->src_offset), 1, &split_done,
                                     &concat_done);
        tu_expect_status(status, CLATTN_SUCCESS, "clattn_concat_heads");
    }
    if (concat_done != NULL) {
        tu_expect(clWaitForEvents(1, &concat_done) == CL_SUCCESS, "clWaitForEvents failed");
        float *output = tu_floats(strided_total);
        tu_read_floats(output_mem, 0, strided_total, output);
        double *expected = tu_doubles(strided_total);
        tu_floats_to_doubles(input, strided_total, expected);
        expect_layout("round trip", output, expected, strided_total);
        free(expected);
        free(output);
        clReleaseEvent(concat_done);
    }
    if (split_done != NULL) {
        clReleaseEvent(split_done);
    }
    tu_release_mem(output_mem);
    tu_release_mem(middle_mem);
    tu_release_mem(input_mem);
    free(input);
    TU_END_TEST();
}
END_TEST

/* head_dim of q/k differs from v's: split both with the same batch/seq/heads. */
START_TEST(test_heads_qk_v_dims_differ)
{
    TU_BEGIN_TEST();
    heads_case qk_case = {2, 9, 3, 5, 0, 0, 0};
    heads_case v_case = {2, 9, 3, 11, 0, 0, 0};
    run_split(&qk_case);
    run_split(&v_case);
    run_concat(&v_case);
    TU_END_TEST();
}
END_TEST

static Suite *heads_suite(void)
{
    Suite *suite = suite_create("heads");
    TCase *copies = tcase_create("copies");
    tcase_set_timeout(copies, 600);
    tcase_add_loop_test(copies, test_split_heads, 0, COUNT_OF(heads_cases));
    tcase_add_loop_test(copies, test_concat_heads, 0, COUNT_OF(heads_cases));
    tcase_add_loop_test(copies, test_split_packed_qkv, 0, 3);
    tcase_add_loop_test(copies, test_heads_round_trip, 0, COUNT_OF(heads_cases));
    tcase_add_test(copies, test_heads_qk_v_dims_differ);
    suite_add_tcase(suite, copies);
    return suite;
}

int main(void)
{
    tu_suite_begin("check_heads");
    return tu_run_suite(heads_suite());
}
