/* Tensor layouts inside the library: validated once at plan creation (clattn__layout), bound
 * to buffers at execution (clattn__bind), and handed to the ops as 4-d views. */
#ifndef CLATTN_TENSOR_H
#define CLATTN_TENSOR_H

#include "runtime.h"

#include <stdio.h>

/* A strided operand resolved for a kernel: always 4 dims, right-aligned (missing leading dims
 * are 1 with stride 0), strides in elements of dtype. The plan fills dims, strides and dtype at
 * creation; mem and offset at execution. */
typedef struct clattn__view {
    cl_mem mem;
    cl_ulong offset;
    clattn_dtype dtype;
    size_t dims[4];
    size_t strides[4];
} clattn__view;

/* A 4-d view's element offset and strides, into a parameter struct's fields (params.h). */
static inline void clattn__view_fields(const clattn__view *view, cl_ulong *offset, cl_ulong *s0,
                                       cl_ulong *s1, cl_ulong *s2, cl_ulong *s3)
{
    *offset = view->offset;
    *s0 = view->strides[0];
    *s1 = view->strides[1];
    *s2 = view->strides[2];
    *s3 = view->strides[3];
}
/* The same into the fields named `prefix`_offset, `prefix`_s0 .. _s3 of struct `p`. */
#define CLATTN__VIEW_FIELDS(view, p, prefix)                                                       \
    clattn__view_fields((view), &(p).prefix##_offset, &(p).prefix##_s0, &(p).prefix##_s1,          \
                        &(p).prefix##_s2, &(p).prefix##_s3)

/* Device scratch at element offset `offset` (float elements) of `mem`. */
typedef struct clattn__scratch {
    cl_mem mem;
    size_t offset;
} clattn__scratch;

/* A validated layout: strides resolved (packed filled in), extent = 1 + the highest element
 * offset the strides reach. present false for an absent tensor (rank 0). */
typedef struct clattn__layout {
    bool present;
    clattn_dtype dtype;
    int rank;
    size_t dims[CLATTN_MAX_RANK];
    size_t strides[CLATTN_MAX_RANK];
    size_t extent;
} clattn__layout;

/* Bit sets of allowed dtypes for clattn__layout_from. */
#define CLATTN__FLOATS                                                                             \
    ((1u << CLATTN_DTYPE_F32) | (1u << CLATTN_DTYPE_F16) | (1u << CLATTN_DTYPE_BF16))
#define CLATTN__F32 (1u << CLATTN_DTYPE_F32)
/* The quantized KV types: the blocks (Q8_0, Q4_0) and the 8-bit floats (FP8_*; since 0.12),
 * which the fused kernels decode as they load and the unfused path refuses. */
#define CLATTN__FP8 ((1u << CLATTN_DTYPE_FP8_E4M3) | (1u << CLATTN_DTYPE_FP8_E5M2))
#define CLATTN__QUANT ((1u << CLATTN_DTYPE_Q8_0) | (1u << CLATTN_DTYPE_Q4_0) | CLATTN__FP8)
#define CLATTN__U8 (1u << CLATTN_DTYPE_U8)
#define CLATTN__I32 (1u << CLATTN_DTYPE_I32)

const char *clattn__dtype_name(clattn_dtype dtype);
/* The block types' (Q8_0, Q4_0) elements per block and bytes per block; the other types: 1
 * and their element size. false for an unknown dtype. */
#define CLATTN__QBLOCK 32
bool clattn__dtype_blocks(clattn_dtype dtype, size_t *elems, size_t *bytes);
void clattn__format_dims(char *out, size_t size, int rank, const size_t *dims);

/* Validates t's layout (dtype in `dtypes`, rank, nonzero dims, overlap-free strides when
 * `output`, overflow). An absent tensor (rank 0) gives present = false and succeeds. */
clattn_status clattn__layout_from(clattn_ctx *ctx, const char *op, const char *name,
                                  const clattn_tensor *t, unsigned dtypes, bool output,
                                  clattn__layout *out);
/* Fails unless l has exactly `rank` dims equal to `dims`; `what` describes them in the message,
 * e.g. "(batch, heads, seq_q, head_dim_qk)". */
clattn_status clattn__layout_expect(clattn_ctx *ctx, const char *op, const char *name,
                                    const clattn__layout *l, int rank, const size_t *dims,
                                    const char *what);
/* The 4-d right-aligned view of a layout (mem and offset left empty). */
void clattn__view_of(const clattn__layout *l, clattn__view *v);
/* Checks that t matches the planned layout and that its buffer holds it; sets mem/offset
 * (NULL/0 for a tensor absent from the plan, which must be absent here too). */
clattn_status clattn__bind(clattn_ctx *ctx, const char *op, const char *name,
                           const clattn__layout *planned, const clattn_tensor *t, cl_mem *mem,
                           size_t *offset);
/* A descriptor's _init: zeros and struct_size = size; false (nothing done) for NULL. */
bool clattn__desc_reset(void *desc, size_t size);
/* A descriptor type as the create calls read it. The ABI grows by appending fields: a caller
 * built against an earlier header passes its smaller struct (struct_size = that version's
 * sizeof), and the fields it lacks take their defaults. Fields are appended in whole 8-byte
 * units, so an earlier struct's tail padding never covers part of a later field. */
typedef struct clattn__desc_type {
    const char *name; /* "clattn_sdpa_desc" */
    size_t size;      /* sizeof in this version */
    size_t min_size;  /* the smallest struct_size taken (the fields every version had) */
    void (*defaults)(void *desc); /* the type's _init */
} clattn__desc_type;

/* The first checks of every create call: a NULL ctx gives CLATTN_ERR_INVALID_ARGUMENT (no
 * message: there is no context to hold one); then the last error is cleared, desc and out
 * (has_out) must be given, and desc's struct_size must lie in [type->min_size, type->size].
 * *full (type->size bytes) receives the defaults, then the caller's struct_size bytes over
 * them, with struct_size = type->size: the create reads *full, never desc. */
clattn_status clattn__create_entry(clattn_ctx *ctx, const char *op, const void *desc, bool has_out,
                                   const clattn__desc_type *type, void *full);

#endif
