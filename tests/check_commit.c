/* clattn_kv_commit (speculative decoding's commit): the accepted draft rows moved down in
 * contiguous and paged caches of every storage type, the key counts advanced, every other byte
 * of the caches unchanged, against a host model of the rule; bad lists end where the header
 * says; refusals name the argument. */
#include "problems.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

typedef struct commit_case {
    const char *label;
    size_t batch, heads, dk, dv; /* dv 0: no value cache */
    clattn_dtype dtype;
    size_t page_size, blocks; /* page_size 0: contiguous, blocks = capacity */
    size_t draft_len, max_accepted;
    int head_major; /* pools stored head-major within a page (clattn_kv_cache's layout) */
    size_t gap;     /* elements between rows (a multiple of 32 for block types) */
} commit_case;

static const commit_case cases[] = {
    {"contiguous F32", 3, 2, 17, 5, CLATTN_DTYPE_F32, 0, 37, 7, 8, 0, 0},
    {"contiguous F16, a row gap", 1, 1, 64, 64, CLATTN_DTYPE_F16, 0, 129, 17, 17, 0, 3},
    {"paged F32, pages of 16", 4, 3, 63, 65, CLATTN_DTYPE_F32, 16, 5, 11, 12, 0, 0},
    {"paged Q8_0, pages of 1", 2, 2, 64, 32, CLATTN_DTYPE_Q8_0, 1, 40, 9, 9, 0, 0},
    {"paged BF16 head-major, pages of 5, keys only", 3, 2, 3, 0, CLATTN_DTYPE_BF16, 5, 9, 13, 13, 1,
     0},
    {"contiguous Q4_0, a row gap", 2, 1, 96, 32, CLATTN_DTYPE_Q4_0, 0, 23, 5, 6, 0, 32},
    {"paged F16, pages of 48, one sequence", 1, 4, 128, 128, CLATTN_DTYPE_F16, 48, 3, 31, 31, 1, 0},
};
enum { NUM_CASES = sizeof cases / sizeof cases[0] };

/* One cache: its tensor and bytes (host), and where head h's key `pos` of sequence b lies. */
typedef struct cache {
    clattn_tensor t;
    uint8_t *bytes;
    size_t size, block, per, row_bytes;
} cache;

static size_t capacity_of(const commit_case *c)
{
    return c->page_size ? c->blocks * c->page_size : c->blocks;
}

static size_t num_pages_of(const commit_case *c)
{
    return c->page_size ? c->batch * c->blocks + 2 : 0; /* two pages no sequence holds */
}

/* A cache of head size d: packed rows `gap` apart, random bytes, at an offset of one block. */
static void make_cache(const commit_case *c, size_t d, cache *out)
{
    memset(out, 0, sizeof *out);
    out->block = (c->dtype == CLATTN_DTYPE_Q8_0 || c->dtype == CLATTN_DTYPE_Q4_0) ? 32 : 1;
    out->per = c->dtype == CLATTN_DTYPE_Q8_0   ? 34
               : c->dtype == CLATTN_DTYPE_Q4_0 ? 18
                                               : clattn_dtype_size(c->dtype);
    const size_t rs = d + c->gap, outer = c->page_size ? num_pages_of(c) : c->batch;
    const size_t keys = c->page_size ? c->page_size : c->blocks;
    clattn_tensor *t = &out->t;
    *t = (clattn_tensor){NULL, out->block, c->dtype, 4, {outer, 0, 0, d}, {0, 0, 0, 1}};
    if (!c->page_size) { /* (batch, heads, capacity, d) */
        t->dims[1] = c->heads, t->dims[2] = keys;
        t->strides[2] = rs, t->strides[1] = keys * rs, t->strides[0] = c->heads * keys * rs;
    } else { /* (pages, page_size, heads, d), head-major or slot-major within a page */
        t->dims[1] = keys, t->dims[2] = c->heads;
        t->strides[1] = c->head_major ? rs : c->heads * rs;
        t->strides[2] = c->head_major ? keys * rs : rs;
        t->strides[0] = c->heads * keys * rs;
    }
    const size_t elems = t->offset + outer * t->strides[0];
    out->size = (elems / out->block * out->per + 3) / 4 * 4;
    out->row_bytes = d / out->block * out->per;
    out->bytes = tu_bytes(out->size);
    for (size_t i = 0; i < out->size; ++i)
        out->bytes[i] = (uint8_t)tu_rand_below(256);
    t->mem = tu_upload_bytes(out->bytes, out->size);
}

