/* Dropout on the attention weights (clattn_sdpa_desc.dropout_p, _seed, _offset), in numbers:
 *   1. the reference's Philox 4x32-10 against Random123's known answers (tests/kat_vectors),
 *      and the library's host rule (clattn_dropout_keep) at those very blocks;
 *   2. clattn_dropout_keep against ref_dropout_factor on random (p, seed, stream, row, key),
 *      at the threshold's boundary, and its refusals (-1);
 *   3. the mask every kernel draws, weight by weight: V is the identity of each k/v head and
 *      dv = seq_k, so out[b, h, i, j] is the dropped weight w_ij z_ij (the unfused path's
 *      weights output too): every zero and nonzero must be the reference's exactly, every value
 *      within 1e-5 of the float64 reference. Each problem's p is the boundary of one of its
 *      visible weights (p = u / 2^32 for that weight's Philox word u: kept, by u >= floor(p 2^32),
 *      and dropped by a `>`), so an off-by-one threshold shows;
 *   4. the kept fraction over 2^20 host decisions (each lane of a block too) and a device
 *      weights output, within 5 sigma of 1 - p;
 *   5. determinism and the (seed, offset) contract: one plan twice gives the same bits, another
 *      seed another mask, batch b of a call is a one-batch call at offset + b * heads, p = 0 is
 *      no dropout to the bit, p = 1 zeroes out (and the backward's dQ, dK, dV); the backward
 *      at a boundary p against the float64 reference;
 *   6. the refusals: p outside [0, 1] or NaN (forward and backward), dropout with packed
 *      sequences, a paged cache or quantized k/v.
 * Every output is poisoned (NaN) before each run. Which kernels draw the masks is the
 * device's and the tuning's (printed at the end): on a CPU flash_cpu.cl, the vector softmax and
 * the CPU backward; with CLATTN_PARAMS=gpu (ctest dropout_gpu_params, the Oclgrind lane)
 * flash_gpu.cl, the group softmax and the generic backward; with CLATTN_TUNING=default (ctest
 * dropout_default_tuning) flash.cl. */
#include "problems.h"
#include "reference.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TWO_32 4294967296.0

