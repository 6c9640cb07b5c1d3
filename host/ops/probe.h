/* Self-validation's probes (host/ops/probe.c; core/validate.h): what every family's probe
 * shares. Inputs lie on the grid k/64 in [-1, 1] (k/8 for Q4_0 and FP8), which F16, BF16, Q8_0
 * (scale 1/64), Q4_0 (scale 1/8) and FP8 (3 significant bits) hold exactly, so a float64
 * reference sees the very values the device reads. Outputs are poisoned with NaN (0xff bytes)
 * before a probe writes them. */
#ifndef CLATTN_OPS_PROBE_H
#define CLATTN_OPS_PROBE_H

#include "core/validate.h"
#include "ops.h"

typedef struct clattn__probe_rng {
    uint64_t state;
} clattn__probe_rng;

enum { CLATTN__PROBE_BUFFERS = 16 };
typedef struct clattn__probe_mem {
    cl_mem mems[CLATTN__PROBE_BUFFERS];
    int count;
    void *host[CLATTN__PROBE_BUFFERS]; /* clattn__probe_alloc's, freed with the buffers */
    int host_count;
} clattn__probe_mem;
/* A host array of `bytes` that clattn__probe_release frees; NULL when out of memory (or of
 * slots). */
void *clattn__probe_alloc(clattn__probe_mem *pm, size_t bytes);
/* A 1-kernel unit's trust (clattn__trust with the one slot). */
clattn_status clattn__trust_one(clattn_ctx *ctx, const char *unit_name, cl_kernel *slot,
                                clattn__probe_fn probe, void *unit);

typedef struct clattn__probe_scores {
    const clattn__score_shape *s;
    const double *mask;       /* (b, h, i, j), or NULL */
    const unsigned char *kpm; /* (b, j), or NULL */
    const int *kv_len;        /* (b), or NULL */
    const double *alibi;      /* (b, h), or NULL */
    const double *sinks;      /* (h, i), or NULL */
    const int *table;         /* paged: (b, blocks) */
    size_t blocks, page_size, num_pages;
} clattn__probe_scores;

typedef struct clattn__probe_inputs {
    double *mask, *alibi, *sinks;
    unsigned char *kpm;
    int *kv_len, *table;
    clattn__probe_scores scores;
} clattn__probe_inputs;

static inline size_t clattn__probe_at_most(size_t a, size_t b)
{
    return a < b ? a : b;
}

uint32_t clattn__probe_next(clattn__probe_rng *r);
double clattn__probe_grid(clattn__probe_rng *r, clattn_dtype dtype);
size_t clattn__probe_bytes(clattn_dtype dtype, size_t count);
void clattn__probe_encode(clattn_dtype dtype, const double *x, size_t count, unsigned char *out);
double clattn__probe_decode(clattn_dtype dtype, const unsigned char *in, size_t i);
clattn_status clattn__probe_upload(clattn_ctx *ctx, clattn__probe_mem *pm, const void *data,
                                   size_t bytes, cl_mem *out);
void clattn__probe_release(clattn__probe_mem *pm);
clattn_status clattn__probe_download(clattn_chain *chain, cl_mem mem, size_t bytes, void *out);
clattn_chain clattn__probe_chain(clattn_ctx *ctx);
clattn__view clattn__probe_view(cl_mem mem, clattn_dtype dtype, size_t d0, size_t d1, size_t d2,
                                size_t d3);
void clattn__probe_reference_row(const clattn__probe_scores *p, size_t b, size_t h, size_t i,
                                 const double *raw, double *w, double *lse, double *dcap);
void clattn__probe_free_inputs(clattn__probe_inputs *in);
clattn_status clattn__probe_draw_modifiers(clattn_ctx *ctx, clattn__probe_rng *rng,
                                           const clattn__score_shape *s, clattn__probe_mem *pm,
                                           clattn__probe_inputs *in, clattn__score_masks *masks);
double clattn__probe_max_error(clattn_dtype dtype, const unsigned char *got, const double *want,
                               size_t count, size_t *where);
double clattn__probe_tolerance(clattn_dtype dtype);

#endif