/* The byte where head h's key `pos` of sequence b starts, or SIZE_MAX outside the cache. */
static size_t row_at(const commit_case *c, const cache *k, const int32_t *table, size_t b, size_t h,
                     size_t pos)
{
    if (pos >= capacity_of(c))
        return SIZE_MAX;
    const size_t *s = k->t.strides;
    size_t elem;
    if (c->page_size) {
        const int32_t page = table[b * c->blocks + pos / c->page_size];
        if (page < 0 || (size_t)page >= num_pages_of(c))
            return SIZE_MAX;
        elem = (size_t)page * s[0] + pos % c->page_size * s[1] + h * s[2];
    } else {
        elem = b * s[0] + h * s[1] + pos * s[2];
    }
    return (k->t.offset + elem) / k->block * k->per;
}

/* The rule, on the host: the accepted rows of each sequence moved in order, the counts. */
static void commit_model(const commit_case *c, cache *caches, size_t count, const int32_t *table,
                         const int32_t *accepted, int32_t *lengths)
{
    for (size_t b = 0; b < c->batch; ++b) {
        if (lengths[b] < 0)
            continue;
        const size_t base = (size_t)lengths[b];
        int32_t prev = -1;
        size_t taken = 0;
        for (size_t i = 0; i < c->max_accepted; ++i) {
            const int32_t t = accepted[b * c->max_accepted + i];
            if (t <= prev || t >= (int32_t)c->draft_len ||
                row_at(c, &caches[0], table, b, 0, base + (size_t)t) == SIZE_MAX ||
                row_at(c, &caches[0], table, b, 0, base + i) == SIZE_MAX)
                break;
            prev = t;
            ++taken;
            for (size_t n = 0; n < count; ++n)
                for (size_t h = 0; h < c->heads; ++h) {
                    cache *x = &caches[n];
                    memmove(x->bytes + row_at(c, x, table, b, h, base + i),
                            x->bytes + row_at(c, x, table, b, h, base + (size_t)t), x->row_bytes);
                }
        }
        lengths[b] = (int32_t)(base + taken);
    }
}

/* Each sequence's blocks in distinct shuffled pages; sequence 1's last block unmapped. */
static int32_t *make_table(const commit_case *c)
{
    const size_t pages = num_pages_of(c), entries = c->batch * c->blocks;
    int32_t *order = malloc(pages * sizeof *order), *table = malloc(entries * sizeof *table);
    for (size_t i = 0; i < pages; ++i)
        order[i] = (int32_t)i;
    for (size_t i = pages; i > 1; --i) {
        const size_t j = tu_rand_below(i);
        const int32_t swap = order[i - 1];
        order[i - 1] = order[j], order[j] = swap;
    }
    for (size_t i = 0; i < entries; ++i)
        table[i] = order[i];
    if (c->batch > 1)
        table[2 * c->blocks - 1] = -1;
    free(order);
    return table;
}

/* Rising draft indices, some lists ended early by -1 and some by a bad entry (a repeat, one
 * past the drafts); counts from 0 to near the capacity (drafts past the cache), one -1. */
static void make_lists(const commit_case *c, int32_t *accepted, int32_t *lengths)
{
    const size_t capacity = capacity_of(c);
    for (size_t b = 0; b < c->batch; ++b) {
        int32_t *row = accepted + b * c->max_accepted;
        int32_t next = (int32_t)tu_rand_below(3);
        for (size_t i = 0; i < c->max_accepted; ++i) {
            row[i] = next < (int32_t)c->draft_len ? next : -1;
            next += 1 + (int32_t)tu_rand_below(3);
        }
        if (b == 1 && c->max_accepted > 3)
            row[3] = row[2]; /* a repeat ends the list */
        if (b == 2 && c->max_accepted > 2)
            row[2] = (int32_t)c->draft_len; /* past the drafts */
        lengths[b] = (int32_t)tu_rand_below(capacity - c->draft_len / 2);
    }
    if (c->batch > 3)
        lengths[3] = -1; /* left alone */
}

static void read_bytes(cl_mem mem, uint8_t *dst, size_t size)
{
    tu_read_floats(mem, 0, size / 4, (float *)(void *)dst);
}