/* Word key % 4 of the Philox block of (seed, stream, row, key) (the reference's generator). */
static uint32_t philox_word(uint64_t seed, uint64_t stream, uint32_t row, uint32_t key)
{
    const uint32_t ctr[4] = {key / 4, row, (uint32_t)stream, (uint32_t)(stream >> 32)};
    const uint32_t k[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t out[4];
    ref_philox4x32_10(ctr, k, out);
    return out[key % 4];
}

/* --- 1. Philox known answers ---------------------------------------------------------------- */

/* Random123's tests/kat_vectors, the three "philox4x32 10" lines (DEShawResearch/random123 at
 * 9545ff6413f258be2f04c1d319d99aaef7521150): counter (4 words), key (2 words), output. */
static const struct {
    uint32_t ctr[4], key[2], want[4];
} known_answers[3] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000},
     {0x00000000, 0x00000000},
     {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

START_TEST(test_philox_known_answers)
{
    TU_BEGIN_TEST();
    for (int v = 0; v < 3; ++v) {
        const uint32_t *ctr = known_answers[v].ctr, *key = known_answers[v].key;
        const uint32_t *want = known_answers[v].want;
        tu_set_case("Random123 kat_vectors philox4x32 10, line %d", v + 1);
        uint32_t got[4];
        ref_philox4x32_10(ctr, key, got);
        tu_expect(memcmp(got, want, sizeof got) == 0,
                  "ref_philox4x32_10(ctr %08x %08x %08x %08x, key %08x %08x) = %08x %08x %08x "
                  "%08x, Random123 says %08x %08x %08x %08x",
                  ctr[0], ctr[1], ctr[2], ctr[3], key[0], key[1], got[0], got[1], got[2], got[3],
                  want[0], want[1], want[2], want[3]);
        /* The library's own generator at the same block (key index 4 ctr[0] + w, where that
         * fits 32 bits): word u is kept at p = u / 2^32 (u >= floor(p 2^32)), dropped at
         * (u + 1) / 2^32. */
        const uint64_t seed = key[0] | (uint64_t)key[1] << 32;
        const uint64_t stream = ctr[2] | (uint64_t)ctr[3] << 32;
        for (uint32_t w = 0; w < 4; ++w) {
            const uint64_t at = 4 * (uint64_t)ctr[0] + w;
            if (at > UINT32_MAX) {
                tu_expect(clattn_dropout_keep(0.5, seed, stream, ctr[1], (size_t)at) == -1,
                          "clattn_dropout_keep: key %llu past 2^32 - 1 is not refused",
                          (unsigned long long)at);
                continue;
            }
            const int at_word = clattn_dropout_keep(want[w] / TWO_32, seed, stream, ctr[1], at);
            const int above = want[w] == UINT32_MAX ? 0
                              : clattn_dropout_keep((want[w] + 1.0) / TWO_32, seed, stream,
                                                    ctr[1], at);
            tu_expect(at_word == 1 && above == 0,
                      "clattn_dropout_keep at Random123's word %u (%08x) of the block: %d at p "
                      "= u / 2^32 (want 1), %d at (u + 1) / 2^32 (want 0)",
                      w, want[w], at_word, above);
        }
    }
    TU_END_TEST();
}
END_TEST

/* --- 2. clattn_dropout_keep against the reference --------------------------------------------- */

/* A stream: below 2^32, just around it, or anywhere (mostly above). */
static uint64_t draw_stream(void)
{
    switch (tu_rand_below(3)) {
    case 0: return tu_rand_below((size_t)1 << 31);
    case 1: return ((uint64_t)1 << 32) - 3 + tu_rand_below(6);
    default: return tu_rand_u64();
    }
}

START_TEST(test_keep_matches_reference)
{
    TU_BEGIN_TEST();
    tu_set_case("random (p, seed, stream, row, key)");
    const size_t draws = 60000;
    size_t wrong = 0, boundaries = 0, high_streams = 0, odd_keys = 0;
    for (size_t n = 0; n < draws; ++n) {
        /* by (b, h): stream = offset + b * heads + h, as ref_dropout_factor composes it */
        ref_sdpa_shape shape;
        memset(&shape, 0, sizeof shape);
        shape.heads = 1 + tu_rand_below(16);
        const size_t b = tu_rand_below(4), h = tu_rand_below(shape.heads);
        shape.dropout_seed = tu_rand_below(4) == 0 ? tu_rand_below(8) : tu_rand_u64();
        shape.dropout_offset = draw_stream();
        const uint64_t stream = shape.dropout_offset + b * shape.heads + h;
        const size_t row = tu_rand_below(2) ? tu_rand_below(64) : (size_t)(tu_rand_u64() >> 32);
        const size_t key = tu_rand_below(2) ? tu_rand_below(300) : (size_t)(tu_rand_u64() >> 32);
        const uint32_t word = philox_word(shape.dropout_seed, stream, (uint32_t)row,
                                          (uint32_t)key);
        double p;
        const size_t kind = tu_rand_below(10);
        boundaries += kind == 3 || kind == 4;
        switch (kind) {
        case 0: p = 0.0; break;
        case 1: p = 1e-12; break; /* threshold 0: all kept */
        case 2: p = 1.0 - 1e-12; break;
        case 3: p = word / TWO_32; break;                   /* the boundary: kept */
        case 4: p = fmin(1.0, (word + 1.0) / TWO_32); break; /* just above: dropped */
        case 5: p = 1.0; break;
        default: p = tu_rand_unit(); break;
        }
        shape.dropout_p = p;
        high_streams += stream > UINT32_MAX;
        odd_keys += key % 4 != 0;
        /* p = 1: scale 0 (every factor 0), but the rule still reads: kept when u >= 2^32 - 1 */
        const int want = p == 0.0   ? 1
                         : p == 1.0 ? word == UINT32_MAX
                                    : ref_dropout_factor(&shape, b, h, row, key) != 0.0;
        const int got = clattn_dropout_keep(p, shape.dropout_seed, stream, row, key);
        if (got != want && wrong++ < 5)
            tu_expect(0,
                      "clattn_dropout_keep(p %.17g, seed %#llx, stream %#llx, row %zu, key %zu) "
                      "= %d, the reference %d (word %08x, threshold %.0f)",
                      p, (unsigned long long)shape.dropout_seed, (unsigned long long)stream, row,
                      key, got, want, word, floor(p * TWO_32));
    }
    tu_expect(wrong == 0, "%zu of %zu decisions differ from the reference", wrong, draws);
    tu_expect(high_streams > draws / 4 && odd_keys > draws / 2 && boundaries > draws / 8,
              "the draws missed streams past 2^32 (%zu), keys not multiples of 4 (%zu) or "
              "the threshold's boundary (%zu)",
              high_streams, odd_keys, boundaries);

    /* Refusals: -1 for p outside [0, 1] or NaN, rows and keys past 2^32 - 1 */
    const double bad_p[4] = {-0.1, 1.5, NAN, INFINITY};
    for (int i = 0; i < 4; ++i)
        tu_expect(clattn_dropout_keep(bad_p[i], 1, 2, 3, 4) == -1,
                  "clattn_dropout_keep(p = %g) is not -1", bad_p[i]);
    tu_expect(clattn_dropout_keep(-0.0, 1, 2, 3, 4) == 1, "p = -0 (zero) does not keep");
    tu_expect(clattn_dropout_keep(0.0, 1, 2, 3, 4) == 1, "p = 0 does not keep");
    const uint64_t top = UINT32_MAX;
    const int at_top = clattn_dropout_keep(0.5, 9, 10, (size_t)top, (size_t)top);
    tu_expect(at_top == (philox_word(9, 10, UINT32_MAX, UINT32_MAX) >= (uint32_t)1 << 31),
              "row = key = 2^32 - 1: %d, not the reference's", at_top);
#if SIZE_MAX > UINT32_MAX
    tu_expect(clattn_dropout_keep(0.5, 1, 2, (size_t)top + 1, 0) == -1, "row 2^32 accepted");
    tu_expect(clattn_dropout_keep(0.5, 1, 2, 0, (size_t)top + 1) == -1, "key 2^32 accepted");
    tu_expect(clattn_dropout_keep(0.0, 1, 2, 0, (size_t)top + 1) == -1,
              "key 2^32 accepted at p = 0");
#endif
    TU_END_TEST();
}
END_TEST

/* --- 3. the device's masks -------------------------------------------------------------------- */

/* A problem whose output reveals the dropped weights: dv = seq_k, V the identity per k/v head. */
typedef struct mask_case {
    size_t batch, heads, kv_heads, seq_q, seq_k, dk;
    clattn_causal causal;
    clattn_path path;
    int weights, softmax_f64; /* the weights output, the double softmax (UNFUSED) */
    double near;              /* the boundary p sought (a weight whose word is close) */
    uint64_t seed, offset;
    const char *what;
} mask_case;

#define TL CLATTN_CAUSAL_TOP_LEFT
#define BR CLATTN_CAUSAL_BOTTOM_RIGHT
#define NO_CAUSAL CLATTN_CAUSAL_NONE
#define FUSED CLATTN_PATH_FUSED
#define UNFUSED CLATTN_PATH_UNFUSED

static const mask_case mask_cases[] = {
    {1, 1, 0, 1, 1, 16, NO_CAUSAL, FUSED, 0, 0, 0.5, 1, 0, "one row, one key"},
    {1, 2, 0, 5, 3, 8, NO_CAUSAL, FUSED, 0, 0, 0.3, 0xdeadbeefcafef00dull, 7, "3 keys"},
    {2, 2, 0, 7, 17, 16, TL, FUSED, 0, 0, 0.5, 42, ((uint64_t)1 << 32) - 3,
     "streams across 2^32, Lq != Lk, causal top-left"},
    {2, 1, 0, 9, 65, 32, BR, FUSED, 0, 0, 0.7, 0x0123456789abcdefull, 1000,
     "65 keys, batch 2 at offset 1000, causal bottom-right"},
    {1, 2, 0, 4, 64, 16, NO_CAUSAL, FUSED, 0, 0, 0.6, 99, 0, "one whole 64-key tile"},
    {1, 4, 2, 6, 31, 16, TL, FUSED, 0, 0, 0.3, 5, 3, "GQA 2:1 prefill"},
    {2, 8, 2, 1, 70, 16, BR, FUSED, 0, 0, 0.4, 0xfeedull, 5,
     "GQA 4:1 decode (query heads must not be grouped as rows)"},
    {2, 1, 0, 6, 65, 16, BR, UNFUSED, 0, 0, 0.5, 77, 11, "unfused, no weights output"},
    {2, 1, 0, 5, 65, 16, NO_CAUSAL, UNFUSED, 1, 0, 0.5, 3, ((uint64_t)1 << 32) - 1,
     "unfused weights: a 64-key block and a tail; streams across 2^32"},
    {1, 2, 0, 5, 3, 8, TL, UNFUSED, 1, 0, 0.7, 8, 0, "unfused weights, 3 keys"},
    {1, 4, 2, 1, 37, 16, BR, UNFUSED, 1, 0, 0.4, 21, 2, "unfused weights, GQA decode"},
    {1, 3, 0, 3, 1, 4, NO_CAUSAL, UNFUSED, 1, 1, 0.5, 6, 0, "unfused weights in double, 1 key"},
    /* heavy (left out at small scale: minutes under Oclgrind) */
    {1, 3, 0, 63, 63, 16, TL, FUSED, 0, 0, 0.2, 0xabcdefull, 0, "63 x 63, causal top-left"},
    {1, 2, 0, 20, 127, 24, NO_CAUSAL, FUSED, 0, 0, 0.1, UINT64_MAX, 0, "127 keys, d = 24"},
    {1, 1, 0, 33, 129, 16, BR, FUSED, 0, 0, 0.9, 1234567, 0, "129 keys, p ~ 0.9"},
    {1, 4, 1, 1, 129, 64, NO_CAUSAL, FUSED, 0, 0, 0.5, 31, 0xfffffffffffffff0ull,
     "GQA 4:1 decode, 129 keys, streams wrapping 2^64"},
    {1, 3, 0, 17, 129, 16, BR, UNFUSED, 1, 1, 0.3, 55, 9, "unfused weights in double, 129 keys"},
};
enum { MASK_CASES = (int)(sizeof mask_cases / sizeof mask_cases[0]), MASK_LIGHT = 12 };

/* The problem of a mask case (before its boundary p: pick_boundary sets it). */
static void make_mask_problem(pb_sdpa_problem *p, const mask_case *c, int softmax_f64)
{
    pb_sdpa_spec s;
    pb_sdpa_spec_init(&s);
    s.batch = c->batch, s.heads = c->heads, s.kv_heads = c->kv_heads;
    s.seq_q = c->seq_q, s.seq_k = c->seq_k, s.dk = c->dk, s.dv = c->seq_k;
    s.causal = c->causal;
    s.path = c->path;
    s.want_weights = c->weights;
    s.softmax_f64 = softmax_f64;
    s.want_lse = c->path == CLATTN_PATH_FUSED;
    s.q_gain = 1.0f;
    s.dropout_p = c->near, s.dropout_seed = c->seed, s.dropout_offset = c->offset;
    pb_sdpa_make(p, &s);
    const size_t kv_heads = c->kv_heads ? c->kv_heads : c->heads, n = c->seq_k;
    for (size_t x = 0; x < c->batch * kv_heads; ++x)
        for (size_t k = 0; k < n; ++k)
            for (size_t j = 0; j < n; ++j)
                p->v[(x * n + k) * n + j] = k == j ? 1.0f : 0.0f;
}

/* The undropped weights (B, H, Lq, Lk) of p (the caller frees them). */
static double *undropped_weights(const pb_sdpa_problem *p)
{
    ref_sdpa_shape shape = pb_sdpa_ref_shape(&p->spec);
    shape.kv_len = p->kv_len;
    shape.dropout_p = 0.0;
    const pb_sdpa_spec *s = &p->spec;
    double *w = tu_doubles(s->batch * s->heads * s->seq_q * s->seq_k);
    float *mask = pb_expand_mask(p);
    ref_sdpa(&shape, p->q, p->k, p->v, mask, p->padding, NULL, w, NULL);
    free(mask);
    return w;
}

/* Sets p's dropout_p to the boundary of one visible weight (w0 at least half the row's mean)
 * whose Philox word u is closest to near * 2^32: p = u / 2^32, so that weight is kept by
 * u >= floor(p 2^32) and dropped by u > ...; recomputes the reference. *at receives its
 * (b, h, i, j) index. */
static double pick_boundary(pb_sdpa_problem *p, const double *w0, double near, size_t *at)
{
    const pb_sdpa_spec *s = &p->spec;
    const double target = near * TWO_32;
    double best = INFINITY;
    uint32_t best_word = 0;
    *at = 0;
    for (size_t bh = 0; bh < s->batch * s->heads; ++bh)
        for (size_t i = 0; i < s->seq_q; ++i)
            for (size_t j = 0; j < s->seq_k; ++j) {
                const size_t x = (bh * s->seq_q + i) * s->seq_k + j;
                if (!(w0[x] * (double)s->seq_k >= 0.5))
                    continue;
                const uint32_t u = philox_word(s->dropout_seed, s->dropout_offset + bh,
                                               (uint32_t)i, (uint32_t)j);
                if (fabs(u - target) < best) {
                    best = fabs(u - target);
                    best_word = u;
                    *at = x;
                }
            }
    p->spec.dropout_p = best_word / TWO_32;
    pb_sdpa_reference(p);
    return p->spec.dropout_p;
}

/* got (B, H, Lq, Lk): the dropped weights as a device wrote them. Every zero and nonzero must be
 * the reference's (w0 times ref_dropout_factor), every value within tol of it (relative, each
 * element). Returns how many weights were kept. */
static size_t expect_mask(const char *what, const pb_sdpa_problem *p, const float *got,
                          const double *w0, double tol)
{
    const pb_sdpa_spec *s = &p->spec;
    ref_sdpa_shape shape = pb_sdpa_ref_shape(s);
    size_t wrong_zero = 0, wrong_kept = 0, kept = 0, dropped = 0, worst_at = 0;
    double worst = 0.0;
    char first[256] = "";
    for (size_t b = 0; b < s->batch; ++b)
        for (size_t h = 0; h < s->heads; ++h)
            for (size_t i = 0; i < s->seq_q; ++i)
                for (size_t j = 0; j < s->seq_k; ++j) {
                    const size_t x = ((b * s->heads + h) * s->seq_q + i) * s->seq_k + j;
                    const double z = ref_dropout_factor(&shape, b, h, i, j);
                    const double want = w0[x] * z;
                    const float g = got[x];
                    if (want == 0.0) {
                        dropped += w0[x] != 0.0;
                        if (g != 0.0f && wrong_zero++ == 0)
                            snprintf(first, sizeof first,
                                     "(b %zu, h %zu, i %zu, j %zu): %g where the reference "
                                     "drops it (factor %g, undropped %g)",
                                     b, h, i, j, (double)g, z, w0[x]);
                        continue;
                    }
                    ++kept;
                    if (!(g != 0.0f) && wrong_kept++ == 0 && wrong_zero == 0)
                        snprintf(first, sizeof first,
                                 "(b %zu, h %zu, i %zu, j %zu): %g where the reference keeps "
                                 "it (%g)",
                                 b, h, i, j, (double)g, want);
                    const double err = fabs((double)g - want) / want;
                    if (!(err <= worst)) {
                        worst = isnan(err) ? INFINITY : err;
                        worst_at = x;
                    }
                }
    tu_track_error(worst);
    tu_expect(wrong_zero == 0 && wrong_kept == 0,
              "%s: %zu weights nonzero where the reference drops them, %zu zero where it "
              "keeps them (of %zu kept, %zu dropped); first %s",
              what, wrong_zero, wrong_kept, kept, dropped, first);
    tu_expect(worst <= tol, "%s: relative error %g > %g at element %zu (got %g, want %g)", what,
              worst, tol, worst_at, (double)got[worst_at],
              w0[worst_at] *
                  ref_dropout_factor(&shape, worst_at / (s->heads * s->seq_q * s->seq_k),
                                     worst_at / (s->seq_q * s->seq_k) % s->heads,
                                     worst_at / s->seq_k % s->seq_q, worst_at % s->seq_k));
    return kept;
}

/* The kernels the suite saw draw masks (from clattn_plan_info), printed at the end. */
static char kernels_seen[512];

static void note_kernel(const clattn_plan *plan)
{
    static const char *names[] = {"flash_cpu.cl", "flash_gpu.cl", "flash.cl", "softmax"};
    const char *info = clattn_plan_info(plan);
    for (size_t n = 0; n < sizeof names / sizeof names[0]; ++n)
        if (strstr(info, names[n]) != NULL && strstr(kernels_seen, names[n]) == NULL) {
            const size_t used = strlen(kernels_seen);
            snprintf(kernels_seen + used, sizeof kernels_seen - used, "%s%s", used ? ", " : "",
                     names[n]);
        }
}

/* Poisons bound's outputs, executes plan on them; 1 on success. */
static int execute(const pb_sdpa_problem *p, clattn_plan *plan, const clattn_tensors *bound)
{
    (void)p;
    if (pb_sdpa_poison(tu_ctx(), NULL, bound) != CL_SUCCESS)
        return 0;
    return tu_expect_status(
        clattn_plan_execute(plan, bound->by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL, NULL),
        CLATTN_SUCCESS, "execute");
}

/* out, or the weights (which = 1), as logical floats (the caller frees them). */
static float *download(const pb_sdpa_problem *p, const clattn_tensors *bound, int which)
{
    const clattn_tensor *t = which ? &bound->weights : &bound->out;
    float *values = tu_nan_floats(which ? p->weights_count : p->out_count);
    size_t stray = 0;
    if (pb_download(tu_ctx(), NULL, t, values, &stray) == CL_SUCCESS)
        tu_expect(stray == 0, "%s: %zu stray writes", which ? "weights" : "out", stray);
    return values;
}

/* A case's teardown: its plan, its device tensors, the undropped weights and the problem. */
static void release_case(clattn_plan *plan, clattn_tensors *bound, double *w0, pb_sdpa_problem *p)
{
    clattn_plan_release(plan);
    pb_release_tensors(bound);
    free(w0);
    pb_sdpa_free(p);
}

START_TEST(test_device_masks)
{
    TU_BEGIN_TEST();
    const mask_case *c = &mask_cases[_i];
    const int f64 = c->softmax_f64 && tu_device_has_fp64();
    pb_sdpa_problem p;
    make_mask_problem(&p, c, f64);
    double *w0 = undropped_weights(&p);
    size_t at = 0;
    const double dropout_p = pick_boundary(&p, w0, c->near, &at);
    tu_set_case("%s%s: p %.10g (the boundary of weight %zu), %s", c->what,
                c->softmax_f64 && !f64 ? " (no fp64: float softmax)" : "", dropout_p, at,
                p.label);
    clattn_sdpa_desc desc;
    pb_sdpa_desc(&p, &desc);
    clattn_plan *plan = NULL;
    clattn_tensors bound;
    memset(&bound, 0, sizeof bound);
    if (tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &desc, &plan), CLATTN_SUCCESS,
                         "plan") &&
        pb_sdpa_upload(tu_ctx(), &p, &bound) == CL_SUCCESS && execute(&p, plan, &bound)) {
        note_kernel(plan);
        tu_expect(clattn_plan_is_fused(plan) == (c->path == CLATTN_PATH_FUSED),
                  "fused %d on path %d", clattn_plan_is_fused(plan), (int)c->path);
        /* out (and lse, weights, no stray writes) against the reference with dropout */
        pb_sdpa_check(tu_ctx(), NULL, &p, &bound);
        float *out = download(&p, &bound, 0);
        const size_t kept = expect_mask("out (= the dropped weights)", &p, out, w0, 1e-5);
        tu_expect(kept > 0 || p.spec.seq_k * p.spec.seq_q < 2, "no weight kept");
        if (c->weights) {
            float *weights = download(&p, &bound, 1);
            expect_mask("weights", &p, weights, w0, 1e-5);
            free(weights);
        }
        free(out);
    }
    release_case(plan, &bound, w0, &p);
    TU_END_TEST();
}
END_TEST

