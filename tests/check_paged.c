/* A paged KV cache's decode (issue 50: paged decode at the contiguous rate), in numbers. The
 * fused kernels read a decode tile's keys a page's run at a time (flash_cpu.cl's
 * fc_paged_runs: one table read and one base a run, rows at the slot stride inside), so the
 * runs' edges are what can go wrong: pages of 16, 64 and 256 keys (a 64-key tile holds four
 * pages, exactly one, or a quarter of one), pages that are not a multiple of the tile or of
 * its 16-key vectors (17, 48, 1), key counts that end inside a page or a tile (1, 17, 65,
 * 1031), pages in a shuffled order with spare ones, blocks past a sequence's count pointing
 * outside the pool (never read), grouped-query heads (8 / 2 and 32 / 8, d = 128), several query
 * rows (bottom-right causal: the packed tiles' path) and decode splits (a context that splits
 * from 16 keys). Each output against the float64 reference (tests/reference.c through
 * problems.c), poisoned with NaN first; the pools hold NaN in every slot no key uses. */
#include "problems.h"
#include "testutil.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct paged_case {
    size_t page_size, blocks, heads, kv_heads, d, seq_q;
    int counts[3]; /* the key count of each sequence (B = 3; -1: B = 1) */
    int splits;    /* 1: on the context whose decode splits start at 16 keys */
} paged_case;

static const paged_case cases[] = {
    /* four pages a tile; counts ending in the first page, inside the second tile */
    {16, 5, 8, 8, 64, 1, {1, 17, 65}, 0},
    /* a page a tile; GQA 8 / 2 at d = 128; 1031 keys: a partial last page and tile */
    {64, 17, 8, 2, 128, 1, {1031, 64, 129}, 0},
    /* four tiles a page; a sequence of one key */
    {256, 5, 4, 4, 64, 1, {1031, 257, 1}, 0},
    /* pages no tile edge meets twice at the same slot */
    {17, 61, 8, 2, 128, 1, {65, 1031, 17}, 0},
    /* three quarters of a tile a page; three query rows (packed tiles), causal */
    {48, 3, 4, 4, 64, 3, {100, 47, 1}, 0},
    /* one key a page: 64 runs a tile */
    {1, 70, 4, 2, 64, 1, {65, 3, 1}, 0},
    /* the decode splits (16 keys each at least) over pages of 256 and of 16 */
    {256, 5, 4, 4, 64, 1, {1031, 300, 2}, 1},
    {16, 65, 4, 2, 64, 1, {1031, 18, 1}, 1},
    /* the serving shape: GQA 32 / 8 at d = 128, pages of 64 */
    {64, 17, 32, 8, 128, 1, {1031, -1, -1}, 0},
};
enum { CASES = sizeof cases / sizeof cases[0] };

/* decode splits from 16 keys (the tuning row's decode_keys), CPU decode tiles prefetching */
static clattn_ctx *split_ctx;

static void release_split_ctx(void)
{
    clattn_ctx_release(split_ctx);
    split_ctx = NULL;
}

static clattn_ctx *case_ctx(const paged_case *c)
{
    if (!c->splits)
        return tu_ctx();
    if (split_ctx == NULL) {
        clattn_ctx_desc desc;
        clattn_ctx_desc_init(&desc);
        desc.queue = clattn_ctx_queue(tu_ctx());
        /* (and the prefetching decode tiles at any size: flash_cpu_pf_min=0) */
        desc.tuning_rows = "any | * | * | decode_keys=16 flash_cpu_pf_min=0";
        char message[512] = "";
        tu_expect_status(clattn_ctx_create_desc(&desc, &split_ctx, message, sizeof message),
                         CLATTN_SUCCESS, "the decode-splits context");
    }
    return split_ctx;
}

/* The problem with the case's counts: the table's blocks past a count point outside the pool
 * (-1 or past its end), then the float64 reference on those counts. */
static void make_case(const paged_case *c, pb_sdpa_problem *p)
{
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    spec.batch = c->counts[1] < 0 ? 1 : 3;
    spec.heads = c->heads, spec.kv_heads = c->kv_heads;
    spec.seq_q = c->seq_q, spec.seq_k = c->page_size * c->blocks;
    spec.dk = spec.dv = c->d;
    spec.page_size = c->page_size;
    spec.causal = c->seq_q > 1 ? CLATTN_CAUSAL_BOTTOM_RIGHT : CLATTN_CAUSAL_NONE;
    spec.want_lse = 1;
    spec.path = CLATTN_PATH_FUSED;
    spec.skip_reference = 1;
    pb_sdpa_make(p, &spec);
    const size_t ps = c->page_size, blocks = p->blocks, pool = p->num_pages;
    size_t *order = malloc(pool * sizeof *order); /* the pool's pages, shuffled */
    for (size_t i = 0; i < pool; ++i)
        order[i] = i;
    for (size_t i = pool; i > 1; --i) {
        const size_t j = tu_rand_below(i), swap = order[i - 1];
        order[i - 1] = order[j];
        order[j] = swap;
    }
    for (size_t b = 0, next = 0; b < spec.batch; ++b) {
        const size_t count = (size_t)c->counts[b], used = (count + ps - 1) / ps;
        p->kv_len[b] = (int32_t)count;
        for (size_t blk = 0; blk < blocks; ++blk)
            p->block_table[b * blocks + blk] = blk < used ? (int32_t)order[next++]
                                               : blk % 2  ? -1
                                                          : (int32_t)(pool + blk);
    }
    free(order);
    p->spec.skip_reference = 0;
    pb_sdpa_reference(p);
}

START_TEST(test_paged_decode)
{
    TU_BEGIN_TEST();
    const paged_case *c = &cases[_i];
    clattn_ctx *ctx = case_ctx(c);
    if (ctx == NULL) {
        TU_END_TEST();
        return;
    }
    pb_sdpa_problem p;
    make_case(c, &p);
    tu_set_case("pages of %zu, counts %d %d %d, H=%zu Hkv=%zu d=%zu Lq=%zu%s: %s", c->page_size,
                c->counts[0], c->counts[1], c->counts[2], c->heads, c->kv_heads, c->d, c->seq_q,
                c->splits ? ", decode splits" : "", p.label);
    clattn_sdpa_desc desc;
    pb_sdpa_desc(&p, &desc);
    clattn_plan *plan = NULL;
    if (tu_expect_status(clattn_sdpa_plan_create(ctx, &desc, &plan), CLATTN_SUCCESS, "create"))
        tu_expect_status(pb_sdpa_execute_twice(ctx, plan, &p), CLATTN_SUCCESS,
                         "execute twice"); /* the scratch is reused */
    clattn_plan_release(plan);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

int main(void)
{
    tu_suite_begin("check_paged");
    Suite *suite = suite_create("paged");
    TCase *tc = tu_tcase(suite, "paged decode", 900);
    /* Small scale (Oclgrind): the cases of at most 100 keys a sequence, which still take pages
     * of 16, 48 and 1 (runs inside and across tiles, partial pages), three causal rows and
     * grouped heads; the 1031-key ones are minutes there. */
    static const int heavy[] = {1, 2, 3, 6, 7, 8};
    if (tu_small())
        tu_not_run("test_paged_decode cases 1-3, 6-8 (1031 keys: minutes on Oclgrind; PoCL "
                   "runs them at the default scale)");
    tu_add_loop_except(tc, test_paged_decode, 0, CASES, heavy, tu_small() ? 6 : 0);
    tcase_add_unchecked_fixture(tc, NULL, release_split_ctx);
    return tu_run_suite(suite);
}