START_TEST(test_commit_rows)
{
    TU_BEGIN_TEST();
    const commit_case *c = &cases[_i];
    tu_set_case("%s: batch %zu, heads %zu, d %zu/%zu, capacity %zu, drafts %zu", c->label, c->batch,
                c->heads, c->dk, c->dv, capacity_of(c), c->draft_len);
    cache caches[2] = {0};
    const size_t count = c->dv ? 2 : 1;
    make_cache(c, c->dk, &caches[0]);
    if (c->dv)
        make_cache(c, c->dv, &caches[1]);
    int32_t *table = c->page_size ? make_table(c) : NULL;
    int32_t *accepted = malloc(c->batch * c->max_accepted * sizeof *accepted);
    int32_t *lengths = malloc((c->batch + 1) * sizeof *lengths);
    make_lists(c, accepted, lengths);
    clattn_kv_commit_desc desc;
    clattn_kv_commit_desc_init(&desc);
    desc.k = caches[0].t;
    if (c->dv)
        desc.v = caches[1].t;
    if (table)
        desc.block_table = clattn_tensor_make(tu_upload_bytes(table, c->batch * c->blocks * 4), 0,
                                              CLATTN_DTYPE_I32, 2, c->batch, c->blocks, 0, 0);
    desc.accepted = clattn_tensor_make(tu_upload_bytes(accepted, c->batch * c->max_accepted * 4), 0,
                                       CLATTN_DTYPE_I32, 2, c->batch, c->max_accepted, 0, 0);
    /* the counts at offset 1 of their buffer */
    int32_t *padded = malloc((c->batch + 1) * sizeof *padded);
    padded[0] = 12345;
    memcpy(padded + 1, lengths, c->batch * sizeof *lengths);
    desc.kv_seqlen = clattn_tensor_make(tu_upload_bytes(padded, (c->batch + 1) * 4), 1,
                                        CLATTN_DTYPE_I32, 1, c->batch, 0, 0, 0);
    desc.draft_len = c->draft_len;
    tu_expect_status(clattn_kv_commit(tu_ctx(), &desc, 0, NULL, NULL), CLATTN_SUCCESS,
                     "clattn_kv_commit");
    commit_model(c, caches, count, table, accepted, lengths);
    for (size_t n = 0; n < count; ++n) {
        uint8_t *got = tu_bytes(caches[n].size);
        read_bytes(caches[n].t.mem, got, caches[n].size);
        size_t first = SIZE_MAX;
        for (size_t i = 0; i < caches[n].size && first == SIZE_MAX; ++i)
            if (got[i] != caches[n].bytes[i])
                first = i;
        tu_expect(first == SIZE_MAX, "%s: byte %zu differs from the model's (of %zu)",
                  n ? "v" : "k", first, caches[n].size);
        free(got);
    }
    int32_t *got_lengths = malloc((c->batch + 1) * sizeof *got_lengths);
    read_bytes(desc.kv_seqlen.mem, (uint8_t *)got_lengths, (c->batch + 1) * 4);
    tu_expect(got_lengths[0] == 12345, "kv_seqlen's buffer before the tensor was written");
    for (size_t b = 0; b < c->batch; ++b)
        tu_expect(got_lengths[b + 1] == lengths[b], "kv_seqlen[%zu] = %d, expected %d", b,
                  got_lengths[b + 1], lengths[b]);
    for (size_t n = 0; n < count; ++n) {
        tu_release_mem(caches[n].t.mem);
        free(caches[n].bytes);
    }
    tu_release_mem(desc.block_table.mem);
    tu_release_mem(desc.accepted.mem);
    tu_release_mem(desc.kv_seqlen.mem);
    free(table), free(accepted), free(lengths), free(padded), free(got_lengths);
    TU_END_TEST();
}
END_TEST

/* A refusal: status, the message naming `needle`, nothing enqueued. */
static void expect_refused(const clattn_kv_commit_desc *desc, clattn_status want,
                           const char *needle, const char *given)
{
    tu_set_case("%s", given);
    const clattn_status got = clattn_kv_commit(tu_ctx(), desc, 0, NULL, NULL);
    tu_expect(got == want, "status %s, expected %s (%s)", clattn_status_string(got),
              clattn_status_string(want), clattn_last_error(tu_ctx()));
    tu_expect(strstr(clattn_last_error(tu_ctx()), needle) != NULL &&
                  tu_starts_with(clattn_last_error(tu_ctx()), "kv_commit: "),
              "message '%s' should start with 'kv_commit: ' and name '%s'",
              clattn_last_error(tu_ctx()), needle);
}