/* --- 4. statistics ---------------------------------------------------------------------------- */

static const double rates[3] = {0.1, 0.5, 0.9};

/* |kept / n - (1 - p)| within 5 sigma of the binomial's. */
static void expect_fraction(const char *what, double p, size_t kept, size_t n)
{
    const double fraction = (double)kept / (double)n, sigma = sqrt(p * (1.0 - p) / (double)n);
    tu_expect(fabs(fraction - (1.0 - p)) <= 5.0 * sigma,
              "%s: p %g: kept %zu of %zu (%.6f), 1 - p = %g, off by %.2f sigma", what, p, kept,
              n, fraction, 1.0 - p, fabs(fraction - (1.0 - p)) / sigma);
}

START_TEST(test_kept_fraction_host)
{
    TU_BEGIN_TEST();
    const size_t n = (size_t)1 << 20;
    for (int r = 0; r < 3; ++r) {
        const double p = rates[r];
        tu_set_case("p %g over %zu host decisions", p, n);
        size_t kept = 0, lane_kept[4] = {0, 0, 0, 0};
        uint64_t seed = tu_rand_u64(), stream = tu_rand_u64();
        for (size_t x = 0; x < n; ++x) {
            if (x % 65536 == 0) { /* a few seeds and streams */
                seed = tu_rand_u64();
                stream = draw_stream();
            }
            const size_t row = x / 1024 % 64, key = x % 1024;
            const int keep = clattn_dropout_keep(p, seed, stream, row, key);
            kept += keep == 1;
            lane_kept[key % 4] += keep == 1;
        }
        expect_fraction("all", p, kept, n);
        for (int l = 0; l < 4; ++l)
            expect_fraction(l == 0 ? "keys 4m" : l == 1 ? "keys 4m + 1" : l == 2 ? "keys 4m + 2"
                                                                               : "keys 4m + 3",
                            p, lane_kept[l], n / 4);
    }
    TU_END_TEST();
}
END_TEST

/* A device weights output (path UNFUSED) at each p: its kept count is the reference's exactly
 * and within 5 sigma of (1 - p) n. */
START_TEST(test_kept_fraction_device)
{
    TU_BEGIN_TEST();
    pb_sdpa_spec s;
    pb_sdpa_spec_init(&s);
    const int small = tu_small();
    /* (small scale: fewer weights, for Oclgrind's sake) */
    s.batch = small ? 1 : 2, s.heads = small ? 1 : 3, s.seq_q = small ? 16 : 160;
    s.seq_k = small ? 96 : 193, s.dk = 16, s.dv = 8;
    s.path = CLATTN_PATH_UNFUSED;
    s.want_weights = 1;
    s.q_gain = 1.0f;
    s.dropout_p = 0.5, s.dropout_seed = tu_rand_u64(), s.dropout_offset = 17;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &s);
    const size_t n = p.weights_count;
    clattn_tensors bound;
    if (pb_sdpa_upload(tu_ctx(), &p, &bound) != CL_SUCCESS)
        goto done;
    ref_sdpa_shape shape = pb_sdpa_ref_shape(&p.spec);
    for (int r = 0; r < 3 && !tu_failed(); ++r) {
        shape.dropout_p = rates[r];
        tu_set_case("p %g, %zu weights of %s", rates[r], n, p.label);
        clattn_sdpa_desc desc;
        pb_sdpa_desc(&p, &desc);
        desc.dropout_p = rates[r];
        clattn_plan *plan = NULL;
        if (tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &desc, &plan), CLATTN_SUCCESS,
                             "plan") &&
            execute(&p, plan, &bound)) {
            note_kernel(plan);
            float *weights = download(&p, &bound, 1);
            size_t kept = 0, want = 0, finite = 0;
            for (size_t x = 0; x < n; ++x) {
                kept += weights[x] != 0.0f;
                finite += isfinite(weights[x]) != 0;
                const size_t j = x % s.seq_k, i = x / s.seq_k % s.seq_q;
                const size_t bh = x / (s.seq_k * s.seq_q);
                want += ref_dropout_factor(&shape, bh / s.heads, bh % s.heads, i, j) != 0.0;
            }
            tu_expect(finite == n, "%zu of %zu weights not finite", n - finite, n);
            tu_expect(kept == want, "the device kept %zu weights, the reference %zu", kept,
                      want);
            expect_fraction("device weights", rates[r], kept, n);
            free(weights);
        }
        clattn_plan_release(plan);
    }
    pb_release_tensors(&bound);