START_TEST(test_commit_refusals)
{
    TU_BEGIN_TEST();
    cl_mem k = tu_nan_buffer(2 * 2 * 3 * 10 * 8), v = tu_nan_buffer(2 * 3 * 10 * 8);
    cl_mem ints = tu_nan_buffer(64);
    clattn_kv_commit_desc good;
    clattn_kv_commit_desc_init(&good);
    good.k = clattn_tensor_make(k, 0, CLATTN_DTYPE_F32, 4, 2, 3, 10, 8);
    good.v = clattn_tensor_make(v, 0, CLATTN_DTYPE_F32, 4, 2, 3, 10, 8);
    good.kv_seqlen = clattn_tensor_make(ints, 0, CLATTN_DTYPE_I32, 1, 2, 0, 0, 0);
    good.accepted = clattn_tensor_make(ints, 8, CLATTN_DTYPE_I32, 2, 2, 4, 0, 0);
    good.draft_len = 4;
    clattn_kv_commit_desc d = good;
    tu_expect_status(clattn_kv_commit(tu_ctx(), &d, 0, NULL, NULL), CLATTN_SUCCESS, "good");
    tu_expect(clattn_kv_commit(NULL, &d, 0, NULL, NULL) == CLATTN_ERR_INVALID_ARGUMENT, "NULL ctx");
    expect_refused(NULL, CLATTN_ERR_INVALID_ARGUMENT, "desc", "NULL desc");
    d = good, d.struct_size = 8;
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "struct_size", "struct_size 8");
    d = good, d.k.rank = 0;
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "k is absent", "no k");
    d = good, d.k.rank = 3;
    expect_refused(&d, CLATTN_ERR_INVALID_SHAPE, "k has rank 3", "k of rank 3");
    d = good, d.k.dtype = CLATTN_DTYPE_U8;
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "k cannot be U8", "k of U8");
    d = good, d.v.dims[2] = 9;
    expect_refused(&d, CLATTN_ERR_INVALID_SHAPE, "v is (2, 3, 9, 8)", "v of 9 keys");
    d = good, d.kv_seqlen.dims[0] = 3;
    expect_refused(&d, CLATTN_ERR_INVALID_SHAPE, "kv_seqlen is (3)", "kv_seqlen of 3");
    d = good, d.accepted.dtype = CLATTN_DTYPE_F32;
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "accepted cannot be F32", "accepted F32");
    d = good, d.draft_len = 0;
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "draft_len = 0", "no drafts");
    d = good, d.k.strides[3] = 2, d.k.dims[3] = 4;
    d.v.dims[3] = 4;
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "stride 2 along head_dim", "k strided rows");
    d = good, d.v.mem = k, d.v.offset = 8;
    expect_refused(&d, CLATTN_ERR_INVALID_ARGUMENT, "k and v overlap", "v inside k");
    d = good, d.v.mem = k, d.v.offset = 2 * 3 * 10 * 8; /* after k in its buffer */
    tu_expect_status(clattn_kv_commit(tu_ctx(), &d, 0, NULL, NULL), CLATTN_SUCCESS, "v after k");
    d = good, d.block_table = clattn_tensor_make(ints, 0, CLATTN_DTYPE_I32, 2, 3, 2, 0, 0);
    expect_refused(&d, CLATTN_ERR_INVALID_SHAPE, "batch is 3", "a table of 3 rows, counts of 2");
    d = good, d.accepted.dims[0] = 100, d.accepted.strides[0] = 4;
    expect_refused(&d, CLATTN_ERR_INVALID_SHAPE, "accepted (100, 4)", "accepted of 100 rows");
    d = good, d.accepted.offset = 60;
    expect_refused(&d, CLATTN_ERR_BUFFER_TOO_SMALL, "accepted buffer too small",
                   "accepted past its buffer");
    tu_release_mem(k), tu_release_mem(v), tu_release_mem(ints);
    TU_END_TEST();
}
END_TEST


/* --- the tree mask (clattn_flex_tree_mask) ------------------------------------------------ */

/* Each sequence's draft tree: parents first (draft i's parent below i, or -1: the prefix);
 * bits (i, j) = j is i or an ancestor, n x n row-major, LSB first, from byte offsets[b]. */
static uint8_t *tree_bits(const size_t *n, size_t batch, size_t *offsets, size_t *total)
{
    *total = 0;
    for (size_t b = 0; b < batch; ++b)
        offsets[b] = *total, *total += (n[b] * n[b] + 7) / 8;
    uint8_t *bits = tu_bytes(*total + 1);
    for (size_t b = 0; b < batch; ++b) {
        int parent[64];
        for (size_t i = 0; i < n[b]; ++i) {
            parent[i] = i == 0 ? -1 : (int)tu_rand_below(i + 1) - 1;
            for (int j = (int)i; j >= 0; j = j == (int)i ? parent[i] : parent[j]) {
                const size_t bit = i * n[b] + (size_t)j;
                bits[offsets[b] + bit / 8] |= (uint8_t)(1u << (bit % 8));
            }
        }
    }
    return bits;
}