done:
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* --- 5. determinism, the (seed, offset) contract, p = 0 and p = 1 ----------------------------- */

/* Whether two float arrays hold the same bits. */
static int same_bits(const float *a, const float *b, size_t count)
{
    return memcmp(a, b, count * sizeof(float)) == 0;
}

/* One plan twice: the same bits; another seed: another mask (the reference's for that seed).
 * Loop index: 0 fused, 1 unfused with weights. */
START_TEST(test_determinism)
{
    TU_BEGIN_TEST();
    /* (small scale: a smaller problem; the unfused path is slow under Oclgrind) */
    const int small = tu_small();
    const mask_case c = {small ? 1 : 2, small ? 2 : 3, 0, small ? 4 : 11, small ? 40 : 70, 16, BR,
                         _i ? UNFUSED : FUSED, _i, 0, 0.5, 0x5eedull, 4, "determinism"};
    pb_sdpa_problem p;
    make_mask_problem(&p, &c, 0);
    pb_sdpa_reference(&p);
    tu_set_case("%s", p.label);
    double *w0 = undropped_weights(&p);
    clattn_sdpa_desc desc;
    pb_sdpa_desc(&p, &desc);
    clattn_plan *plan = NULL, *other = NULL;
    clattn_tensors bound;
    memset(&bound, 0, sizeof bound);
    float *first = NULL, *second = NULL, *third = NULL;
    if (!tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &desc, &plan), CLATTN_SUCCESS,
                          "plan") ||
        pb_sdpa_upload(tu_ctx(), &p, &bound) != CL_SUCCESS || !execute(&p, plan, &bound))
        goto done;
    first = download(&p, &bound, 0);
    if (!execute(&p, plan, &bound))
        goto done;
    second = download(&p, &bound, 0);
    tu_expect(same_bits(first, second, p.out_count), "the same plan twice: different bits");
    expect_mask("out, first run", &p, first, w0, 1e-5);
    /* another seed (one bit): another mask, the reference's for it */
    desc.dropout_seed ^= 1;
    p.spec.dropout_seed ^= 1;
    if (!tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &desc, &other), CLATTN_SUCCESS,
                          "plan, another seed") ||
        !execute(&p, other, &bound))
        goto done;
    third = download(&p, &bound, 0);
    size_t changed = 0;
    for (size_t x = 0; x < p.out_count; ++x)
        changed += (first[x] == 0.0f) != (third[x] == 0.0f);
    tu_expect(changed > p.out_count / 8, "another seed changed %zu of %zu decisions", changed,
              p.out_count);
    expect_mask("out, another seed", &p, third, w0, 1e-5);
done:
    free(third);
    free(second);
    free(first);
    clattn_plan_release(other);
    release_case(plan, &bound, w0, &p);
    TU_END_TEST();
}
END_TEST

/* Batch 1 of a two-batch call at offset 0 is a one-batch call of batch 1's inputs at offset
 * heads: the same mask; the values within rounding (reported when not the same bits). Loop
 * index: 0 fused, 1 unfused with weights. */
START_TEST(test_offset_contract)
{
    TU_BEGIN_TEST();
    const size_t heads = tu_small() ? 2 : 3;
    const mask_case two = {2, heads, 0, tu_small() ? 4 : 9, 37, 16, NO_CAUSAL,
                           _i ? UNFUSED : FUSED, _i, 0, 0.4, 0x0ffull, 0,
                           "two batches at offset 0"};
    mask_case one = two;
    one.batch = 1, one.offset = heads, one.what = "batch 1 alone at offset heads";
    pb_sdpa_problem p[2];
    make_mask_problem(&p[0], &two, 0);
    make_mask_problem(&p[1], &one, 0);
    /* the one-batch problem takes batch 1's inputs */
    memcpy(p[1].q, p[0].q + p[1].q_count, p[1].q_count * sizeof(float));
    memcpy(p[1].k, p[0].k + p[1].k_count, p[1].k_count * sizeof(float));
    memcpy(p[1].v, p[0].v + p[1].v_count, p[1].v_count * sizeof(float));
    pb_sdpa_reference(&p[0]);
    pb_sdpa_reference(&p[1]);
    tu_set_case("%s vs %s", p[0].label, p[1].label);
    clattn_plan *plan[2] = {NULL, NULL};
    clattn_tensors bound[2];
    memset(bound, 0, sizeof bound);
    float *got[2] = {NULL, NULL};
    for (int x = 0; x < 2; ++x) {
        clattn_sdpa_desc desc;
        pb_sdpa_desc(&p[x], &desc);
        if (!tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &desc, &plan[x]),
                              CLATTN_SUCCESS, "plan") ||
            pb_sdpa_upload(tu_ctx(), &p[x], &bound[x]) != CL_SUCCESS ||
            !execute(&p[x], plan[x], &bound[x]))
            goto done;
        pb_sdpa_check(tu_ctx(), NULL, &p[x], &bound[x]);
        got[x] = download(&p[x], &bound[x], _i);
    }
    {
        const size_t count = _i ? p[1].weights_count : p[1].out_count;
        const float *batch1 = got[0] + count; /* batch 1 of the two-batch output */
        size_t other_mask = 0;
        double worst = 0.0, largest = 1e-30;
        for (size_t x = 0; x < count; ++x) {
            other_mask += (batch1[x] == 0.0f) != (got[1][x] == 0.0f);
            worst = fmax(worst, fabs((double)batch1[x] - got[1][x]));
            largest = fmax(largest, fabs((double)got[1][x]));
        }
        tu_expect(other_mask == 0, "%zu of %zu weights kept in one and dropped in the other",
                  other_mask, count);
        tu_expect(worst <= 1e-6 * largest, "values differ by %g (largest %g)", worst, largest);
        if (!same_bits(batch1, got[1], count))
            printf("dropout: offset contract (%s): the same mask, values within %.2g (not the "
                   "same bits)\n",
                   _i ? "unfused weights" : "fused", worst / largest);
    }
done:
    for (int x = 0; x < 2; ++x) {
        free(got[x]);
        clattn_plan_release(plan[x]);
        pb_release_tensors(&bound[x]);
        pb_sdpa_free(&p[x]);
    }
    TU_END_TEST();
}
END_TEST

/* The backward of p (its forward already run on bound: out, lse) for dO = grad_out: dQ, dK,
 * dV into got[0..2] (logical; freed by the caller). Returns 1 when every call succeeded. */
static int run_backward(const pb_sdpa_problem *p, clattn_tensors *bound, const float *grad_out,
                        float *got[3])
{
    /* the specs here are f32, packed and not varlen: the shared upload lays dO, dQ, dK, dV out
     * as this suite's reference reads them (dO, then each gradient, at a random offset) */
    if (pb_sdpa_upload_gradients(tu_ctx(), p, grad_out, 0, 0, bound) != CL_SUCCESS)
        return 0;
    clattn_tensor *grads[3] = {&bound->grad_q, &bound->grad_k, &bound->grad_v};
    const size_t counts[3] = {p->q_count, p->k_count, p->v_count};
    clattn_sdpa_desc desc;
    pb_sdpa_desc(p, &desc);
    CLATTN_BIND_ROLES(desc, *bound); /* the layouts, now with the gradients' */
    clattn_plan *plan = NULL;
    int ok = tu_expect_status(clattn_sdpa_backward_plan_create(tu_ctx(), &desc, &plan),
                              CLATTN_SUCCESS, "backward plan") &&
             tu_expect_status(clattn_plan_execute(plan, bound->by_role, CLATTN_ROLE_COUNT, NULL,
                                                  NULL, 0, NULL, NULL),
                              CLATTN_SUCCESS, "backward");
    for (int g = 0; g < 3 && ok; ++g) {
        got[g] = tu_nan_floats(counts[g]);
        size_t stray = 0;
        ok = pb_download(tu_ctx(), NULL, grads[g], got[g], &stray) == CL_SUCCESS;
        tu_expect(stray == 0, "gradient %d: %zu stray writes", g, stray);
    }
    clattn_plan_release(plan);
    return ok;
}

/* p = 0 with a seed and an offset: the same bits as no dropout at all (out, lse, weights);
 * p = 1: out and the weights all zero, lse the undropped rows', and the backward's dQ, dK, dV
 * all zero. Loop index: 0 fused (with the backward), 1 unfused with weights. */