static int tree_keeps(const uint8_t *bits, size_t offset, size_t n, size_t start, size_t i,
                      size_t j)
{
    if (j < start || n == 0)
        return 1;
    if (j - start >= n || i >= n)
        return 0;
    const size_t bit = i * n + (j - start);
    return (bits[offset + bit / 8] >> (bit % 8)) & 1;
}

/* A verification step: drafts (7, 3 and none) after each sequence's prefix in a paged or
 * contiguous cache, the tree mask against the float64 reference of the same rule as a bool
 * attn_mask (rows past a sequence's drafts see its prefix only). */
START_TEST(test_tree_mask)
{
    TU_BEGIN_TEST();
    static const size_t pages[] = {16, 1, 0};
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    spec.batch = 3, spec.heads = 4, spec.kv_heads = _i == 1 ? 4 : 2;
    spec.seq_q = 7, spec.seq_k = pages[_i] ? pages[_i] * (_i ? 29 : 5) : 65;
    spec.dk = 16, spec.dv = 8, spec.kv_len = 1, spec.page_size = pages[_i];
    spec.path = CLATTN_PATH_FUSED;
    spec.causal = _i == 2 ? CLATTN_CAUSAL_NONE : CLATTN_CAUSAL_BOTTOM_RIGHT;
    spec.mask = PB_MASK_BOOL, spec.mask_rank = 4, spec.mask_ones = PB_MASK_ONES_H;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &spec);
    size_t n[3] = {7, 3, 0}, offsets[3], total = 0;
    for (size_t b = 0; b < 3; ++b) /* the drafts are a sequence's last keys (drawn counts) */
        n[b] = n[b] < (size_t)p.kv_len[b] ? n[b] : (size_t)p.kv_len[b];
    uint8_t *bits = tree_bits(n, 3, offsets, &total);
    int32_t meta[9];
    for (size_t b = 0; b < 3; ++b) {
        meta[3 * b] = p.kv_len[b] - (int32_t)n[b], meta[3 * b + 1] = (int32_t)n[b];
        meta[3 * b + 2] = (int32_t)offsets[b];
        for (size_t i = 0; i < spec.seq_q; ++i)
            for (size_t j = 0; j < spec.seq_k; ++j)
                p.mask[(b * spec.seq_q + i) * spec.seq_k + j] =
                    (float)tree_keeps(bits, offsets[b], n[b], (size_t)meta[3 * b], i, j);
    }
    pb_sdpa_reference(&p);
    tu_set_case("tree mask, %s", p.label);
    clattn_tensors layouts = p.layouts, bound;
    layouts.attn_mask.rank = 0;
    layouts.flex_aux0 = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_U8, 1, total + 1, 0, 0, 0);
    layouts.flex_aux1 = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_I32, 2, 3, 3, 0, 0);
    clattn_sdpa_desc desc;
    pb_sdpa_desc(&p, &desc);
    CLATTN_BIND_ROLES(desc, layouts);
    clattn_flex_tree_mask(&desc.flex);
    clattn_plan *plan = NULL;
    if (tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &desc, &plan), CLATTN_SUCCESS,
                         "create") &&
        tu_expect(pb_sdpa_upload(tu_ctx(), &p, &bound) == CL_SUCCESS, "upload")) {
        tu_release_mem(bound.attn_mask.mem);
        bound.attn_mask = layouts.attn_mask;
        bound.flex_aux0 = layouts.flex_aux0, bound.flex_aux1 = layouts.flex_aux1;
        bound.flex_aux0.mem = tu_upload_bytes(bits, total + 1);
        bound.flex_aux1.mem = tu_upload_bytes(meta, sizeof meta);
        if (tu_expect_status(clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL,
                                                 NULL, 0, NULL, NULL),
                             CLATTN_SUCCESS, "execute"))
            pb_sdpa_check(tu_ctx(), NULL, &p, &bound);
        pb_release_tensors(&bound);
    }
    clattn_plan_release(plan);
    free(bits);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

static Suite *commit_suite(void)
{
    Suite *suite = suite_create("commit");
    TCase *rows = tu_tcase(suite, "rows", 300);
    tcase_add_loop_test(rows, test_commit_rows, 0, NUM_CASES);
    TCase *refusals = tu_tcase(suite, "refusals", 120);
    tcase_add_test(refusals, test_commit_refusals);
    TCase *tree = tu_tcase(suite, "tree", 300);
    tcase_add_loop_test(tree, test_tree_mask, 0, 3);
    return suite;
}

int main(void)
{
    return tu_main("check_commit", commit_suite);
}