START_TEST(test_p_zero_and_one)
{
    TU_BEGIN_TEST();
    const int unfused = _i;
    pb_sdpa_spec s;
    pb_sdpa_spec_init(&s);
    s.batch = tu_small() ? 1 : 2, s.heads = 2, s.seq_q = tu_small() ? 4 : 10;
    s.seq_k = tu_small() ? 33 : 67;
    s.dk = 16, s.dv = 16;
    s.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
    s.path = unfused ? CLATTN_PATH_UNFUSED : CLATTN_PATH_FUSED;
    s.want_weights = unfused;
    s.want_lse = !unfused;
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &s); /* no dropout */
    tu_set_case("p = 0 and p = 1: %s", p.label);
    clattn_tensors bound;
    memset(&bound, 0, sizeof bound);
    clattn_plan *plans[3] = {NULL, NULL, NULL};
    float *outs[3][2] = {{NULL, NULL}, {NULL, NULL}, {NULL, NULL}};
    float *lse[3] = {NULL, NULL, NULL};
    float *grads[3] = {NULL, NULL, NULL};
    float *grad_out = tu_random_floats(p.out_count);
    if (pb_sdpa_upload(tu_ctx(), &p, &bound) != CL_SUCCESS)
        goto done;
    /* plans: no dropout; p = 0 with a seed and an offset; p = 1 */
    for (int x = 0; x < 3; ++x) {
        clattn_sdpa_desc desc;
        pb_sdpa_desc(&p, &desc);
        if (x > 0) {
            desc.dropout_p = x == 1 ? 0.0 : 1.0;
            desc.dropout_seed = 0x123456789ull;
            desc.dropout_offset = 987654321ull;
        }
        if (!tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &desc, &plans[x]),
                              CLATTN_SUCCESS, "plan") ||
            !execute(&p, plans[x], &bound))
            goto done;
        if (x == 0)
            pb_sdpa_check(tu_ctx(), NULL, &p, &bound);
        outs[x][0] = download(&p, &bound, 0);
        if (unfused)
            outs[x][1] = download(&p, &bound, 1);
        else {
            lse[x] = tu_nan_floats(p.lse_count);
            pb_download(tu_ctx(), NULL, &bound.lse, lse[x], NULL);
        }
    }
    tu_expect(same_bits(outs[0][0], outs[1][0], p.out_count), "p = 0: out not the same bits");
    tu_expect(!unfused || same_bits(outs[0][1], outs[1][1], p.weights_count),
              "p = 0: weights not the same bits");
    tu_expect(unfused || same_bits(lse[0], lse[1], p.lse_count), "p = 0: lse not the same bits");
    size_t nonzero = 0;
    for (size_t x = 0; x < p.out_count; ++x)
        nonzero += outs[2][0][x] != 0.0f;
    for (size_t x = 0; unfused && x < p.weights_count; ++x)
        nonzero += outs[2][1][x] != 0.0f;
    tu_expect(nonzero == 0, "p = 1: %zu outputs not zero", nonzero);
    if (!unfused) {
        /* lse is the undropped row's: the same bits as without dropout */
        tu_expect(same_bits(lse[0], lse[2], p.lse_count), "p = 1: lse not the undropped one");
        /* the backward of p = 1 (its forward just ran on bound): all zero */
        p.spec.dropout_p = 1.0;
        p.spec.dropout_seed = 0x123456789ull;
        p.spec.dropout_offset = 987654321ull;
        if (run_backward(&p, &bound, grad_out, grads)) {
            const size_t counts[3] = {p.q_count, p.k_count, p.v_count};
            for (int g = 0; g < 3; ++g) {
                size_t bad = 0;
                for (size_t x = 0; x < counts[g]; ++x)
                    bad += grads[g][x] != 0.0f;
                tu_expect(bad == 0, "p = 1: %zu of %zu entries of d%c not zero", bad, counts[g],
                          "qkv"[g]);
            }
        }
    }
done:
    for (int x = 0; x < 3; ++x) {
        clattn_plan_release(plans[x]);
        free(outs[x][0]);
        free(outs[x][1]);
        free(lse[x]);
        free(grads[x]);
    }
    free(grad_out);
    pb_release_tensors(&bound);
    pb_sdpa_free(&p);
    TU_END_TEST();
}
END_TEST

/* The backward at a boundary p (one visible weight's word u: p = u / 2^32) against the
 * float64 reference: dQ, dK, dV within 2e-4 of the larger of max |ref| and the terms'
 * magnitudes. Loop index: 0 d = 16 (CPUs: the CPU variants, 64-key blocks), 1 d = 24 (the
 * generic kernels, a key at a time). Few rows, so the boundary weight is a large part of dV. */
START_TEST(test_backward_boundary)
{
    TU_BEGIN_TEST();
    pb_sdpa_spec s;
    pb_sdpa_spec_init(&s);
    s.batch = 2, s.heads = 2, s.kv_heads = 1, s.seq_q = 3, s.seq_k = _i ? 21 : 70;
    s.dk = s.dv = _i ? 24 : 16;
    s.path = CLATTN_PATH_FUSED;
    s.want_lse = 1;
    s.q_gain = 1.0f;
    s.dropout_p = 0.5, s.dropout_seed = tu_rand_u64(), s.dropout_offset = tu_rand_u64();
    pb_sdpa_problem p;
    pb_sdpa_make(&p, &s);
    double *w0 = undropped_weights(&p);
    size_t at = 0;
    const double dropout_p = pick_boundary(&p, w0, 0.2 + 0.6 * tu_rand_unit(), &at);
    tu_set_case("backward, p %.10g (the boundary of weight %zu): %s", dropout_p, at, p.label);
    clattn_sdpa_desc desc;
    pb_sdpa_desc(&p, &desc);
    clattn_plan *forward = NULL;
    clattn_tensors bound;
    memset(&bound, 0, sizeof bound);
    float *grads[3] = {NULL, NULL, NULL};
    float *grad_out = tu_random_floats(p.out_count);
    float *out = tu_nan_floats(p.out_count);
    double *ref[3] = {tu_doubles(p.q_count), tu_doubles(p.k_count), tu_doubles(p.v_count)};
    double *mag[3] = {tu_doubles(p.q_count), tu_doubles(p.k_count), tu_doubles(p.v_count)};
    if (!tu_expect_status(clattn_sdpa_plan_create(tu_ctx(), &desc, &forward), CLATTN_SUCCESS,
                          "forward plan") ||
        pb_sdpa_upload(tu_ctx(), &p, &bound) != CL_SUCCESS || !execute(&p, forward, &bound) ||
        !pb_sdpa_check(tu_ctx(), NULL, &p, &bound) ||
        !run_backward(&p, &bound, grad_out, grads))
        goto done;
    pb_download(tu_ctx(), NULL, &bound.out, out, NULL);
    ref_sdpa_shape shape = pb_sdpa_ref_shape(&p.spec);
    ref_sdpa_backward(&shape, p.q, p.k, p.v, NULL, NULL, grad_out, out, 0, ref[0], ref[1],
                      ref[2], NULL, NULL);
    ref_sdpa_backward(&shape, p.q, p.k, p.v, NULL, NULL, grad_out, out, 1, mag[0], mag[1],
                      mag[2], NULL, NULL);
    const size_t counts[3] = {p.q_count, p.k_count, p.v_count};
    for (int g = 0; g < 3; ++g) {
        double scale = 1e-30, worst = 0.0;
        for (size_t x = 0; x < counts[g]; ++x)
            scale = fmax(scale, fmax(fabs(ref[g][x]), mag[g][x]));
        for (size_t x = 0; x < counts[g]; ++x)
            worst = isfinite(grads[g][x]) ? fmax(worst, fabs(grads[g][x] - ref[g][x]))
                                          : INFINITY;
        tu_track_error(worst / scale);
        tu_expect(worst <= 2e-4 * scale, "d%c: error %g > 2e-4 of %g", "qkv"[g], worst / scale,
                  scale);
    }
done:
    for (int g = 0; g < 3; ++g) {
        free(grads[g]);
        free(ref[g]);
        free(mag[g]);
    }
    free(out);
    free(grad_out);
    release_case(forward, &bound, w0, &p);
    TU_END_TEST();
}
END_TEST

/* --- 6. refusals ------------------------------------------------------------------------------ */

/* plan_create's status for desc and whether its message names `word`. */
static void expect_refusal(const char *what, const clattn_sdpa_desc *desc, int backward,
                           clattn_status want, const char *word)
{
    clattn_plan *plan = NULL;
    const clattn_status got = backward
                                  ? clattn_sdpa_backward_plan_create(tu_ctx(), desc, &plan)
                                  : clattn_sdpa_plan_create(tu_ctx(), desc, &plan);
    const char *message = clattn_last_error(tu_ctx());
    tu_expect(got == want && (want == CLATTN_SUCCESS || (plan == NULL && message != NULL &&
                                                         strstr(message, word) != NULL)),
              "%s%s: got %s (%s), want %s naming %s", backward ? "backward, " : "", what,
              clattn_status_string(got), message ? message : "", clattn_status_string(want),
              word);
    clattn_plan_release(plan);
}

START_TEST(test_refusals)
{
    TU_BEGIN_TEST();
    /* p outside [0, 1] or NaN, forward and backward */
    {
        pb_sdpa_spec s;
        pb_sdpa_spec_init(&s);
        s.batch = 1, s.heads = 2, s.seq_q = 4, s.seq_k = 6, s.dk = 8, s.dv = 8;
        s.path = CLATTN_PATH_FUSED;
        s.want_lse = 1;
        pb_sdpa_problem p;
        pb_sdpa_make(&p, &s);
        tu_set_case("dropout_p's range: %s", p.label);
        clattn_tensors t = p.layouts;
        const size_t q_dims[4] = {1, 2, 4, 8}, k_dims[4] = {1, 2, 6, 8};
        pb_make_layout(&t.grad_out, CLATTN_DTYPE_F32, 4, q_dims, PB_PACKED);
        pb_make_layout(&t.grad_q, CLATTN_DTYPE_F32, 4, q_dims, PB_PACKED);
        pb_make_layout(&t.grad_k, CLATTN_DTYPE_F32, 4, k_dims, PB_PACKED);
        pb_make_layout(&t.grad_v, CLATTN_DTYPE_F32, 4, k_dims, PB_PACKED);
        clattn_sdpa_desc forward, backward_desc;
        pb_sdpa_desc(&p, &forward);
        backward_desc = forward;
        CLATTN_BIND_ROLES(backward_desc, t); /* the layouts with the gradients' */
        const double bad[4] = {-0.1, 1.5, NAN, -INFINITY};
        const double good[3] = {0.0, 0.25, 1.0};
        for (int backward = 0; backward < 2; ++backward) {
            clattn_sdpa_desc desc = backward ? backward_desc : forward;
            for (int i = 0; i < 3; ++i) {
                desc.dropout_p = good[i];
                char what[64];
                snprintf(what, sizeof what, "dropout_p %g", good[i]);
                expect_refusal(what, &desc, backward, CLATTN_SUCCESS, "");
            }
            for (int i = 0; i < 4; ++i) {
                desc.dropout_p = bad[i];
                char what[64];
                snprintf(what, sizeof what, "dropout_p %g", bad[i]);
                expect_refusal(what, &desc, backward, CLATTN_ERR_INVALID_ARGUMENT, "dropout_p");
            }
        }
        pb_sdpa_free(&p);
    }
    /* dropout with packed sequences, a paged cache, quantized k/v: accepted without dropout,
     * refused with it (naming dropout_p) */
    for (int kind = 0; kind < 3; ++kind) {
        pb_sdpa_spec s;
        pb_sdpa_spec_init(&s);
        s.batch = 2, s.heads = 2, s.seq_q = 3, s.seq_k = 32, s.dk = 32, s.dv = 32;
        s.path = CLATTN_PATH_FUSED;
        const char *name = kind == 0 ? "cu_seqlens" : kind == 1 ? "block_table" : "quantized";
        if (kind == 0)
            s.varlen = 1;
        else if (kind == 1)
            s.page_size = 8;
        else
            s.k_dtype = s.v_dtype = CLATTN_DTYPE_Q8_0;
        pb_sdpa_problem p;
        pb_sdpa_make(&p, &s);
        tu_set_case("dropout with %s: %s", name, p.label);
        clattn_sdpa_desc desc;
        pb_sdpa_desc(&p, &desc);
        desc.dropout_seed = 1;
        expect_refusal("dropout_p 0", &desc, 0, CLATTN_SUCCESS, "");
        desc.dropout_p = 0.1;
        expect_refusal("dropout_p 0.1", &desc, 0, CLATTN_ERR_UNSUPPORTED, name);
        expect_refusal("dropout_p 0.1", &desc, 0, CLATTN_ERR_UNSUPPORTED, "dropout_p");
        pb_sdpa_free(&p);
    }
    TU_END_TEST();
}
END_TEST

int main(void)
{
    tu_suite_begin("check_dropout");
    Suite *suite = suite_create("dropout");
    TCase *tc = tu_tcase(suite, "dropout", 900);
    tcase_add_test(tc, test_philox_known_answers);
    tcase_add_test(tc, test_keep_matches_reference);
    /* Small scale (Oclgrind): the 63 x 63, 127- and 129-key problems stay out (dv = seq_k makes
     * them minutes there); every kernel, the GQA decode, the tail keys and p's boundary still
     * run in the others. */
    if (tu_small())
        tu_not_run("test_device_masks %d-%d (63 x 63, 127 and 129 keys: dv = seq_k): minutes "
                   "on Oclgrind",
                   MASK_LIGHT, MASK_CASES - 1);
    tcase_add_loop_test(tc, test_device_masks, 0, tu_small() ? MASK_LIGHT : MASK_CASES);
    tcase_add_test(tc, test_kept_fraction_host);
    tcase_add_test(tc, test_kept_fraction_device);
    tcase_add_loop_test(tc, test_determinism, 0, 2);
    tcase_add_loop_test(tc, test_offset_contract, 0, 2);
    tcase_add_loop_test(tc, test_p_zero_and_one, 0, 2);
    tcase_add_loop_test(tc, test_backward_boundary, 0, 2);
    tcase_add_test(tc, test_refusals);
    const int status = tu_run_suite(suite);
    printf("dropout: the masks were drawn by %s\n", kernels_seen[0] ? kernels_seen : "nothing");
    return status;
}
