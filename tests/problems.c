#include "problems.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- hooks ---------------------------------------------------------------------------------- */

static uint64_t default_state_ = 1;

uint64_t pb_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static uint64_t default_rand_u64(void)
{
    return pb_splitmix64(&default_state_);
}

static void default_fail(const char *message)
{
    fprintf(stderr, "FAIL %s\n", message);
}

static pb_hooks hooks_ = {default_rand_u64, default_fail, NULL};

void pb_set_hooks(const pb_hooks *hooks)
{
    hooks_.rand_u64 = hooks && hooks->rand_u64 ? hooks->rand_u64 : default_rand_u64;
    hooks_.fail = hooks && hooks->fail ? hooks->fail : default_fail;
    hooks_.track_error = hooks ? hooks->track_error : NULL;
}

uint64_t pb_rand_u64(void)
{
    return hooks_.rand_u64();
}

double pb_rand_unit(void)
{
    return (double)(pb_rand_u64() >> 11) * 0x1.0p-53;
}

size_t pb_rand_below(size_t bound)
{
    return (size_t)(pb_rand_u64() % (uint64_t)bound);
}

void pb_fill_uniform_from(double (*unit)(void), float *values, size_t count, float low, float high)
{
    for (size_t i = 0; i < count; ++i) {
        float value = (float)(low + (high - low) * unit());
        /* float rounding can land on `high`; keep the interval half-open. */
        values[i] = value < high ? value : low;
    }
}

void pb_fill_uniform(float *values, size_t count, float low, float high)
{
    pb_fill_uniform_from(pb_rand_unit, values, count, low, high);
}

int pb_fail(const char *format, ...)
{
    char message[1536];
    va_list args;
    va_start(args, format);
    vsnprintf(message, sizeof message, format, args);
    va_end(args);
    hooks_.fail(message);
    return 0;
}

static void track(double error)
{
    if (hooks_.track_error != NULL) {
        hooks_.track_error(error);
    }
}

void *pb_calloc(size_t count, size_t size)
{
    void *memory = calloc(count ? count : 1, size ? size : 1);
    if (memory == NULL) {
        fprintf(stderr, "problems: out of host memory (%zu x %zu bytes)\n", count, size);
        abort();
    }
    return memory;
}

float *pb_nan_floats(size_t count)
{
    float *values = pb_calloc(count, sizeof(float));
    for (size_t i = 0; i < count; ++i) {
        values[i] = NAN;
    }
    return values;
}

static float *uniform_floats(size_t count, float low, float high)
{
    float *values = pb_calloc(count, sizeof(float));
    pb_fill_uniform(values, count, low, high);
    return values;
}

/* --- dtypes --------------------------------------------------------------------------------- */

static uint32_t float_bits(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

static float bits_float(uint32_t bits)
{
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

uint16_t pb_f16_from_float(float value)
{
    const uint32_t bits = float_bits(value);
    const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    const uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) {
        return (uint16_t)(sign | 0x7e00u); /* NaN */
    }
    if (magnitude >= 0x477ff000u) {
        return (uint16_t)(sign | 0x7c00u); /* 65520 and above round to infinity */
    }
    if (magnitude < 0x38800000u) {
        /* Below 2^-14: a subnormal half, in units of 2^-24 (exact in double; rint rounds to
         * nearest even). 1024 units is the smallest normal, whose encoding is the same. */
        const double units = rint((double)bits_float(magnitude) * 16777216.0);
        return (uint16_t)(sign | (uint16_t)units);
    }
    const uint32_t mantissa = magnitude & 0x7fffffu;
    const uint32_t exponent = (magnitude >> 23) - 127 + 15;
    uint32_t half = (exponent << 10) | (mantissa >> 13);
    const uint32_t rest = mantissa & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) {
        ++half; /* a carry into the exponent is still the right value */
    }
    return (uint16_t)(sign | half);
}

float pb_f16_to_float(uint16_t bits)
{
    const uint32_t sign = (uint32_t)(bits & 0x8000u) << 16;
    const uint32_t exponent = (bits >> 10) & 0x1fu;
    const uint32_t mantissa = bits & 0x3ffu;
    if (exponent == 0) {
        const float value = (float)mantissa * 0x1.0p-24f;
        return sign ? -value : value;
    }
    if (exponent == 31) {
        return bits_float(sign | 0x7f800000u | (mantissa << 13));
    }
    return bits_float(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

uint16_t pb_bf16_from_float(float value)
{
    uint32_t bits = float_bits(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((bits >> 16) | 0x40u); /* quiet NaN */
    }
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

float pb_bf16_to_float(uint16_t bits)
{
    return bits_float((uint32_t)bits << 16);
}

/* FP8 (OCP 8-bit floats, clattn.h's CLATTN_DTYPE_FP8_*): mantissa bits, exponent bias and the
 * largest finite value of each format. */
static int fp8_format(clattn_dtype dtype, int *mbits, int *bias, double *max)
{
    *mbits = 0, *bias = 0, *max = 0.0;
    if (dtype == CLATTN_DTYPE_FP8_E4M3) {
        *mbits = 3, *bias = 7, *max = 448.0;
        return 1;
    }
    if (dtype == CLATTN_DTYPE_FP8_E5M2) {
        *mbits = 2, *bias = 15, *max = 57344.0;
        return 1;
    }
    return 0;
}

float pb_fp8_decode(clattn_dtype dtype, uint8_t code)
{
    int mbits, bias;
    double max;
    fp8_format(dtype, &mbits, &bias, &max);
    const int exponent = (code & 0x7f) >> mbits, mantissa = code & ((1 << mbits) - 1);
    const double sign = code & 0x80 ? -1.0 : 1.0;
    if (dtype == CLATTN_DTYPE_FP8_E4M3 && (code & 0x7f) == 0x7f)
        return NAN;
    if (dtype == CLATTN_DTYPE_FP8_E5M2 && exponent == 31)
        return mantissa ? NAN : (float)(sign * INFINITY);
    if (exponent == 0)
        return (float)(sign * ldexp(mantissa, 1 - bias - mbits));
    return (float)(sign * ldexp((1 << mbits) + mantissa, exponent - bias - mbits));
}

uint8_t pb_fp8_encode(clattn_dtype dtype, float value)
{
    int mbits, bias;
    double max;
    fp8_format(dtype, &mbits, &bias, &max);
    const uint8_t sign = signbit(value) ? 0x80 : 0;
    if (isnan(value))
        return sign | 0x7f;
    if (isinf(value) && dtype == CLATTN_DTYPE_FP8_E5M2)
        return sign | 0x7c;
    double a = fabs((double)value);
    if (a > max)
        a = max; /* saturating (clattn_quantize_scaled's rule) */
    /* the quantum of a's binade (subnormals: the smallest one), round to nearest even */
    int e = 0;
    frexp(a, &e);
    const int low = 1 - bias; /* exponent of the smallest normal */
    const int binade = e - 1 < low ? low : e - 1;
    double q = rint(ldexp(a, mbits - binade)); /* units of the quantum */
    q = ldexp(q, binade - mbits);
    if (q > max)
        q = max;
    if (q < ldexp(1.0, low)) /* subnormal (or zero): exponent field 0 */
        return sign | (uint8_t)ldexp(q, mbits - low);
    frexp(q, &e);
    const int mantissa = (int)(ldexp(q, mbits - (e - 1))) - (1 << mbits);
    return sign | (uint8_t)(((e - 1 + bias) << mbits) | mantissa);
}

static uint8_t u8_of(float value)
{
    if (value == 0.0f) {
        return 0;
    }
    if (!(value >= 1.0f)) {
        return value < 0.0f || isnan(value) ? 255 : 1;
    }
    return value >= 255.0f ? 255 : (uint8_t)value;
}

float pb_round(clattn_dtype dtype, float value)
{
    switch (dtype) {
    case CLATTN_DTYPE_F16:
        return pb_f16_to_float(pb_f16_from_float(value));
    case CLATTN_DTYPE_BF16:
        return pb_bf16_to_float(pb_bf16_from_float(value));
    case CLATTN_DTYPE_U8:
        return (float)u8_of(value);
    case CLATTN_DTYPE_FP8_E4M3:
    case CLATTN_DTYPE_FP8_E5M2:
        return pb_fp8_decode(dtype, pb_fp8_encode(dtype, value));
    default:
        return value;
    }
}

/* The block types (Q8_0, Q4_0): 34 / 18 bytes per 32 elements; 0 for the others. */
static size_t block_bytes(clattn_dtype dtype)
{
    return dtype == CLATTN_DTYPE_Q8_0 ? 34 : dtype == CLATTN_DTYPE_Q4_0 ? 18 : 0;
}

void pb_round_array(clattn_dtype dtype, float *values, size_t count)
{
    if (dtype == CLATTN_DTYPE_F32 || values == NULL) {
        return;
    }
    if (block_bytes(dtype)) { /* rows of 32k values: quantized and back, as the kernels read */
        uint8_t block[34];
        for (size_t i = 0; i + 32 <= count; i += 32) {
            ref_quantize(dtype, values + i, 32, block);
            ref_dequantize(dtype, block, 32, values + i);
        }
        return;
    }
    for (size_t i = 0; i < count; ++i) {
        values[i] = pb_round(dtype, values[i]);
    }
}

const char *pb_dtype_name(clattn_dtype dtype)
{
    switch (dtype) {
    case CLATTN_DTYPE_F32:
        return "F32";
    case CLATTN_DTYPE_F16:
        return "F16";
    case CLATTN_DTYPE_BF16:
        return "BF16";
    case CLATTN_DTYPE_U8:
        return "U8";
    case CLATTN_DTYPE_I32:
        return "I32";
    case CLATTN_DTYPE_Q8_0:
        return "Q8_0";
    case CLATTN_DTYPE_Q4_0:
        return "Q4_0";
    case CLATTN_DTYPE_FP8_E4M3:
        return "FP8_E4M3";
    case CLATTN_DTYPE_FP8_E5M2:
        return "FP8_E5M2";
    }
    return "?";
}

double pb_tolerance(clattn_dtype stored)
{
    switch (stored) {
    case CLATTN_DTYPE_F16:
        return 2e-3;
    case CLATTN_DTYPE_BF16:
        return 1.6e-2;
    default:
        return 1e-4;
    }
}

/* --- layouts -------------------------------------------------------------------------------- */

const char *pb_layout_name(pb_layout layout)
{
    static const char *const names[PB_LAYOUT_COUNT] = {
        "packed", "packed_strides", "seq_major", "seq_major_padded", "padded", "strided_last"};
    return (unsigned)layout < PB_LAYOUT_COUNT ? names[layout] : "?";
}

void pb_make_layout(clattn_tensor *t, clattn_dtype dtype, int rank, const size_t *dims,
                    pb_layout layout)
{
    memset(t, 0, sizeof *t);
    t->dtype = dtype;
    t->rank = rank;
    for (int d = 0; d < rank; ++d) {
        t->dims[d] = dims[d];
    }
    if ((layout == PB_SEQ_MAJOR || layout == PB_SEQ_MAJOR_PADDED) && rank == 4) {
        /* (B, H, L, d) inside a (B, L, H*d + gap) buffer. */
        const size_t gap = layout == PB_SEQ_MAJOR_PADDED
                               ? (1 + pb_rand_below(7)) * (block_bytes(dtype) ? 32 : 1)
                               : 0;
        const size_t row = dims[1] * dims[3] + gap;
        t->strides[0] = dims[2] * row;
        t->strides[1] = dims[3];
        t->strides[2] = row;
        t->strides[3] = 1;
        return;
    }
    size_t step = layout == PB_STRIDED_LAST ? 2 : 1;
    /* block types: gaps of whole blocks (the last stride stays 1: no PB_STRIDED_LAST) */
    const size_t unit = block_bytes(dtype) ? 32 : 1;
    for (int d = rank - 1; d >= 0; --d) {
        t->strides[d] = step;
        const size_t gap = (layout == PB_PADDED || layout == PB_STRIDED_LAST) && d > 0
                               ? (1 + pb_rand_below(5)) * unit
                               : 0;
        step = step * dims[d] + gap;
    }
}

size_t pb_tensor_count(const clattn_tensor *t)
{
    if (t->rank == 0) {
        return 0;
    }
    size_t count = 1;
    for (int d = 0; d < t->rank; ++d) {
        count *= t->dims[d];
    }
    return count;
}

void pb_tensor_strides(const clattn_tensor *t, size_t strides[CLATTN_MAX_RANK])
{
    int packed = 1;
    for (int d = 0; d < CLATTN_MAX_RANK; ++d) {
        strides[d] = 0;
    }
    for (int d = 0; d < t->rank; ++d) {
        packed &= t->strides[d] == 0;
    }
    size_t step = 1;
    for (int d = t->rank - 1; d >= 0; --d) {
        strides[d] = packed ? step : t->strides[d];
        step *= t->dims[d];
    }
}

size_t pb_tensor_extent(const clattn_tensor *t)
{
    if (t->rank == 0) {
        return 0;
    }
    size_t strides[CLATTN_MAX_RANK];
    pb_tensor_strides(t, strides);
    size_t extent = 1;
    for (int d = 0; d < t->rank; ++d) {
        extent += (t->dims[d] - 1) * strides[d];
    }
    return extent;
}

/* Element offset (from t->offset) of the logical element `index`. */
static size_t element_at(const clattn_tensor *t, const size_t *strides, size_t index)
{
    size_t at = 0;
    for (int d = t->rank - 1; d >= 0; --d) {
        at += (index % t->dims[d]) * strides[d];
        index /= t->dims[d];
    }
    return at;
}

/* --- device buffers ------------------------------------------------------------------------- */

static void poison_bytes(clattn_dtype dtype, unsigned char *bytes, size_t elements)
{
    const size_t size = clattn_dtype_size(dtype);
    for (size_t i = 0; i < elements; ++i) {
        unsigned char *e = bytes + i * size;
        uint16_t half;
        uint32_t word;
        switch (dtype) {
        case CLATTN_DTYPE_F16:
            half = 0x7e00u;
            memcpy(e, &half, 2);
            break;
        case CLATTN_DTYPE_BF16:
            half = 0x7fc0u;
            memcpy(e, &half, 2);
            break;
        case CLATTN_DTYPE_U8:
            *e = (i & 1u) ? 0xffu : 0x00u;
            break;
        case CLATTN_DTYPE_FP8_E4M3:
        case CLATTN_DTYPE_FP8_E5M2:
            *e = 0x7fu; /* NaN in both formats */
            break;
        case CLATTN_DTYPE_I32:
            word = 0x7fc00000u; /* a huge count: a read of it would show */
            memcpy(e, &word, 4);
            break;
        default:
            word = 0x7fc00000u;
            memcpy(e, &word, 4);
            break;
        }
    }
}

static void store_element(clattn_dtype dtype, unsigned char *bytes, size_t element, float value)
{
    uint16_t half;
    switch (dtype) {
    case CLATTN_DTYPE_F16:
        half = pb_f16_from_float(value);
        memcpy(bytes + 2 * element, &half, 2);
        break;
    case CLATTN_DTYPE_BF16:
        half = pb_bf16_from_float(value);
        memcpy(bytes + 2 * element, &half, 2);
        break;
    case CLATTN_DTYPE_U8:
        bytes[element] = u8_of(value);
        break;
    case CLATTN_DTYPE_FP8_E4M3:
    case CLATTN_DTYPE_FP8_E5M2:
        bytes[element] = pb_fp8_encode(dtype, value);
        break;
    case CLATTN_DTYPE_I32: {
        const int32_t count = (int32_t)value;
        memcpy(bytes + 4 * element, &count, 4);
        break;
    }
    default:
        memcpy(bytes + 4 * element, &value, 4);
        break;
    }
}

static float load_element(clattn_dtype dtype, const unsigned char *bytes, size_t element)
{
    uint16_t half;
    float value;
    switch (dtype) {
    case CLATTN_DTYPE_F16:
        memcpy(&half, bytes + 2 * element, 2);
        return pb_f16_to_float(half);
    case CLATTN_DTYPE_BF16:
        memcpy(&half, bytes + 2 * element, 2);
        return pb_bf16_to_float(half);
    case CLATTN_DTYPE_U8:
        return (float)bytes[element];
    case CLATTN_DTYPE_FP8_E4M3:
    case CLATTN_DTYPE_FP8_E5M2:
        return pb_fp8_decode(dtype, bytes[element]);
    case CLATTN_DTYPE_I32: {
        int32_t count;
        memcpy(&count, bytes + 4 * element, 4);
        return (float)count;
    }
    default:
        memcpy(&value, bytes + 4 * element, 4);
        return value;
    }
}

/* Whether element i of a buffer still holds the poison poison_bytes wrote. */
static int is_poison(clattn_dtype dtype, const unsigned char *bytes, size_t i)
{
    unsigned char expected[4];
    const size_t size = clattn_dtype_size(dtype);
    /* poison_bytes' pattern depends on the element's parity for U8 only */
    unsigned char pair[8];
    poison_bytes(dtype, pair, 2);
    memcpy(expected, pair + (i & 1u) * size, size);
    if (dtype == CLATTN_DTYPE_U8 || dtype == CLATTN_DTYPE_I32) {
        return memcmp(bytes + i * size, expected, size) == 0;
    }
    return isnan(load_element(dtype, bytes, i));
}

/* Bytes of `elements` elements of dtype (block types: whole blocks). */
static size_t image_bytes(clattn_dtype dtype, size_t elements)
{
    return block_bytes(dtype) ? (elements + 31) / 32 * block_bytes(dtype)
                              : elements * clattn_dtype_size(dtype);
}

/* The host image of t's buffer: poison, then the values at t's positions. Block types: every
 * byte 0xff (NaN scales), then each row's blocks quantized (llama.cpp's reference). */
static unsigned char *host_image(const clattn_tensor *t, size_t elements, const float *values)
{
    if (block_bytes(t->dtype)) {
        const size_t bytes = image_bytes(t->dtype, elements), size = block_bytes(t->dtype);
        unsigned char *image = pb_calloc(bytes, 1);
        memset(image, 0xff, bytes);
        if (values != NULL) {
            size_t strides[CLATTN_MAX_RANK];
            pb_tensor_strides(t, strides);
            const size_t count = pb_tensor_count(t);
            for (size_t i = 0; i + 32 <= count; i += 32) /* rows: the last dim has stride 1 */
                ref_quantize(t->dtype, values + i, 32,
                             image + (t->offset + element_at(t, strides, i)) / 32 * size);
        }
        return image;
    }
    const size_t size = clattn_dtype_size(t->dtype);
    unsigned char *bytes = pb_calloc(elements, size);
    poison_bytes(t->dtype, bytes, elements);
    if (values != NULL) {
        size_t strides[CLATTN_MAX_RANK];
        pb_tensor_strides(t, strides);
        const size_t count = pb_tensor_count(t);
        for (size_t i = 0; i < count; ++i) {
            store_element(t->dtype, bytes, t->offset + element_at(t, strides, i), values[i]);
        }
    }
    return bytes;
}

cl_int pb_upload(clattn_ctx *ctx, clattn_tensor *t, size_t offset, const float *values)
{
    if (block_bytes(t->dtype))
        offset *= 32; /* whole blocks */
    const size_t elements = offset + pb_tensor_extent(t) + 3;
    t->offset = offset;
    t->mem = NULL;
    unsigned char *bytes = host_image(t, elements, values);
    cl_int err = CL_SUCCESS;
    t->mem = clCreateBuffer(clattn_ctx_cl_context(ctx), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                            image_bytes(t->dtype, elements), bytes, &err);
    free(bytes);
    if (err != CL_SUCCESS || t->mem == NULL) {
        pb_fail("clCreateBuffer(%zu bytes) failed: %s (%d)", image_bytes(t->dtype, elements),
                clattn_status_string((clattn_status)err), (int)err);
        t->mem = NULL;
        return err != CL_SUCCESS ? err : CL_OUT_OF_RESOURCES;
    }
    return CL_SUCCESS;
}

static size_t buffer_elements(const clattn_tensor *t, cl_int *err)
{
    size_t bytes = 0;
    *err = clGetMemObjectInfo(t->mem, CL_MEM_SIZE, sizeof bytes, &bytes, NULL);
    return block_bytes(t->dtype) ? bytes / block_bytes(t->dtype) * 32
                                 : bytes / clattn_dtype_size(t->dtype);
}

static cl_int wait_all(clattn_ctx *ctx, cl_command_queue queue)
{
    cl_int err = (cl_int)clattn_finish(ctx);
    if (err == CL_SUCCESS && queue != NULL) {
        err = clFinish(queue);
    }
    return err;
}

cl_int pb_rewrite(clattn_ctx *ctx, cl_command_queue queue, const clattn_tensor *t,
                  const float *values)
{
    cl_int err = wait_all(ctx, queue);
    const size_t elements = err == CL_SUCCESS ? buffer_elements(t, &err) : 0;
    if (err == CL_SUCCESS) {
        unsigned char *bytes = host_image(t, elements, values);
        err = clEnqueueWriteBuffer(clattn_ctx_queue(ctx), t->mem, CL_TRUE, 0,
                                   image_bytes(t->dtype, elements), bytes, 0, NULL, NULL);
        free(bytes);
    }
    if (err != CL_SUCCESS) {
        pb_fail("rewriting a buffer failed: %s (%d)", clattn_status_string((clattn_status)err),
                (int)err);
    }
    return err;
}

cl_int pb_download(clattn_ctx *ctx, cl_command_queue queue, const clattn_tensor *t, float *values,
                   size_t *stray)
{
    if (stray != NULL) {
        *stray = 0;
    }
    cl_int err = wait_all(ctx, queue);
    const size_t elements = err == CL_SUCCESS ? buffer_elements(t, &err) : 0;
    const size_t size = clattn_dtype_size(t->dtype);
    unsigned char *bytes = pb_calloc(elements, size);
    if (err == CL_SUCCESS) {
        err = clEnqueueReadBuffer(clattn_ctx_queue(ctx), t->mem, CL_TRUE, 0, elements * size,
                                  bytes, 0, NULL, NULL);
    }
    if (err != CL_SUCCESS) {
        pb_fail("reading a buffer failed: %s (%d)", clattn_status_string((clattn_status)err),
                (int)err);
        free(bytes);
        return err;
    }
    size_t strides[CLATTN_MAX_RANK];
    pb_tensor_strides(t, strides);
    const size_t count = pb_tensor_count(t);
    unsigned char *inside = pb_calloc(elements, 1);
    for (size_t i = 0; i < count; ++i) {
        const size_t at = t->offset + element_at(t, strides, i);
        values[i] = load_element(t->dtype, bytes, at);
        inside[at] = 1;
    }
    if (stray != NULL) {
        for (size_t i = 0; i < elements; ++i) {
            *stray += !inside[i] && !is_poison(t->dtype, bytes, i);
        }
    }
    free(inside);
    free(bytes);
    return CL_SUCCESS;
}

void pb_release_tensors(clattn_tensors *tensors)
{
    clattn_tensor *all = tensors->by_role;
    const size_t count = CLATTN_ROLE_COUNT;
    for (size_t i = 0; i < count; ++i) {
        cl_mem mem = all[i].mem;
        if (mem == NULL) {
            continue;
        }
        for (size_t j = i; j < count; ++j) {
            if (all[j].mem == mem) {
                all[j].mem = NULL;
            }
        }
        clReleaseMemObject(mem);
    }
}

/* --- comparisons ---------------------------------------------------------------------------- */

/* pb_rel_error with max |want| taken as at least `floor`. */
static double rel_error_floor(const float *got, const double *want, size_t count, double floor)
{
    double max_want = 0.0, max_diff = 0.0;
    for (size_t i = 0; i < count; ++i) {
        if (!isfinite(want[i])) {
            continue;
        }
        if (!isfinite(got[i])) {
            return INFINITY;
        }
        const double diff = fabs((double)got[i] - want[i]);
        max_diff = diff > max_diff ? diff : max_diff;
        max_want = fabs(want[i]) > max_want ? fabs(want[i]) : max_want;
    }
    return max_diff / (max_want > floor ? max_want : floor);
}

double pb_rel_error(const float *got, const double *want, size_t count)
{
    return rel_error_floor(got, want, count, 1e-30);
}

/* pb_expect_close relative to at least `floor` (a 16-bit output's smallest normal value: below
 * it the stored result has no relative precision left, as a row whose weights a large sink
 * takes nearly all of, scaled to 1e-20). */
static int expect_close_floor(const char *label, const char *what, const float *got,
                              const double *want, size_t count, double tol, double floor);

int pb_expect_close(const char *label, const char *what, const float *got, const double *want,
                    size_t count, double tol)
{
    return expect_close_floor(label, what, got, want, count, tol, 1e-30);
}

static int expect_close_floor(const char *label, const char *what, const float *got,
                              const double *want, size_t count, double tol, double floor)
{
    const double error = rel_error_floor(got, want, count, floor);
    track(error);
    if (error <= tol) {
        return 1;
    }
    size_t worst = 0;
    double worst_diff = -1.0;
    for (size_t i = 0; i < count; ++i) {
        const double diff = isfinite(got[i]) ? fabs((double)got[i] - want[i]) : INFINITY;
        if (isfinite(want[i]) && diff > worst_diff) {
            worst_diff = diff;
            worst = i;
        }
    }
    return pb_fail("%s: %s: relative error %.3g > %.2g (worst at [%zu]: got %.9g, want %.9g)",
                   label, what, error, tol, worst, count ? (double)got[worst] : 0.0,
                   count ? want[worst] : 0.0);
}

static int expect_finite(const char *label, const char *what, const float *values, size_t count)
{
    for (size_t i = 0; i < count; ++i) {
        if (!isfinite(values[i])) {
            return pb_fail("%s: %s[%zu] is %g (not finite)", label, what, i, (double)values[i]);
        }
    }
    return 1;
}

/* lse within 1e-4 relative to max(|want|, 1); -inf where want is -inf. With the relu
 * normalisation the normaliser Z = exp(lse) itself is compared, within 1e-4 of max(Z, 1): a
 * row whose relu scores sum to nearly 0 has an ill-conditioned log. */
static int expect_lse(const char *label, clattn_norm norm, const float *got, const double *want,
                      size_t count)
{
    double worst = 0.0;
    int ok = 1;
    for (size_t i = 0; i < count; ++i) {
        if (want[i] == -INFINITY) {
            if (!(got[i] == -INFINITY) && ok) {
                ok = pb_fail("%s: lse[%zu] = %g, want -inf (no kept key)", label, i,
                             (double)got[i]);
            }
            continue;
        }
        double error = INFINITY;
        if (norm == CLATTN_NORM_RELU && (isfinite(got[i]) || got[i] == -INFINITY)) {
            const double z_want = exp(want[i]), z_got = exp((double)got[i]);
            error = fabs(z_got - z_want) / (z_want > 1.0 ? z_want : 1.0);
        } else if (isfinite(got[i])) {
            error = fabs(got[i] - want[i]) / (fabs(want[i]) > 1.0 ? fabs(want[i]) : 1.0);
        }
        worst = error > worst ? error : worst;
    }
    track(worst);
    if (!(worst <= 1e-4)) {
        ok = pb_fail("%s: lse: relative error %.3g > 1e-4", label, worst);
    }
    return ok;
}

/* Rows (of `width` elements) whose lse_ref is -inf (no kept key, or a relu row summing to 0)
 * must be exact zeros. */
static int expect_zero_rows(const char *label, const char *what, const float *got,
                            const double *lse_ref, size_t rows, size_t width)
{
    for (size_t row = 0; row < rows; ++row) {
        if (lse_ref[row] != -INFINITY) {
            continue;
        }
        for (size_t x = 0; x < width; ++x) {
            if (got[row * width + x] != 0.0f) {
                return pb_fail("%s: %s row %zu has no kept key but element %zu is %g, not 0",
                               label, what, row, x, (double)got[row * width + x]);
            }
        }
    }
    return 1;
}

static int expect_no_stray(const char *label, const char *what, size_t stray)
{
    if (stray == 0) {
        return 1;
    }
    return pb_fail("%s: %s: %zu element(s) of the buffer outside the tensor were written", label,
                   what, stray);
}

/* --- masks ---------------------------------------------------------------------------------- */

/* count additive mask values: uniform [-1, 1), about one in four -inf. */
static float *float_mask_values(size_t count)
{
    float *values = uniform_floats(count, -1.0f, 1.0f);
    for (size_t i = 0; i < count; ++i) {
        if (pb_rand_below(4) == 0) {
            values[i] = -INFINITY;
        }
    }
    return values;
}

/* count boolean mask values: about one in four 0 (masked), else 1 or (one in eight) 255. */
static float *bool_mask_values(size_t count)
{
    float *values = pb_calloc(count, sizeof(float));
    for (size_t i = 0; i < count; ++i) {
        const size_t draw = pb_rand_below(8);
        values[i] = draw < 2 ? 0.0f : draw == 2 ? 255.0f : 1.0f;
    }
    return values;
}

/* (B, Lk) key padding: about 3 in 10 ignored (1 or 255). */
static uint8_t *padding_values(size_t batch, size_t seq_k)
{
    uint8_t *padding = pb_calloc(batch * seq_k, 1);
    for (size_t i = 0; i < batch * seq_k; ++i) {
        const size_t draw = pb_rand_below(10);
        padding[i] = draw < 3 ? (uint8_t)(draw == 0 ? 255 : 1) : 0;
    }
    return padding;
}

/* --- SDPA problems -------------------------------------------------------------------------- */

void pb_sdpa_spec_init(pb_sdpa_spec *spec)
{
    memset(spec, 0, sizeof *spec);
    spec->scale = NAN;
    spec->q_gain = 2.0f;
}

void pb_reduce_to_mask(const pb_sdpa_problem *p, const double *dscores, double *out)
{
    const pb_sdpa_spec *s = &p->spec;
    const size_t full[4] = {s->batch, s->heads, s->seq_q, s->seq_k};
    size_t md[4] = {1, 1, 1, 1};
    for (int d = 0; d < p->mask_rank; ++d) {
        md[4 - p->mask_rank + d] = p->mask_dims[d];
    }
    memset(out, 0, p->mask_count * sizeof(double));
    for (size_t b = 0; b < full[0]; ++b) {
        for (size_t h = 0; h < full[1]; ++h) {
            for (size_t i = 0; i < full[2]; ++i) {
                for (size_t j = 0; j < full[3]; ++j) {
                    const size_t c[4] = {md[0] == 1 ? 0 : b, md[1] == 1 ? 0 : h,
                                         md[2] == 1 ? 0 : i, md[3] == 1 ? 0 : j};
                    const size_t at = ((c[0] * md[1] + c[1]) * md[2] + c[2]) * md[3] + c[3];
                    out[at] += dscores[((b * full[1] + h) * full[2] + i) * full[3] + j];
                }
            }
        }
    }
}

ref_sdpa_shape pb_sdpa_ref_shape(const pb_sdpa_spec *spec)
{
    ref_sdpa_shape shape = {
        .batch = spec->batch,
        .heads = spec->heads,
        .seq_q = spec->seq_q,
        .seq_k = spec->seq_k,
        .dk = spec->dk,
        .dv = spec->dv,
        .scale = ref_resolve_scale(spec->scale, spec->dk),
        .norm = spec->norm,
        .causal = spec->causal,
        .kv_heads = spec->kv_heads,
        .softcap = spec->softcap,
        .has_past = spec->past > 0,
        .past = spec->past,
        .window_align = spec->window_align,
        .window_left = spec->window_left,
        .window_right = spec->window_right,
        .diag_offset = spec->diag_offset,
        .dropout_p = spec->dropout_p,
        .dropout_seed = spec->dropout_seed,
        .dropout_offset = spec->dropout_offset,
    };
    return shape;
}

ref_sdpa_shape pb_sdpa_problem_ref_shape(const pb_sdpa_problem *p, float **alibi_out)
{
    const pb_sdpa_spec *s = &p->spec;
    ref_sdpa_shape shape = pb_sdpa_ref_shape(s);
    shape.kv_len = p->kv_len;
    float *alibi = NULL;
    if (p->alibi != NULL) { /* (B, H) */
        alibi = pb_calloc(s->batch * s->heads, sizeof(float));
        for (size_t i = 0; i < s->batch * s->heads; ++i)
            alibi[i] = p->alibi[s->alibi == 1 ? i % s->heads : i];
    }
    shape.alibi = alibi;
    shape.sinks = p->sinks;
    *alibi_out = alibi;
    return shape;
}

int pb_sdpa_expect_fused(const pb_sdpa_spec *spec)
{
    if (spec->path == CLATTN_PATH_FUSED) {
        return 1;
    }
    if (spec->path == CLATTN_PATH_UNFUSED) {
        return 0;
    }
    /* (head sizes up to 576 since 0.12: MLA's absorbed form) */
    return spec->varlen ||
           (!spec->want_weights && !spec->softmax_f64 && spec->dk <= 576 && spec->dv <= 576);
}

static const char *causal_name(clattn_causal causal)
{
    return causal == CLATTN_CAUSAL_TOP_LEFT       ? "top_left"
           : causal == CLATTN_CAUSAL_BOTTOM_RIGHT ? "bottom_right"
           : causal == CLATTN_CAUSAL_ONNX         ? "onnx"
           : causal == CLATTN_CAUSAL_OFFSET       ? "offset"
                                                  : "none";
}

static const char *path_name(clattn_path path)
{
    return path == CLATTN_PATH_FUSED ? "fused" : path == CLATTN_PATH_UNFUSED ? "unfused" : "auto";
}

static void describe_sdpa(pb_sdpa_problem *p)
{
    const pb_sdpa_spec *s = &p->spec;
    char mask[160] = "none";
    if (s->mask != PB_MASK_NONE) {
        char dims[64] = "";
        size_t used = 0;
        for (int d = 0; d < p->mask_rank; ++d) {
            used += (size_t)snprintf(dims + used, sizeof dims - used, "%s%zu", d ? "," : "",
                                     p->mask_dims[d]);
        }
        snprintf(mask, sizeof mask, "%s/%s(%s)%s/%s", s->mask == PB_MASK_BOOL ? "bool" : "float",
                 pb_dtype_name(s->mask_dtype), dims, s->mask_zero_strides ? "zero_strides" : "",
                 pb_layout_name(s->mask_layout));
    }
    snprintf(
        p->label, sizeof p->label,
        "sdpa B=%zu H=%zu Hkv=%zu Lq=%zu Lk=%zu dk=%zu dv=%zu scale=%g norm=%s causal=%s path=%s "
        "q=%s/%s k=%s/%s v=%s/%s out=%s/%s mask=%s padding=%d fully_masked=%d weights=%d "
        "lse=%d softcap=%g kv_len=%d past=%zu window=%s(%lld,%lld) alibi=%d diag_offset=%lld "
        "sinks=%d/%s paged=%zu/%zu pages",
        s->batch, s->heads, s->kv_heads ? s->kv_heads : s->heads, s->seq_q, s->seq_k, s->dk, s->dv,
        (double)s->scale,
        s->norm == CLATTN_NORM_RELU ? "relu"
        : s->softmax_f64            ? "softmax_f64"
                                    : "softmax",
        causal_name(s->causal), path_name(s->path), pb_dtype_name(s->q_dtype),
        pb_layout_name(s->q_layout), pb_dtype_name(s->k_dtype), pb_layout_name(s->k_layout),
        pb_dtype_name(s->v_dtype), pb_layout_name(s->v_layout), pb_dtype_name(s->out_dtype),
        pb_layout_name(s->out_layout), mask, s->padding, s->fully_masked, s->want_weights,
        s->want_lse, (double)s->softcap, s->kv_len, s->past, causal_name(s->window_align),
        s->window_left, s->window_right, s->alibi, s->diag_offset, s->sinks,
        pb_layout_name(s->sinks_layout), s->page_size, p->num_pages);
    if (s->varlen) {
        size_t used = strlen(p->label);
        used += (size_t)snprintf(p->label + used, sizeof p->label - used, " varlen=");
        for (size_t b = 0; b < s->batch && used < sizeof p->label; ++b) {
            used += (size_t)snprintf(p->label + used, sizeof p->label - used, "%s%dx%d",
                                     b ? "," : "", p->cu_q[b + 1] - p->cu_q[b],
                                     p->cu_k[b + 1] - p->cu_k[b]);
        }
    }
    if (s->dropout_p > 0.0) {
        const size_t used = strlen(p->label);
        snprintf(p->label + used, sizeof p->label - used, " dropout=%g/seed=%llu/offset=%llu",
                 s->dropout_p, (unsigned long long)s->dropout_seed,
                 (unsigned long long)s->dropout_offset);
    }
    if (s->v_from_k) {
        const size_t used = strlen(p->label);
        snprintf(p->label + used, sizeof p->label - used, " v=view_of_k");
    }
    if (p->tree_meta != NULL) {
        size_t used = strlen(p->label);
        used += (size_t)snprintf(p->label + used, sizeof p->label - used, " tree=");
        for (size_t b = 0; b < s->batch && used < sizeof p->label; ++b) {
            used += (size_t)snprintf(p->label + used, sizeof p->label - used, "%s%d@%d",
                                     b ? "," : "", p->tree_meta[3 * b + 1], p->tree_meta[3 * b]);
        }
    }
    if (s->k_scale != 0.0 || s->v_scale != 0.0) {
        const size_t used = strlen(p->label);
        snprintf(p->label + used, sizeof p->label - used, " k_scale=%g v_scale=%g", s->k_scale,
                 s->v_scale);
    }
    if (s->rope) {
        const size_t used = strlen(p->label);
        snprintf(p->label + used, sizeof p->label - used, " rope=%s/%zu/start=%zu/base=%g",
                 s->rope_style == CLATTN_ROPE_PAIRS ? "pairs" : "halves", s->rope_dims,
                 s->rope_start, s->rope_base);
    }
}

/* The mask's dims (right-aligned on (B, H, Lq, Lk)) as uploaded, and the compact dims (the
 * broadcast dims 1) its distinct values span. */
static void mask_shape(const pb_sdpa_spec *s, int *rank, size_t dims[4], size_t compact[4])
{
    const size_t full[4] = {s->batch, s->heads, s->seq_q, s->seq_k};
    *rank = s->mask_rank;
    for (int d = 0; d < 4; ++d) {
        const int in_mask = d >= 4 - *rank;
        compact[d] = in_mask && !(s->mask_ones & (1u << d)) ? full[d] : 1;
    }
    for (int m = 0; m < *rank; ++m) {
        const int d = 4 - *rank + m;
        dims[m] = s->mask_zero_strides ? full[d] : compact[d];
    }
}

static void make_sdpa_mask(pb_sdpa_problem *p)
{
    const pb_sdpa_spec *s = &p->spec;
    size_t compact[4];
    mask_shape(s, &p->mask_rank, p->mask_dims, compact);
    const size_t compact_count = compact[0] * compact[1] * compact[2] * compact[3];
    float *values = s->mask == PB_MASK_BOOL ? bool_mask_values(compact_count)
                                            : float_mask_values(compact_count);
    if (s->fully_masked == 2) {
        /* every key of query 0 (of every broadcast copy) masked */
        for (size_t i = 0; i < compact_count; ++i) {
            if ((i / compact[3]) % compact[2] == 0) {
                values[i] = s->mask == PB_MASK_BOOL ? 0.0f : -INFINITY;
            }
        }
    }
    pb_round_array(s->mask_dtype, values, compact_count);
    p->mask_count = 1;
    for (int m = 0; m < p->mask_rank; ++m) {
        p->mask_count *= p->mask_dims[m];
    }
    if (!s->mask_zero_strides) {
        p->mask = values;
        return;
    }
    /* Full dims with repeated values (the upload writes each repeat to the same element). */
    p->mask = pb_calloc(p->mask_count, sizeof(float));
    for (size_t i = 0; i < p->mask_count; ++i) {
        size_t rest = i, at = 0, step = 1;
        for (int d = 3; d >= 0; --d) {
            const int m = d - (4 - p->mask_rank);
            const size_t dim = m >= 0 ? p->mask_dims[m] : 1;
            const size_t coord = rest % dim;
            rest /= dim;
            at += (compact[d] > 1 ? coord : 0) * step;
            step *= compact[d];
        }
        p->mask[i] = values[at];
    }
    free(values);
}

/* The per-head operands' layouts: ALiBi's slopes ((H) or (B, H)) and the sinks ((H)). */
static void head_layouts(const pb_sdpa_spec *s, clattn_tensors *t)
{
    if (s->alibi) {
        const size_t a_dims[2] = {s->batch, s->heads};
        pb_make_layout(&t->alibi_slopes, CLATTN_DTYPE_F32, s->alibi == 1 ? 1 : 2,
                       s->alibi == 1 ? a_dims + 1 : a_dims, PB_PACKED);
    }
    if (s->sinks) {
        const size_t h_dims[1] = {s->heads};
        pb_make_layout(&t->sinks, CLATTN_DTYPE_F32, 1, h_dims, s->sinks_layout);
    }
}

/* A paged cache's pools (num_pages, page_size, kv_heads, d), its block table and (packed
 * queries: the requests' key counts). */
static void paged_layouts(const pb_sdpa_problem *p, clattn_tensors *t)
{
    const pb_sdpa_spec *s = &p->spec;
    const size_t kv_heads = s->kv_heads ? s->kv_heads : s->heads;
    const size_t pk_dims[4] = {p->num_pages, s->page_size, kv_heads, s->dk};
    const size_t pv_dims[4] = {p->num_pages, s->page_size, kv_heads, s->dv};
    const size_t bt_dims[2] = {s->batch, p->blocks}, n_dims[1] = {s->batch};
    pb_make_layout(&t->k, s->k_dtype, 4, pk_dims, s->k_layout);
    pb_make_layout(&t->v, s->v_dtype, 4, pv_dims, s->v_layout);
    pb_make_layout(&t->block_table, CLATTN_DTYPE_I32, 2, bt_dims, PB_PACKED);
    if (s->varlen) {
        pb_make_layout(&t->kv_seqlen, CLATTN_DTYPE_I32, 1, n_dims, PB_PACKED);
    }
}

static void make_sdpa_layouts(pb_sdpa_problem *p)
{
    const pb_sdpa_spec *s = &p->spec;
    clattn_tensors *t = &p->layouts;
    memset(t, 0, sizeof *t);
    const size_t q_dims[4] = {s->batch, s->heads, s->seq_q, s->dk};
    const size_t kv_heads = s->kv_heads ? s->kv_heads : s->heads;
    if (s->varlen) { /* packed sequences: rank 3, lse (H, total_q), the offsets */
        const size_t pq[3] = {p->total_q, s->heads, s->dk}, pk[3] = {p->total_k, kv_heads, s->dk};
        const size_t pv[3] = {p->total_k, kv_heads, s->dv}, po[3] = {p->total_q, s->heads, s->dv};
        const size_t lse[2] = {s->heads, p->total_q}, cu[1] = {s->batch + 1};
        pb_make_layout(&t->q, s->q_dtype, 3, pq, s->q_layout);
        pb_make_layout(&t->k, s->k_dtype, 3, pk, s->k_layout);
        pb_make_layout(&t->v, s->v_dtype, 3, pv, s->v_layout);
        pb_make_layout(&t->out, s->out_dtype, 3, po, s->out_layout);
        if (s->want_lse) {
            pb_make_layout(&t->lse, CLATTN_DTYPE_F32, 2, lse, PB_PACKED);
        }
        pb_make_layout(&t->cu_seqlens_q, CLATTN_DTYPE_I32, 1, cu, PB_PACKED);
        if (s->page_size) { /* over a paged cache: pools, block table, key counts */
            paged_layouts(p, t);
        } else {
            pb_make_layout(&t->cu_seqlens_k, CLATTN_DTYPE_I32, 1, cu, PB_PACKED);
        }
        head_layouts(s, t);
        return;
    }
    /* k and v hold the new keys (after the past ones); present all of them */
    const size_t k_dims[4] = {s->batch, kv_heads, s->seq_k - s->past, s->dk};
    const size_t v_dims[4] = {s->batch, kv_heads, s->seq_k - s->past, s->dv};
    if (s->past > 0) {
        const size_t pk_dims[4] = {s->batch, kv_heads, s->past, s->dk};
        const size_t pv_dims[4] = {s->batch, kv_heads, s->past, s->dv};
        const size_t all_k[4] = {s->batch, kv_heads, s->seq_k, s->dk};
        const size_t all_v[4] = {s->batch, kv_heads, s->seq_k, s->dv};
        pb_make_layout(&t->past_k, s->k_dtype, 4, pk_dims, s->k_layout);
        pb_make_layout(&t->past_v, s->v_dtype, 4, pv_dims, s->v_layout);
        pb_make_layout(&t->present_k, s->k_dtype, 4, all_k, s->k_layout);
        pb_make_layout(&t->present_v, s->v_dtype, 4, all_v, s->v_layout);
    }
    if (s->kv_len) {
        const size_t n_dims[1] = {s->batch};
        pb_make_layout(&t->kv_seqlen, CLATTN_DTYPE_I32, 1, n_dims, PB_PACKED);
    }
    head_layouts(s, t);
    const size_t o_dims[4] = {s->batch, s->heads, s->seq_q, s->dv};
    const size_t w_dims[4] = {s->batch, s->heads, s->seq_q, s->seq_k};
    pb_make_layout(&t->q, s->q_dtype, 4, q_dims, s->q_layout);
    if (s->page_size) { /* pools of pages, and the block table */
        paged_layouts(p, t);
    } else {
        pb_make_layout(&t->k, s->k_dtype, 4, k_dims, s->k_layout);
        pb_make_layout(&t->v, s->v_dtype, 4, v_dims, s->v_layout);
    }
    pb_make_layout(&t->out, s->out_dtype, 4, o_dims, s->out_layout);
    if (s->want_weights) {
        pb_make_layout(&t->weights, CLATTN_DTYPE_F32, 4, w_dims, PB_PACKED);
    }
    if (s->want_lse) {
        pb_make_layout(&t->lse, CLATTN_DTYPE_F32, 3, w_dims, PB_PACKED);
    }
    if (s->mask != PB_MASK_NONE) {
        if (s->mask_zero_strides) {
            pb_make_layout(&t->attn_mask, s->mask_dtype, p->mask_rank, p->mask_dims,
                           PB_PACKED_STRIDES);
            size_t step = 1;
            for (int m = p->mask_rank - 1; m >= 0; --m) {
                const int d = 4 - p->mask_rank + m;
                if (s->mask_ones & (1u << d)) {
                    t->attn_mask.strides[m] = 0;
                } else {
                    t->attn_mask.strides[m] = step;
                    step *= p->mask_dims[m];
                }
            }
        } else {
            pb_make_layout(&t->attn_mask, s->mask_dtype, p->mask_rank, p->mask_dims,
                           s->mask_layout);
        }
    }
    if (s->padding) {
        const size_t kpm_dims[2] = {s->batch, s->seq_k};
        pb_make_layout(&t->key_padding_mask, CLATTN_DTYPE_U8, 2, kpm_dims,
                       s->mask_layout == PB_PADDED ? PB_PADDED : PB_PACKED);
    }
}

/* spec.varlen: the sequences' lengths (the ends now and then; one sequence has seq_q rows and
 * seq_k keys, so the totals hold the plan's maxima); the operands none of it takes are turned
 * off. */
static void draw_varlen(pb_sdpa_problem *p)
{
    pb_sdpa_spec *s = &p->spec;
    s->mask = PB_MASK_NONE;
    s->padding = s->fully_masked = s->kv_len = 0;
    s->want_weights = s->softmax_f64 = s->rope = 0;
    s->past = 0; /* (page_size stays: packed queries over a paged cache) */
    if (s->path == CLATTN_PATH_UNFUSED) {
        s->path = CLATTN_PATH_AUTO;
    }
    const size_t ends[2] = {s->seq_q, s->seq_k};
    const size_t longest = pb_rand_below(s->batch); /* spans both maxima (the plan's) */
    /* varlen 2 (batch >= 3): the next sequence has no query rows, the one after no keys */
    const size_t no_rows = s->varlen == 2 && s->batch >= 3 ? (longest + 1) % s->batch : s->batch;
    const size_t no_keys = s->varlen == 2 && s->batch >= 3 ? (longest + 2) % s->batch : s->batch;
    int32_t *cu[2];
    size_t totals[2];
    for (int x = 0; x < 2; ++x) {
        cu[x] = pb_calloc(s->batch + 1, sizeof(int32_t));
        for (size_t b = 0; b < s->batch; ++b) {
            const size_t pick = b == longest                 ? 0
                                : b == (x ? no_keys : no_rows) ? 1
                                                               : pb_rand_below(5);
            const size_t n = pick == 0 ? ends[x] : pick == 1 ? 0 : pb_rand_below(ends[x] + 1);
            cu[x][b + 1] = cu[x][b] + (int32_t)n;
        }
        totals[x] = (size_t)cu[x][s->batch];
    }
    p->cu_q = cu[0];
    p->cu_k = cu[1];
    p->total_q = totals[0];
    p->total_k = totals[1];
}

/* spec.tree: each sequence's drafts, its last n_b keys (n_b up to its query rows, its keys
 * and 24: that many on two draws in five, none (no tree) on one, else fewer), a random tree
 * numbered parents first (draft i's parent below i, or the prefix), its n_b x n_b ancestor
 * bits packed LSB first after the previous sequence's. */
static void draw_tree(pb_sdpa_problem *p)
{
    const pb_sdpa_spec *s = &p->spec;
    p->tree_meta = pb_calloc(3 * s->batch, sizeof(int32_t));
    size_t total = 0;
    for (size_t b = 0; b < s->batch; ++b) {
        const size_t rows = s->varlen ? (size_t)(p->cu_q[b + 1] - p->cu_q[b]) : s->seq_q;
        const size_t keys = s->varlen   ? (size_t)(p->cu_k[b + 1] - p->cu_k[b])
                            : p->kv_len ? (size_t)p->kv_len[b]
                                        : s->seq_k;
        size_t most = rows < keys ? rows : keys;
        most = most < 24 ? most : 24;
        const size_t pick = pb_rand_below(5); /* no tree, every row a draft (the usual
                                               * verification step), or fewer */
        const size_t n = pick == 0 ? 0 : pick < 3 ? most : pb_rand_below(most + 1);
        p->tree_meta[3 * b] = (int32_t)(keys - n);
        p->tree_meta[3 * b + 1] = (int32_t)n;
        p->tree_meta[3 * b + 2] = (int32_t)total;
        total += (n * n + 7) / 8;
    }
    p->tree_bytes = total;
    p->tree_bits = pb_calloc(total + 1, 1);
    for (size_t b = 0; b < s->batch; ++b) {
        const size_t n = (size_t)p->tree_meta[3 * b + 1], at = (size_t)p->tree_meta[3 * b + 2];
        int parent[24];
        for (size_t i = 0; i < n; ++i) {
            parent[i] = i == 0 ? -1 : (int)pb_rand_below(i + 1) - 1;
            for (int j = (int)i; j >= 0; j = j == (int)i ? parent[i] : parent[j]) {
                const size_t bit = i * n + (size_t)j;
                p->tree_bits[at + bit / 8] |= (uint8_t)(1u << (bit % 8));
            }
        }
    }
}

void pb_sdpa_make(pb_sdpa_problem *p, const pb_sdpa_spec *spec)
{
    memset(p, 0, sizeof *p);
    p->spec = *spec;
    pb_sdpa_spec *s = &p->spec;
    if (s->fully_masked == 1) {
        s->padding = 1;
    }
    if (s->page_size) { /* a paged cache takes key counts */
        s->kv_len = 1;
    }
    if (s->fully_masked == 2 && s->mask == PB_MASK_NONE) {
        s->mask = PB_MASK_FLOAT;
    }
    if (s->mask != PB_MASK_NONE && s->mask_rank == 0) {
        s->mask_rank = 2;
    }
    if (s->v_from_k &&
        (s->dv > s->dk || s->v_dtype != s->k_dtype || s->v_scale != s->k_scale || s->past > 0)) {
        s->v_from_k = 0; /* (a view needs k's dtype, scale and columns, and no past) */
    }
    if (s->mask_rank != 4 || (s->mask_ones & 15u) == 15u) {
        /* a mask of one value everywhere is spelled with dims of 1: clattn refuses all-zero
         * strides on a tensor of more than one element (they meant packed before 0.7) */
        s->mask_zero_strides = 0;
    }
    if (s->mask == PB_MASK_BOOL) {
        s->mask_dtype = CLATTN_DTYPE_U8;
    }
    const float gain = s->q_gain > 0.0f ? s->q_gain : 1.0f;
    if (s->varlen) {
        draw_varlen(p);
    }
    if (s->varlen && s->page_size) { /* each request's key count, its keys in its pages */
        p->kv_len = pb_calloc(s->batch, sizeof(int32_t));
        for (size_t b = 0; b < s->batch; ++b) {
            p->kv_len[b] = p->cu_k[b + 1] - p->cu_k[b];
        }
    }
    /* packed sequences: one "batch" of total_q rows and total_k keys */
    const size_t batches = s->varlen ? 1 : s->batch;
    const size_t rows = s->varlen ? p->total_q : s->seq_q, keys = s->varlen ? p->total_k : s->seq_k;
    const size_t heads_total = batches * s->heads;
    p->q_count = heads_total * rows * s->dk;
    const size_t kv_total = batches * (s->kv_heads ? s->kv_heads : s->heads);
    p->k_count = kv_total * keys * s->dk;
    p->v_count = kv_total * keys * s->dv;
    p->out_count = heads_total * rows * s->dv;
    p->weights_count = heads_total * rows * keys;
    p->lse_count = heads_total * rows;
    p->q = uniform_floats(p->q_count, -gain, gain);
    p->k = uniform_floats(p->k_count, -1.0f, 1.0f);
    p->v = uniform_floats(p->v_count, -1.0f, 1.0f);
    if (s->mask != PB_MASK_NONE) {
        make_sdpa_mask(p);
    }
    if (s->padding) {
        p->padding = padding_values(s->batch, s->seq_k);
        if (s->fully_masked == 1) {
            memset(p->padding, 1, s->seq_k);
        }
    }
    if (s->kv_len && p->kv_len == NULL) {
        /* Counts 0 .. seq_k, the ends included now and then. */
        p->kv_len = pb_calloc(s->batch, sizeof(int32_t));
        for (size_t b = 0; b < s->batch; ++b) {
            const size_t pick = pb_rand_below(4);
            p->kv_len[b] = (int32_t)(pick == 0   ? s->seq_k
                                     : pick == 1 ? pb_rand_below(2)
                                                 : pb_rand_below(s->seq_k + 1));
        }
    }
    if (s->alibi) {
        /* Per head: the paper's slopes (max_bias 8) or random ones; per (batch, head): random
         * ones (so that every batch has its own). */
        const size_t count = s->alibi == 1 ? s->heads : s->batch * s->heads;
        p->alibi = pb_calloc(count, sizeof(float));
        if (s->alibi == 1 && pb_rand_below(2) &&
            clattn_alibi_slopes(s->heads, 8.0f, p->alibi) == CLATTN_SUCCESS) {
        } else {
            for (size_t i = 0; i < count; ++i) {
                p->alibi[i] = (float)(0.5 * pb_rand_unit());
            }
        }
    }
    if (s->sinks) {
        p->sinks = pb_calloc(s->heads, sizeof(float));
        for (size_t h = 0; h < s->heads; ++h) {
            p->sinks[h] = pb_rand_below(8) == 0 ? -INFINITY : (float)(-2.0 + 6.0 * pb_rand_unit());
        }
    }
    if (s->page_size) {
        /* pages in a drawn order, 0..3 spare ones; blocks wholly past a batch's key count
         * point outside the pool (-1 or past the last page) */
        p->blocks = s->seq_k / s->page_size;
        p->num_pages = s->batch * p->blocks + pb_rand_below(4);
        size_t *order = pb_calloc(p->num_pages, sizeof(size_t));
        for (size_t i = 0; i < p->num_pages; ++i) {
            order[i] = i;
        }
        for (size_t i = p->num_pages; i > 1; --i) {
            const size_t j = pb_rand_below(i), swap = order[i - 1];
            order[i - 1] = order[j];
            order[j] = swap;
        }
        p->block_table = pb_calloc(s->batch * p->blocks, sizeof(int32_t));
        for (size_t b = 0; b < s->batch; ++b) {
            const size_t count = p->kv_len ? (size_t)p->kv_len[b] : s->seq_k;
            for (size_t blk = 0; blk < p->blocks; ++blk) {
                const int32_t outside = pb_rand_below(2) ? -1 : (int32_t)(p->num_pages + blk);
                p->block_table[b * p->blocks + blk] =
                    blk * s->page_size < count ? (int32_t)order[b * p->blocks + blk] : outside;
            }
        }
        free(order);
    }
    if (s->tree) {
        draw_tree(p);
    }
    make_sdpa_layouts(p);
    if (s->tree) { /* the mask_mod's auxiliary tensors */
        const size_t bytes[1] = {p->tree_bytes + 1}, meta[2] = {s->batch, 3};
        pb_make_layout(&p->layouts.flex_aux0, CLATTN_DTYPE_U8, 1, bytes, PB_PACKED);
        pb_make_layout(&p->layouts.flex_aux1, CLATTN_DTYPE_I32, 2, meta, PB_PACKED);
    }
    if (s->v_from_k) { /* v: k's layout, its first dv columns (one buffer) */
        const size_t kv_rows = p->k_count / s->dk;
        for (size_t r = 0; r < kv_rows; ++r) {
            memcpy(p->v + r * s->dv, p->k + r * s->dk, s->dv * sizeof(float));
        }
        p->layouts.v = p->layouts.k;
        p->layouts.v.dims[p->layouts.k.rank - 1] = s->dv;
    }
    describe_sdpa(p);
    if (!s->skip_reference) {
        pb_sdpa_reference(p);
    }
}

/* spec.tree: whether query row i of sequence b keeps key j (CLATTN_TREE_MASK_SOURCE's rule). */
static int tree_keeps(const pb_sdpa_problem *p, size_t b, size_t i, size_t j)
{
    const size_t start = (size_t)p->tree_meta[3 * b], n = (size_t)p->tree_meta[3 * b + 1];
    if (j < start || n == 0) {
        return 1;
    }
    if (j - start >= n || i >= n) {
        return 0;
    }
    const size_t bit = i * n + (j - start);
    return (p->tree_bits[(size_t)p->tree_meta[3 * b + 2] + bit / 8] >> (bit % 8)) & 1;
}

/* spec.tree: -INFINITY into the (heads, rows, keys) additive mask of sequence b wherever the
 * tree drops a key. */
static void apply_tree(const pb_sdpa_problem *p, size_t b, float *mask, size_t heads, size_t rows,
                       size_t keys)
{
    for (size_t h = 0; h < heads; ++h) {
        for (size_t i = 0; i < rows; ++i) {
            for (size_t j = 0; j < keys; ++j) {
                if (!tree_keeps(p, b, i, j)) {
                    mask[(h * rows + i) * keys + j] = -INFINITY;
                }
            }
        }
    }
}

float *pb_expand_mask(const pb_sdpa_problem *p)
{
    const pb_sdpa_spec *s = &p->spec;
    if (p->mask == NULL && p->tree_meta == NULL) {
        return NULL;
    }
    const size_t full[4] = {s->batch, s->heads, s->seq_q, s->seq_k};
    const size_t count = full[0] * full[1] * full[2] * full[3];
    float *expanded = pb_calloc(count, sizeof(float));
    if (p->mask == NULL) { /* the tree alone */
        for (size_t b = 0; b < s->batch; ++b) {
            apply_tree(p, b, expanded + b * full[1] * full[2] * full[3], s->heads, s->seq_q,
                       s->seq_k);
        }
        return expanded;
    }
    /* packed strides of the logical mask, right-aligned, 0 where its dim is 1 or absent */
    size_t strides[4] = {0, 0, 0, 0}, step = 1;
    for (int m = p->mask_rank - 1; m >= 0; --m) {
        const int d = 4 - p->mask_rank + m;
        strides[d] = p->mask_dims[m] > 1 ? step : 0;
        step *= p->mask_dims[m];
    }
    size_t i = 0;
    for (size_t b = 0; b < full[0]; ++b) {
        for (size_t h = 0; h < full[1]; ++h) {
            for (size_t q = 0; q < full[2]; ++q) {
                for (size_t k = 0; k < full[3]; ++k, ++i) {
                    const float value = p->mask[b * strides[0] + h * strides[1] +
                                                q * strides[2] + k * strides[3]];
                    expanded[i] =
                        s->mask == PB_MASK_BOOL ? (value != 0.0f ? 0.0f : -INFINITY) : value;
                }
            }
        }
    }
    for (size_t b = 0; p->tree_meta != NULL && b < s->batch; ++b) {
        apply_tree(p, b, expanded + b * full[1] * full[2] * full[3], s->heads, s->seq_q, s->seq_k);
    }
    return expanded;
}

/* The packed rows first .. first + n - 1 of `packed` (rows of `heads` vectors of d) into the
 * logical (1, heads, n, d) array `seq` of one sequence. */
static void gather_rows(const float *packed, float *seq, size_t first, size_t n, size_t heads,
                        size_t d)
{
    for (size_t h = 0; h < heads; ++h) {
        for (size_t i = 0; i < n; ++i) {
            memcpy(seq + (h * n + i) * d, packed + ((first + i) * heads + h) * d,
                   d * sizeof(float));
        }
    }
}

/* spec.varlen: each sequence alone (batch 1, its own n_q and n_k, its own key count for the
 * bottom-right and ONNX rules and ALiBi), scattered into the packed out_ref and lse_ref. */
static void varlen_reference(pb_sdpa_problem *p)
{
    const pb_sdpa_spec *s = &p->spec;
    const size_t kv_heads = s->kv_heads ? s->kv_heads : s->heads;
    for (size_t b = 0; b < s->batch; ++b) {
        const size_t q0 = (size_t)p->cu_q[b], k0 = (size_t)p->cu_k[b];
        const size_t nq = (size_t)p->cu_q[b + 1] - q0, nk = (size_t)p->cu_k[b + 1] - k0;
        if (nq == 0) {
            continue;
        }
        float *q = pb_calloc(s->heads * nq * s->dk, sizeof(float));
        float *k = pb_calloc(kv_heads * nk * s->dk, sizeof(float));
        float *v = pb_calloc(kv_heads * nk * s->dv, sizeof(float));
        double *out = pb_calloc(s->heads * nq * s->dv, sizeof(double));
        double *lse = pb_calloc(s->heads * nq, sizeof(double));
        gather_rows(p->q, q, q0, nq, s->heads, s->dk);
        gather_rows(p->k, k, k0, nk, kv_heads, s->dk);
        gather_rows(p->v, v, k0, nk, kv_heads, s->dv);
        ref_sdpa_shape shape = pb_sdpa_ref_shape(s);
        shape.batch = 1;
        shape.seq_q = nq;
        shape.seq_k = nk;
        const int32_t count = (int32_t)nk;
        shape.kv_len = &count; /* the sequence's key count: ONNX's rule as bottom-right */
        shape.alibi = p->alibi ? p->alibi + (s->alibi == 1 ? 0 : b * s->heads) : NULL;
        shape.sinks = p->sinks;
        float *tree = NULL; /* spec.tree: the sequence's rows are its drafts */
        if (p->tree_meta != NULL) {
            tree = pb_calloc(s->heads * nq * nk + 1, sizeof(float));
            apply_tree(p, b, tree, s->heads, nq, nk);
        }
        ref_sdpa(&shape, q, k, v, tree, NULL, out, NULL, lse);
        free(tree);
        for (size_t h = 0; h < s->heads; ++h) {
            for (size_t i = 0; i < nq; ++i) {
                for (size_t d = 0; d < s->dv; ++d) {
                    p->out_ref[((q0 + i) * s->heads + h) * s->dv + d] = out[(h * nq + i) * s->dv + d];
                }
                p->lse_ref[h * p->total_q + q0 + i] = lse[h * nq + i];
            }
        }
        free(q);
        free(k);
        free(v);
        free(out);
        free(lse);
    }
}

/* k or v rounded as stored: FP8 with its per-tensor scale (decode(encode(x / scale)) * scale,
 * as clattn_quantize_scaled and the kernels), the others as pb_round_array. */
static void round_kv(clattn_dtype dtype, double scale, float *values, size_t count)
{
    int mbits, bias;
    double max;
    if (!fp8_format(dtype, &mbits, &bias, &max) || scale == 0.0) {
        pb_round_array(dtype, values, count);
        return;
    }
    for (size_t i = 0; i < count; ++i)
        values[i] = (float)((double)pb_round(dtype, (float)(values[i] / scale)) * scale);
}

/* FP8 k or v as uploaded: the logical values over their scale (the codes' decoded values). */
static void unscale_kv(clattn_dtype dtype, double scale, float *values, size_t count)
{
    int mbits, bias;
    double max;
    if (!fp8_format(dtype, &mbits, &bias, &max) || scale == 0.0 || values == NULL)
        return;
    for (size_t i = 0; i < count; ++i)
        values[i] = (float)(values[i] / scale);
}

void pb_sdpa_reference(pb_sdpa_problem *p)
{
    const pb_sdpa_spec *s = &p->spec;
    pb_round_array(s->q_dtype, p->q, p->q_count);
    round_kv(s->k_dtype, s->k_scale, p->k, p->k_count);
    round_kv(s->v_dtype, s->v_scale, p->v, p->v_count);
    if (p->mask != NULL) {
        pb_round_array(s->mask_dtype, p->mask, p->mask_count);
    }
    if (p->out_ref == NULL) {
        p->out_ref = pb_calloc(p->out_count, sizeof(double));
        p->lse_ref = pb_calloc(p->lse_count, sizeof(double));
        if (s->want_weights) {
            p->weights_ref = pb_calloc(p->weights_count, sizeof(double));
        }
    }
    if (s->varlen) {
        varlen_reference(p);
        return;
    }
    float *alibi = NULL;
    ref_sdpa_shape shape = pb_sdpa_problem_ref_shape(p, &alibi);
    float *mask = pb_expand_mask(p);
    const ref_rope_spec rope = {.pairs = s->rope_style == CLATTN_ROPE_PAIRS,
                                .dims = s->rope_dims,
                                .start = s->rope_start,
                                .base = s->rope_base};
    ref_sdpa_rope(&shape, s->rope ? &rope : NULL, p->q, p->k, p->v, mask, p->padding, p->out_ref,
                  p->weights_ref, p->lse_ref);
    free(mask);
    free(alibi);
}

void pb_sdpa_free(pb_sdpa_problem *p)
{
    free(p->q);
    free(p->k);
    free(p->v);
    free(p->mask);
    free(p->padding);
    free(p->kv_len);
    free(p->alibi);
    free(p->sinks);
    free(p->block_table);
    free(p->cu_q);
    free(p->cu_k);
    free(p->tree_bits);
    free(p->tree_meta);
    free(p->out_ref);
    free(p->weights_ref);
    free(p->lse_ref);
    memset(p, 0, sizeof *p);
}

void pb_sdpa_desc(const pb_sdpa_problem *p, clattn_sdpa_desc *desc)
{
    clattn_sdpa_desc_init(desc);
    CLATTN_BIND_ROLES(*desc, p->layouts); /* the problem outlives the plan's creation */
    desc->causal = p->spec.causal;
    desc->scale = p->spec.scale;
    desc->norm = p->spec.norm;
    desc->path = p->spec.path;
    desc->softcap = p->spec.softcap;
    desc->softmax_f64 = p->spec.softmax_f64;
    desc->window_align = p->spec.window_align;
    desc->window_left = p->spec.window_left;
    desc->window_right = p->spec.window_right;
    desc->diag_offset = p->spec.diag_offset;
    desc->rope = p->spec.rope;
    desc->rope_style = p->spec.rope_style;
    desc->rope_dims = PB_OR(p->spec.rope_dims, CLATTN_ROPE_WHOLE_HEAD);
    desc->rope_base = PB_OR(p->spec.rope_base, CLATTN_ROPE_BASE_DEFAULT);
    desc->rope_start = p->spec.rope_start;
    desc->dropout_p = p->spec.dropout_p;
    desc->dropout_seed = p->spec.dropout_seed;
    desc->dropout_offset = p->spec.dropout_offset;
    desc->k_scale = p->spec.k_scale;
    desc->v_scale = p->spec.v_scale;
    if (p->spec.tree) { /* its tensors: flex_aux0 and flex_aux1 of the layouts */
        clattn_flex_tree_mask(&desc->flex);
    }
    if (p->spec.varlen) { /* the longest a sequence may be: the spec's, cut to the totals */
        desc->max_seqlen_q = p->spec.seq_q < p->total_q ? p->spec.seq_q : p->total_q;
        /* (over a paged cache: the key counts say it, max_seqlen_k is refused) */
        desc->max_seqlen_k = p->spec.page_size            ? 0
                             : p->spec.seq_k < p->total_k ? p->spec.seq_k
                                                          : p->total_k;
    }
}

static const char *mode_names_[3] = {"none", "float", "bool"};

void pb_sdpa_random_spec(pb_sdpa_spec *spec, unsigned flags)
{
    static const size_t seqs[] = {1, 3, 17, 63, 65, 127, 129};
    static const size_t dims[] = {1, 3, 8, 16, 17, 64};
    pb_sdpa_spec_init(spec);
    /* PB_RANDOM_SMALL: the first four sequence lengths and head dims, up to 4 heads */
    const size_t small = (flags & PB_RANDOM_SMALL) != 0;
    spec->batch = 1 + pb_rand_below(3);
    spec->heads = 1 + pb_rand_below(small ? 4 : 16);
    spec->seq_q = seqs[pb_rand_below(small ? 4 : 7)];
    spec->seq_k = seqs[pb_rand_below(small ? 4 : 7)];
    spec->dk = dims[pb_rand_below(small ? 4 : 6)];
    spec->dv = dims[pb_rand_below(small ? 4 : 6)];
    if (flags & PB_RANDOM_OPTIONS) {
        spec->scale = pb_rand_below(2) ? NAN : (float)(0.05 + pb_rand_unit());
        spec->norm = pb_rand_below(4) == 0 ? CLATTN_NORM_RELU : CLATTN_NORM_SOFTMAX;
        spec->causal = (clattn_causal)pb_rand_below(3);
        spec->padding = (int)pb_rand_below(2);
        spec->want_lse = (int)pb_rand_below(2);
        spec->path = (clattn_path)pb_rand_below(3);
        spec->want_weights = spec->path != CLATTN_PATH_FUSED && pb_rand_below(2);
        spec->want_lse = spec->want_lse && pb_sdpa_expect_fused(spec); /* fused only */
    }
    if (flags & PB_RANDOM_DTYPES) {
        static const clattn_dtype floats[] = {CLATTN_DTYPE_F32, CLATTN_DTYPE_F16,
                                              CLATTN_DTYPE_BF16};
        spec->q_dtype = floats[pb_rand_below(3)];
        spec->k_dtype = floats[pb_rand_below(3)];
        spec->v_dtype = floats[pb_rand_below(3)];
        spec->out_dtype = floats[pb_rand_below(3)];
        spec->mask_dtype = floats[pb_rand_below(3)];
    }
    if (flags & PB_RANDOM_LAYOUTS) {
        const int fused = pb_sdpa_expect_fused(spec);
        const size_t choices = fused ? PB_LAYOUT_COUNT : PB_STRIDED_LAST;
        spec->q_layout = (pb_layout)pb_rand_below(choices);
        spec->k_layout = (pb_layout)pb_rand_below(choices);
        spec->v_layout = (pb_layout)pb_rand_below(choices);
        spec->out_layout = (pb_layout)pb_rand_below(choices);
        spec->mask_layout = pb_rand_below(2) ? PB_PADDED : PB_PACKED;
    }
    if (flags & PB_RANDOM_MASKS) {
        spec->mask = (pb_mask_kind)pb_rand_below(3);
        spec->mask_rank = 1 + (int)pb_rand_below(4);
        spec->mask_ones = (unsigned)pb_rand_below(16);
        spec->mask_zero_strides = spec->mask_rank == 4 && pb_rand_below(2);
        if (spec->mask == PB_MASK_BOOL) {
            spec->mask_dtype = CLATTN_DTYPE_U8;
        }
    }
    if (flags & PB_RANDOM_GQA) {
        /* Half the problems share k/v heads: a random divisor of heads (1 = multi-query). */
        size_t divisors[16], count = 0;
        for (size_t d = 1; d <= spec->heads; ++d) {
            if (spec->heads % d == 0) {
                divisors[count++] = d;
            }
        }
        if (pb_rand_below(2)) {
            spec->kv_heads = divisors[pb_rand_below(count)];
        }
    }
    if ((flags & PB_RANDOM_SOFTCAP) && pb_rand_below(2)) {
        spec->softcap = (float)(0.5 + 4.0 * pb_rand_unit());
    }
    if (flags & PB_RANDOM_BAND) {
        pb_sdpa_random_band(spec);
    }
    if ((flags & PB_RANDOM_ALIBI) && pb_rand_below(3) == 0) {
        spec->alibi = 1 + (int)pb_rand_below(2);
    }
    if ((flags & PB_RANDOM_SINKS) && spec->norm != CLATTN_NORM_RELU && pb_rand_below(3) == 0) {
        spec->sinks = 1;
        spec->sinks_layout = pb_rand_below(2) ? PB_PADDED : PB_PACKED;
    }
    if ((flags & PB_RANDOM_DROPOUT) && pb_rand_below(4) == 0) {
        static const double rates[] = {0.1, 0.25, 0.5, 0.9, 1.0};
        spec->dropout_p = rates[pb_rand_below(5)];
        spec->dropout_seed = ((uint64_t)pb_rand_below(1u << 31) << 33) ^ pb_rand_below(1u << 31);
        spec->dropout_offset = pb_rand_below(2) ? 0 : (uint64_t)pb_rand_below(1u << 30) << 4;
    }
}

void pb_sdpa_random_band(pb_sdpa_spec *spec)
{
    static const long long sizes[] = {-1, 0, 1, 3, 17};
    const size_t pick = pb_rand_below(8);
    /* ONNX's alignment on a quarter of the causal problems */
    if (spec->causal != CLATTN_CAUSAL_NONE && pb_rand_below(4) == 0) {
        spec->causal = CLATTN_CAUSAL_ONNX;
    }
    if (pick & 1u) { /* a sliding window, aligned as the causal bound (or any way) */
        spec->window_align = spec->causal != CLATTN_CAUSAL_NONE
                                 ? spec->causal
                                 : (clattn_causal)(1 + pb_rand_below(3));
        spec->window_left = sizes[pb_rand_below(5)];
        spec->window_right = sizes[pb_rand_below(5)];
    }
    if ((pick >> 1) == 1) {
        spec->kv_len = 1;
    } else if ((pick >> 1) == 2 && spec->seq_k > 1) { /* a KV cache: past keys, then new ones */
        spec->past = 1 + pb_rand_below(spec->seq_k - 1);
    }
}

/* Uploads t's values at a random offset into bound's tensor of the same role. */
static cl_int upload_role(clattn_ctx *ctx, const clattn_tensor *layout, clattn_tensor *bound,
                          const float *values)
{
    *bound = *layout;
    if (layout->rank == 0) {
        return CL_SUCCESS;
    }
    return pb_upload(ctx, bound, pb_rand_below(9), values);
}

/* spec.tree: the tree's bits and meta into flex_aux0 and flex_aux1 (bytes and counts as
 * floats, as upload_role takes them). */
static cl_int upload_tree(clattn_ctx *ctx, const pb_sdpa_problem *p, clattn_tensors *bound)
{
    if (p->tree_meta == NULL) {
        return CL_SUCCESS;
    }
    const size_t bytes = p->tree_bytes + 1, meta = 3 * p->spec.batch;
    float *values = pb_calloc(bytes + meta, sizeof(float));
    for (size_t i = 0; i < bytes; ++i) {
        values[i] = (float)p->tree_bits[i];
    }
    for (size_t i = 0; i < meta; ++i) {
        values[bytes + i] = (float)p->tree_meta[i];
    }
    cl_int err = upload_role(ctx, &p->layouts.flex_aux0, &bound->flex_aux0, values);
    if (err == CL_SUCCESS) {
        err = upload_role(ctx, &p->layouts.flex_aux1, &bound->flex_aux1, values + bytes);
    }
    free(values);
    return err;
}

/* spec.v_from_k: v bound to k's buffer, offset and strides with v's dims. */
static cl_int view_of_k(clattn_tensors *bound, const clattn_tensors *l)
{
    const clattn_tensor dims = l->v;
    bound->v = bound->k;
    for (int d = 0; d < dims.rank; ++d) {
        bound->v.dims[d] = dims.dims[d];
    }
    return CL_SUCCESS;
}

/* Keys from..to of packed (B * Hkv, seq_k, d) values, packed. */
static float *key_slice(const float *all, size_t heads_total, size_t seq_k, size_t d, size_t from,
                        size_t to)
{
    float *slice = pb_calloc(heads_total * (to - from) * d + 1, sizeof(float));
    for (size_t h = 0; h < heads_total; ++h) {
        memcpy(slice + h * (to - from) * d, all + (h * seq_k + from) * d,
               (to - from) * d * sizeof(float));
    }
    return slice;
}

cl_int pb_sdpa_upload(clattn_ctx *ctx, const pb_sdpa_problem *p, clattn_tensors *bound)
{
    memset(bound, 0, sizeof *bound);
    const clattn_tensors *l = &p->layouts;
    const pb_sdpa_spec *s = &p->spec;
    const size_t kv_total = s->batch * (s->kv_heads ? s->kv_heads : s->heads);
    /* (packed sequences: k and v are one run of total_k * kv_heads rows, no past) */
    const size_t slices = s->varlen ? 1 : kv_total;
    const size_t kv_rows = s->varlen ? p->total_k * (kv_total / s->batch) : s->seq_k;
    float *new_k = key_slice(p->k, slices, kv_rows, s->dk, s->past, kv_rows);
    float *new_v = key_slice(p->v, slices, kv_rows, s->dv, s->past, kv_rows);
    float *past_k = key_slice(p->k, slices, kv_rows, s->dk, 0, s->past);
    float *past_v = key_slice(p->v, slices, kv_rows, s->dv, 0, s->past);
    float *kv_len = pb_calloc(s->batch, sizeof(float));
    for (size_t b = 0; p->kv_len != NULL && b < s->batch; ++b) {
        kv_len[b] = (float)p->kv_len[b];
    }
    float *padding = NULL;
    if (p->padding != NULL) {
        const size_t count = p->spec.batch * p->spec.seq_k;
        padding = pb_calloc(count, sizeof(float));
        for (size_t i = 0; i < count; ++i) {
            padding[i] = p->padding[i];
        }
    }
    float *cu[2] = {NULL, NULL};
    for (int x = 0; x < 2 && s->varlen; ++x) { /* (cu_seqlens_k: none over pages) */
        cu[x] = pb_calloc(s->batch + 1, sizeof(float));
        for (size_t b = 0; b <= s->batch; ++b) {
            cu[x][b] = (float)(x ? p->cu_k : p->cu_q)[b];
        }
    }
    float *block_table = NULL;
    if (s->page_size) { /* the pools: each kept key in its page, NaN everywhere else */
        const size_t kv_heads = kv_total / s->batch, ps = s->page_size;
        const size_t dims[2] = {s->dk, s->dv};
        float *logical[2] = {p->k, p->v}, *pools[2] = {new_k, new_v};
        for (int x = 0; x < 2; ++x) {
            const size_t d = dims[x], count = p->num_pages * ps * kv_heads * d;
            free(pools[x]);
            pools[x] = pb_nan_floats(count);
            for (size_t b = 0; b < s->batch; ++b) {
                const size_t keys = p->kv_len ? (size_t)p->kv_len[b] : s->seq_k;
                for (size_t j = 0; j < keys; ++j) {
                    const size_t page = (size_t)p->block_table[b * p->blocks + j / ps];
                    for (size_t h = 0; h < kv_heads; ++h) {
                        /* (packed queries: the keys packed as (total_k, kv_heads, d)) */
                        const size_t row = s->varlen ? ((size_t)p->cu_k[b] + j) * kv_heads + h
                                                     : (b * kv_heads + h) * s->seq_k + j;
                        memcpy(pools[x] + ((page * ps + j % ps) * kv_heads + h) * d,
                               logical[x] + row * d, d * sizeof(float));
                    }
                }
            }
        }
        new_k = pools[0];
        new_v = pools[1];
        block_table = pb_calloc(s->batch * p->blocks, sizeof(float));
        for (size_t i = 0; i < s->batch * p->blocks; ++i) {
            block_table[i] = (float)p->block_table[i];
        }
    }
    unscale_kv(s->k_dtype, s->k_scale, new_k, pb_tensor_count(&l->k));
    unscale_kv(s->v_dtype, s->v_scale, new_v, pb_tensor_count(&l->v));
    cl_int err = CL_SUCCESS;
    if ((err = upload_role(ctx, &l->q, &bound->q, p->q)) ||
        (err = upload_role(ctx, &l->k, &bound->k, new_k)) ||
        (err = s->v_from_k ? view_of_k(bound, l) : upload_role(ctx, &l->v, &bound->v, new_v)) ||
        (err = upload_role(ctx, &l->block_table, &bound->block_table, block_table)) ||
        (err = upload_role(ctx, &l->past_k, &bound->past_k, past_k)) ||
        (err = upload_role(ctx, &l->past_v, &bound->past_v, past_v)) ||
        (err = upload_role(ctx, &l->present_k, &bound->present_k, NULL)) ||
        (err = upload_role(ctx, &l->present_v, &bound->present_v, NULL)) ||
        (err = upload_role(ctx, &l->kv_seqlen, &bound->kv_seqlen, kv_len)) ||
        (err = upload_role(ctx, &l->alibi_slopes, &bound->alibi_slopes, p->alibi)) ||
        (err = upload_role(ctx, &l->sinks, &bound->sinks, p->sinks)) ||
        (err = upload_role(ctx, &l->cu_seqlens_q, &bound->cu_seqlens_q, cu[0])) ||
        (err = upload_role(ctx, &l->cu_seqlens_k, &bound->cu_seqlens_k, cu[1])) ||
        (err = upload_role(ctx, &l->out, &bound->out, NULL)) ||
        (err = upload_role(ctx, &l->attn_mask, &bound->attn_mask, p->mask)) ||
        (err = upload_role(ctx, &l->key_padding_mask, &bound->key_padding_mask, padding)) ||
        (err = upload_role(ctx, &l->weights, &bound->weights, NULL)) ||
        (err = upload_role(ctx, &l->lse, &bound->lse, NULL)) ||
        (err = upload_tree(ctx, p, bound))) {
        pb_release_tensors(bound);
    }
    free(padding);
    free(block_table);
    free(cu[0]);
    free(cu[1]);
    free(new_k);
    free(new_v);
    free(past_k);
    free(past_v);
    free(kv_len);
    return err;
}

cl_int pb_sdpa_upload_gradients(clattn_ctx *ctx, const pb_sdpa_problem *p, const float *grad_out,
                                int want_mask, int want_sinks, clattn_tensors *bound)
{
    const pb_sdpa_spec *s = &p->spec;
    const size_t kv_heads = s->kv_heads ? s->kv_heads : s->heads;
    const size_t q_dims[4] = {s->batch, s->heads, s->seq_q, s->dk};
    const size_t k_dims[4] = {s->batch, kv_heads, s->seq_k, s->dk};
    const size_t v_dims[4] = {s->batch, kv_heads, s->seq_k, s->dv};
    const size_t o_dims[4] = {s->batch, s->heads, s->seq_q, s->dv};
    const size_t sink_dims[1] = {s->heads};
    /* packed sequences: rank 3 over the packed rows, as q, k, v and out */
    const size_t pq[3] = {p->total_q, s->heads, s->dk}, pk[3] = {p->total_k, kv_heads, s->dk};
    const size_t pv[3] = {p->total_k, kv_heads, s->dv}, po[3] = {p->total_q, s->heads, s->dv};
    const int rank = s->varlen ? 3 : 4;
    pb_make_layout(&bound->grad_out, s->out_dtype, rank, s->varlen ? po : o_dims, s->out_layout);
    pb_make_layout(&bound->grad_q, s->q_dtype, rank, s->varlen ? pq : q_dims, s->q_layout);
    pb_make_layout(&bound->grad_k, s->k_dtype, rank, s->varlen ? pk : k_dims, s->k_layout);
    pb_make_layout(&bound->grad_v, s->v_dtype, rank, s->varlen ? pv : v_dims, s->v_layout);
    if (want_mask) {
        pb_make_layout(&bound->grad_attn_mask, s->mask_dtype, p->mask_rank, p->mask_dims,
                       PB_PACKED);
    }
    if (want_sinks) {
        pb_make_layout(&bound->grad_sinks, CLATTN_DTYPE_F32, 1, sink_dims, PB_PACKED);
    }
    clattn_tensor *poisoned[5] = {&bound->grad_q, &bound->grad_k, &bound->grad_v,
                                  want_mask ? &bound->grad_attn_mask : NULL,
                                  want_sinks ? &bound->grad_sinks : NULL};
    cl_int err = pb_upload(ctx, &bound->grad_out, pb_rand_below(5), grad_out);
    for (int i = 0; i < 5 && err == CL_SUCCESS; ++i) {
        if (poisoned[i] != NULL) {
            err = pb_upload(ctx, poisoned[i], pb_rand_below(5), NULL);
        }
    }
    return err;
}

/* Rows first .. first + n - 1 of (total, heads, d) packed double values from the (heads, n, d)
 * `seq`, added (a sequence's gradient into the packed one). */
static void scatter_rows(const double *seq, double *packed, size_t first, size_t n, size_t heads,
                         size_t d)
{
    for (size_t h = 0; h < heads; ++h) {
        for (size_t i = 0; i < n; ++i) {
            for (size_t x = 0; x < d; ++x) {
                packed[((first + i) * heads + h) * d + x] += seq[(h * n + i) * d + x];
            }
        }
    }
}

/* spec.varlen: each sequence's backward alone (as varlen_reference runs its forward),
 * scattered into the packed gradients; the sinks' gradients summed over the sequences. */
static void varlen_backward_reference(const pb_sdpa_problem *p, const float *grad_out,
                                      const float *out, int magnitudes, double *dq, double *dk,
                                      double *dv, double *dsinks)
{
    const pb_sdpa_spec *s = &p->spec;
    const size_t kv_heads = s->kv_heads ? s->kv_heads : s->heads;
    memset(dq, 0, p->q_count * sizeof(double));
    memset(dk, 0, p->k_count * sizeof(double));
    memset(dv, 0, p->v_count * sizeof(double));
    memset(dsinks, 0, s->heads * sizeof(double));
    double *seq_sinks = pb_calloc(s->heads, sizeof(double));
    for (size_t b = 0; b < s->batch; ++b) {
        const size_t q0 = (size_t)p->cu_q[b], k0 = (size_t)p->cu_k[b];
        const size_t nq = (size_t)p->cu_q[b + 1] - q0, nk = (size_t)p->cu_k[b + 1] - k0;
        if (nq == 0) {
            continue; /* no row: its keys' gradients are 0 */
        }
        float *q = pb_calloc(s->heads * nq * s->dk, sizeof(float));
        float *k = pb_calloc(kv_heads * nk * s->dk, sizeof(float));
        float *v = pb_calloc(kv_heads * nk * s->dv, sizeof(float));
        float *go = pb_calloc(s->heads * nq * s->dv, sizeof(float));
        float *o = out ? pb_calloc(s->heads * nq * s->dv, sizeof(float)) : NULL;
        double *sq = pb_calloc(s->heads * nq * s->dk, sizeof(double));
        double *sk = pb_calloc(kv_heads * nk * s->dk, sizeof(double));
        double *sv = pb_calloc(kv_heads * nk * s->dv, sizeof(double));
        gather_rows(p->q, q, q0, nq, s->heads, s->dk);
        gather_rows(p->k, k, k0, nk, kv_heads, s->dk);
        gather_rows(p->v, v, k0, nk, kv_heads, s->dv);
        gather_rows(grad_out, go, q0, nq, s->heads, s->dv);
        if (o != NULL) {
            gather_rows(out, o, q0, nq, s->heads, s->dv);
        }
        ref_sdpa_shape shape = pb_sdpa_ref_shape(s);
        shape.batch = 1;
        shape.seq_q = nq;
        shape.seq_k = nk;
        const int32_t count = (int32_t)nk;
        shape.kv_len = &count; /* the sequence's key count: ONNX's rule as bottom-right */
        shape.alibi = p->alibi ? p->alibi + (s->alibi == 1 ? 0 : b * s->heads) : NULL;
        shape.sinks = p->sinks;
        float *tree = NULL; /* spec.tree: as varlen_reference */
        if (p->tree_meta != NULL) {
            tree = pb_calloc(s->heads * nq * nk + 1, sizeof(float));
            apply_tree(p, b, tree, s->heads, nq, nk);
        }
        ref_sdpa_backward(&shape, q, k, v, tree, NULL, go, o, magnitudes, sq, sk, sv, NULL,
                          seq_sinks);
        free(tree);
        scatter_rows(sq, dq, q0, nq, s->heads, s->dk);
        scatter_rows(sk, dk, k0, nk, kv_heads, s->dk);
        scatter_rows(sv, dv, k0, nk, kv_heads, s->dv);
        for (size_t h = 0; h < s->heads; ++h) {
            dsinks[h] += seq_sinks[h];
        }
        free(q);
        free(k);
        free(v);
        free(go);
        free(o);
        free(sq);
        free(sk);
        free(sv);
    }
    free(seq_sinks);
}

void pb_sdpa_backward_reference(const pb_sdpa_problem *p, const float *grad_out, const float *out,
                                int magnitudes, double *dq, double *dk, double *dv,
                                double *dscores, double *dsinks)
{
    const pb_sdpa_spec *s = &p->spec;
    if (s->varlen) {
        varlen_backward_reference(p, grad_out, out, magnitudes, dq, dk, dv, dsinks);
        return;
    }
    float *alibi = NULL;
    ref_sdpa_shape shape = pb_sdpa_problem_ref_shape(p, &alibi);
    float *mask = pb_expand_mask(p);
    ref_sdpa_backward(&shape, p->q, p->k, p->v, mask, p->padding, grad_out, out, magnitudes, dq,
                      dk, dv, dscores, dsinks);
    free(mask);
    free(alibi);
}

cl_int pb_sdpa_poison(clattn_ctx *ctx, cl_command_queue queue, const clattn_tensors *bound)
{
    const clattn_tensor *outputs[5] = {&bound->out, &bound->weights, &bound->lse, &bound->present_k,
                                       &bound->present_v};
    cl_int err = CL_SUCCESS;
    for (int i = 0; i < 5 && err == CL_SUCCESS; ++i) {
        if (outputs[i]->mem != NULL) {
            err = pb_rewrite(ctx, queue, outputs[i], NULL);
        }
    }
    return err;
}

/* present_k of a rope problem: the past keys exactly as given, then the new keys rotated
 * (float64 reference, within the output tolerance of k's dtype). */
static int expect_rotated_keys(const pb_sdpa_problem *p, const float *got)
{
    const pb_sdpa_spec *s = &p->spec;
    const size_t kv_heads = s->kv_heads ? s->kv_heads : s->heads;
    double *want = pb_calloc(p->k_count, sizeof(double));
    for (size_t e = 0; e < p->k_count; ++e) {
        want[e] = p->k[e];
    }
    ref_rope_rows(want, s->batch * kv_heads, s->seq_k, s->past, s->dk,
                  s->rope_dims ? s->rope_dims : s->dk, s->rope_style == CLATTN_ROPE_PAIRS,
                  s->rope_start, s->rope_base == 0.0 ? 10000.0 : s->rope_base);
    size_t past_wrong = 0;
    for (size_t e = 0; e < p->k_count; ++e) {
        past_wrong += (e / s->dk) % s->seq_k < s->past && !(got[e] == p->k[e]);
    }
    int ok = past_wrong == 0 ||
             pb_fail("%s: present_k: %zu past values differ from past_k", p->label, past_wrong);
    ok &= pb_expect_close(p->label, "present_k (past + rotated new keys)", got, want, p->k_count,
                          pb_tolerance(s->k_dtype));
    free(want);
    return ok;
}

int pb_sdpa_check(clattn_ctx *ctx, cl_command_queue queue, const pb_sdpa_problem *p,
                  const clattn_tensors *bound)
{
    const pb_sdpa_spec *s = &p->spec;
    const size_t rows = p->lse_count;
    int ok = 1;
    size_t stray = 0;
    float *out = pb_nan_floats(p->out_count);
    if (pb_download(ctx, queue, &bound->out, out, &stray) != CL_SUCCESS) {
        free(out);
        return 0;
    }
    ok &= expect_finite(p->label, "out", out, p->out_count);
    const double smallest = s->out_dtype == CLATTN_DTYPE_F16 ? 6.103515625e-05 /* 2^-14 */
                            : s->out_dtype == CLATTN_DTYPE_BF16 ? 1.1754943508222875e-38
                                                                : 1e-30;
    ok &= expect_close_floor(p->label, "out", out, p->out_ref, p->out_count,
                             pb_tolerance(s->out_dtype), smallest);
    if (s->varlen) { /* out's rows are (total_q, H), lse_ref's (H, total_q) */
        double *row_lse = pb_calloc(rows, sizeof(double));
        for (size_t r = 0; r < rows; ++r) {
            row_lse[r] = p->lse_ref[(r % s->heads) * p->total_q + r / s->heads];
        }
        ok &= expect_zero_rows(p->label, "out", out, row_lse, rows, s->dv);
        free(row_lse);
    } else {
        ok &= expect_zero_rows(p->label, "out", out, p->lse_ref, rows, s->dv);
    }
    ok &= expect_no_stray(p->label, "out", stray);
    free(out);
    if (bound->weights.mem != NULL && p->weights_ref != NULL) {
        float *weights = pb_nan_floats(p->weights_count);
        if (pb_download(ctx, queue, &bound->weights, weights, &stray) == CL_SUCCESS) {
            ok &= expect_finite(p->label, "weights", weights, p->weights_count);
            ok &= pb_expect_close(p->label, "weights", weights, p->weights_ref, p->weights_count,
                                  1e-4);
            ok &= expect_zero_rows(p->label, "weights", weights, p->lse_ref, rows, s->seq_k);
            ok &= expect_no_stray(p->label, "weights", stray);
        } else {
            ok = 0;
        }
        free(weights);
    }
    /* present: past then new keys and values, exactly as given (with rope: the new keys
     * rotated, within the output tolerance) */
    const clattn_tensor *present[2] = {&bound->present_k, &bound->present_v};
    const float *want[2] = {p->k, p->v};
    const size_t counts[2] = {p->k_count, p->v_count};
    for (int i = 0; i < 2; ++i) {
        if (present[i]->mem == NULL) {
            continue;
        }
        float *got = pb_nan_floats(counts[i]);
        if (pb_download(ctx, queue, present[i], got, &stray) != CL_SUCCESS) {
            ok = 0;
        } else if (i == 0 && s->rope) {
            ok &= expect_rotated_keys(p, got);
            ok &= expect_no_stray(p->label, "present_k", stray);
        } else {
            size_t wrong = 0;
            for (size_t e = 0; e < counts[i]; ++e) {
                wrong += !(got[e] == want[i][e]);
            }
            if (wrong != 0) {
                ok = pb_fail("%s: present_%s: %zu of %zu values differ from past + new", p->label,
                             i ? "v" : "k", wrong, counts[i]);
            }
            ok &= expect_no_stray(p->label, i ? "present_v" : "present_k", stray);
        }
        free(got);
    }
    if (bound->lse.mem != NULL) {
        float *lse = pb_nan_floats(rows);
        if (pb_download(ctx, queue, &bound->lse, lse, &stray) == CL_SUCCESS) {
            ok &= expect_lse(p->label, s->norm, lse, p->lse_ref, rows);
            ok &= expect_no_stray(p->label, "lse", stray);
        } else {
            ok = 0;
        }
        free(lse);
    }
    return ok;
}

/* Executes plan on bound (events waited for and released). */
static clattn_status execute(clattn_ctx *ctx, clattn_plan *plan, const clattn_tensors *bound,
                             cl_command_queue queue, cl_mem workspace, const char *label)
{
    /* The roles up to the last one present (the rest absent by their count), as an application
     * built against an older header binds them. */
    size_t num_roles = CLATTN_ROLE_COUNT;
    while (num_roles > 0 && bound->by_role[num_roles - 1].rank == 0)
        --num_roles;
    cl_event done = NULL;
    clattn_status status =
        clattn_plan_execute(plan, bound->by_role, num_roles, queue, workspace, 0, NULL, &done);
    if (status != CLATTN_SUCCESS) {
        pb_fail("%s: clattn_plan_execute: %s (%d): %s", label, clattn_status_string(status),
                (int)status, clattn_last_error(ctx));
        return status;
    }
    if (done == NULL) {
        pb_fail("%s: clattn_plan_execute returned no event", label);
        return CLATTN_SUCCESS;
    }
    cl_int err = clWaitForEvents(1, &done);
    clReleaseEvent(done);
    if (err != CL_SUCCESS) {
        pb_fail("%s: clWaitForEvents: %d", label, (int)err);
        return (clattn_status)err;
    }
    return CLATTN_SUCCESS;
}

typedef cl_int (*upload_fn)(clattn_ctx *ctx, const void *problem, clattn_tensors *bound);
typedef int (*check_fn)(clattn_ctx *ctx, cl_command_queue queue, const void *problem,
                        const clattn_tensors *bound);

static cl_int sdpa_upload_any(clattn_ctx *ctx, const void *problem, clattn_tensors *bound)
{
    return pb_sdpa_upload(ctx, problem, bound);
}

static int sdpa_check_any(clattn_ctx *ctx, cl_command_queue queue, const void *problem,
                          const clattn_tensors *bound)
{
    return pb_sdpa_check(ctx, queue, problem, bound);
}

/* CLATTN_TEST_TRACE set: each problem's label goes to stderr before it runs, so that a
 * simulator's report (printed as it happens) can be matched to its problem. */
static void trace(const char *label)
{
    const char *value = getenv("CLATTN_TEST_TRACE");
    if (value != NULL && value[0] != '\0') {
        fprintf(stderr, "problems: running %s\n", label);
        fflush(stderr);
    }
}

/* Executes a created plan `executions` times, on fresh buffers each time, checking each. */
static clattn_status run_plan(clattn_ctx *ctx, clattn_plan *plan, const void *problem,
                              const char *label, int expect_fused, const pb_run_options *options,
                              upload_fn upload, check_fn check)
{
    const pb_run_options defaults = {0};
    if (options == NULL) {
        options = &defaults;
    }
    clattn_status status = CLATTN_SUCCESS;
    trace(label);
    if (!clattn_plan_is_fused(plan) != !expect_fused) {
        pb_fail("%s: the plan is %s, expected %s", label,
                clattn_plan_is_fused(plan) ? "fused" : "unfused",
                expect_fused ? "fused" : "unfused");
    }
    cl_mem workspace = NULL;
    if (options->caller_workspace) {
        const size_t bytes = clattn_plan_workspace_size(plan);
        cl_int err = CL_SUCCESS;
        workspace = clCreateBuffer(clattn_ctx_cl_context(ctx), CL_MEM_READ_WRITE,
                                   bytes ? bytes : 16, NULL, &err);
        if (err != CL_SUCCESS) {
            pb_fail("%s: workspace of %zu bytes: clCreateBuffer %d", label, bytes, (int)err);
            return (clattn_status)err;
        }
    }
    const int executions = options->executions > 0 ? options->executions : 1;
    for (int e = 0; e < executions && status == CLATTN_SUCCESS; ++e) {
        clattn_tensors bound;
        cl_int err = upload(ctx, problem, &bound);
        if (err != CL_SUCCESS) {
            status = (clattn_status)err;
            break;
        }
        status = execute(ctx, plan, &bound, options->queue, workspace, label);
        if (status == CLATTN_SUCCESS) {
            check(ctx, options->queue, problem, &bound);
        }
        pb_release_tensors(&bound);
    }
    if (workspace != NULL) {
        clReleaseMemObject(workspace);
    }
    return status;
}

clattn_status pb_sdpa_execute_twice(clattn_ctx *ctx, clattn_plan *plan, const pb_sdpa_problem *p)
{
    clattn_tensors bound;
    clattn_status status = (clattn_status)pb_sdpa_upload(ctx, p, &bound);
    if (status != CLATTN_SUCCESS)
        return status;
    for (int run = 0; run < 2 && status == CLATTN_SUCCESS; ++run) {
        status = (clattn_status)pb_sdpa_poison(ctx, NULL, &bound);
        if (status == CLATTN_SUCCESS)
            status = clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0,
                                         NULL, NULL);
        if (status == CLATTN_SUCCESS)
            pb_sdpa_check(ctx, NULL, p, &bound);
    }
    pb_release_tensors(&bound);
    return status;
}

clattn_status pb_sdpa_run(clattn_ctx *ctx, const pb_sdpa_problem *p,
                          const pb_run_options *options)
{
    clattn_sdpa_desc desc;
    pb_sdpa_desc(p, &desc);
    clattn_plan *plan = NULL;
    clattn_status status = clattn_sdpa_plan_create(ctx, &desc, &plan);
    if (status != CLATTN_SUCCESS) {
        pb_fail("%s: clattn_sdpa_plan_create: %s (%d): %s", p->label,
                clattn_status_string(status), (int)status, clattn_last_error(ctx));
        return status;
    }
    status = run_plan(ctx, plan, p, p->label, pb_sdpa_expect_fused(&p->spec), options,
                      sdpa_upload_any, sdpa_check_any);
    clattn_plan_release(plan);
    return status;
}

/* --- MHA problems --------------------------------------------------------------------------- */

void pb_mha_spec_init(pb_mha_spec *spec)
{
    memset(spec, 0, sizeof *spec);
    spec->scale = NAN;
}

static int mha_is_self(const pb_mha_spec *s)
{
    return s->form == PB_PACKED_SELF || s->form == PB_SEPARATE_SELF;
}

static int mha_is_packed(const pb_mha_spec *s)
{
    return s->form == PB_PACKED_SELF || s->form == PB_PACKED_CROSS;
}

static void describe_mha(pb_mha_problem *p)
{
    static const char *const forms[] = {"packed_self", "packed_cross", "separate_self",
                                        "separate_cross"};
    static const char *const modes[] = {"none", "per_head", "averaged"};
    const pb_mha_spec *s = &p->spec;
    snprintf(p->label, sizeof p->label,
             "mha B=%zu Lq=%zu Lk=%zu E=%zu H=%zu Hkv=%zu kdim=%zu vdim=%zu qk_dim=%zu v_dim=%zu %s %s "
             "in_biases=%d out_proj=%d out_bias=%d need_weights=%s causal=%s mask=%s padding=%d "
             "scale=%g norm=%s path=%s query=%s+%zu key=%s+%zu value=%s+%zu out=%s+%zu",
             s->batch, s->seq_q, s->seq_k, s->embed_dim, s->num_heads,
             s->num_kv_heads ? s->num_kv_heads : s->num_heads, s->kdim, s->vdim,
             s->qk_dim, s->v_dim, s->layout == CLATTN_LAYOUT_XW ? "xw" : "torch",
             forms[s->form], s->in_biases, s->out_proj, s->out_bias, modes[s->need_weights],
             causal_name(s->causal), mode_names_[s->mask], s->padding, (double)s->scale,
             s->norm == CLATTN_NORM_RELU ? "relu" : "softmax", path_name(s->path),
             pb_dtype_name(s->query_dtype), s->query_row_gap, pb_dtype_name(s->key_dtype),
             s->key_row_gap, pb_dtype_name(s->value_dtype), s->value_row_gap,
             pb_dtype_name(s->out_dtype), s->out_row_gap);
}

/* A (batch, seq, width) activation layout with `gap` elements after each row. */
static void row_layout(clattn_tensor *t, clattn_dtype dtype, size_t batch, size_t seq,
                       size_t width, size_t gap)
{
    const size_t dims[3] = {batch, seq, width};
    pb_make_layout(t, dtype, 3, dims, PB_PACKED);
    if (gap != 0) {
        t->strides[2] = 1;
        t->strides[1] = width + gap;
        t->strides[0] = seq * (width + gap);
    }
}

static void mha_param(pb_mha_problem *p, enum pb_mha_param which, size_t rows, size_t cols,
                      size_t fan_in)
{
    const size_t count = rows * (cols ? cols : 1);
    const float bound = 1.5f / sqrtf((float)fan_in);
    p->params[which] = uniform_floats(count, -bound, bound);
    p->param_dims[which][0] = rows;
    p->param_dims[which][1] = cols;
}

static void make_mha_layouts(pb_mha_problem *p)
{
    const pb_mha_spec *s = &p->spec;
    clattn_tensors *t = &p->layouts;
    memset(t, 0, sizeof *t);
    row_layout(&t->q, s->query_dtype, s->batch, s->seq_q, s->embed_dim, s->query_row_gap);
    if (mha_is_self(s)) {
        t->k = t->q;
        t->v = t->q;
    } else {
        row_layout(&t->k, s->key_dtype, s->batch, s->seq_k, s->kdim, s->key_row_gap);
        row_layout(&t->v, s->value_dtype, s->batch, s->seq_k, s->vdim, s->value_row_gap);
    }
    row_layout(&t->out, s->out_dtype, s->batch, s->seq_q, p->out_dim, s->out_row_gap);
    if (s->mask != PB_MASK_NONE) {
        const size_t dims[2] = {s->seq_q, s->seq_k};
        pb_make_layout(&t->attn_mask,
                       s->mask == PB_MASK_BOOL ? CLATTN_DTYPE_U8 : CLATTN_DTYPE_F32, 2, dims,
                       PB_PACKED);
    }
    if (s->padding) {
        const size_t dims[2] = {s->batch, s->seq_k};
        pb_make_layout(&t->key_padding_mask, CLATTN_DTYPE_U8, 2, dims, PB_PACKED);
    }
    if (s->need_weights == CLATTN_WEIGHTS_PER_HEAD) {
        const size_t dims[4] = {s->batch, s->num_heads, s->seq_q, s->seq_k};
        pb_make_layout(&t->weights, CLATTN_DTYPE_F32, 4, dims, PB_PACKED);
    } else if (s->need_weights == CLATTN_WEIGHTS_AVERAGED) {
        const size_t dims[3] = {s->batch, s->seq_q, s->seq_k};
        pb_make_layout(&t->weights, CLATTN_DTYPE_F32, 3, dims, PB_PACKED);
    }
    clattn_tensor *roles[PB_PARAM_COUNT] = {&t->in_proj_weight, &t->in_proj_bias, &t->q_weight,
                                            &t->k_weight,       &t->v_weight,     &t->q_bias,
                                            &t->k_bias,         &t->v_bias,       &t->out_weight,
                                            &t->out_bias};
    for (int i = 0; i < PB_PARAM_COUNT; ++i) {
        if (p->params[i] != NULL) {
            const int rank = p->param_dims[i][1] ? 2 : 1;
            pb_make_layout(roles[i], CLATTN_DTYPE_F32, rank, p->param_dims[i], PB_PACKED);
        }
    }
}

static void draw_mha_inputs(pb_mha_problem *p)
{
    const pb_mha_spec *s = &p->spec;
    free(p->query);
    free(p->key);
    free(p->value);
    p->query = uniform_floats(p->query_count, -1.0f, 1.0f);
    pb_round_array(s->query_dtype, p->query, p->query_count);
    p->key = p->value = NULL;
    if (!mha_is_self(s)) {
        p->key = uniform_floats(p->key_count, -1.0f, 1.0f);
        p->value = uniform_floats(p->value_count, -1.0f, 1.0f);
        pb_round_array(s->key_dtype, p->key, p->key_count);
        pb_round_array(s->value_dtype, p->value, p->value_count);
    }
}

void pb_mha_make(pb_mha_problem *p, const pb_mha_spec *spec)
{
    memset(p, 0, sizeof *p);
    p->spec = *spec;
    pb_mha_spec *s = &p->spec;
    const size_t embed = s->embed_dim;
    if (mha_is_self(s)) {
        s->seq_k = s->seq_q;
        s->kdim = s->vdim = embed;
        s->key_dtype = s->value_dtype = s->query_dtype;
        s->key_row_gap = s->value_row_gap = s->query_row_gap;
    }
    if (mha_is_packed(s)) {
        s->kdim = s->vdim = s->qk_dim = s->v_dim = embed;
        s->layout = CLATTN_LAYOUT_TORCH;
    }
    s->kdim = s->kdim ? s->kdim : embed;
    s->vdim = s->vdim ? s->vdim : embed;
    s->qk_dim = s->qk_dim ? s->qk_dim : embed;
    s->v_dim = s->v_dim ? s->v_dim : embed;
    if (!s->out_proj) {
        s->out_bias = 0;
    }

    clattn_mha_host_desc_init(&p->desc);
    p->desc.batch = s->batch;
    p->desc.seq_q = s->seq_q;
    p->desc.seq_k = s->seq_k;
    p->desc.embed_dim = embed;
    p->desc.num_heads = s->num_heads;
    p->desc.kdim = s->kdim;
    p->desc.vdim = s->vdim;
    p->desc.qk_dim = s->qk_dim;
    p->desc.v_dim = s->v_dim;
    p->desc.num_kv_heads = PB_OR(s->num_kv_heads, CLATTN_KV_HEADS_ALL);
    p->desc.layout = s->layout;
    p->desc.causal = s->causal;
    p->desc.scale = s->scale;
    p->desc.norm = s->norm;
    p->desc.need_weights = s->need_weights;
    p->desc.path = s->path;
    p->desc.rope = s->rope;
    p->desc.rope_style = s->rope_style;
    p->desc.rope_dims = PB_OR(s->rope_dims, CLATTN_ROPE_WHOLE_HEAD);
    p->desc.rope_base = PB_OR(s->rope_base, CLATTN_ROPE_BASE_DEFAULT);
    p->desc.rope_start = s->rope_start;

    /* Parameters scaled by 1.5/sqrt(fan_in) keep every projection O(1), as nn.Linear's init
     * does. Matrices as stored: (d_in, d_out) for XW, (d_out, d_in) for TORCH. */
    const int torch = s->layout == CLATTN_LAYOUT_TORCH;
    if (mha_is_packed(s)) {
        mha_param(p, PB_IN_PROJ_W, 3 * embed, embed, embed);
        if (s->in_biases) {
            mha_param(p, PB_IN_PROJ_B, 3 * embed, 0, embed);
        }
    } else {
        const size_t kv = s->num_kv_heads ? s->num_kv_heads : s->num_heads;
        const size_t kq = s->qk_dim / s->num_heads * kv, kvd = s->v_dim / s->num_heads * kv;
        mha_param(p, PB_Q_W, torch ? s->qk_dim : embed, torch ? embed : s->qk_dim, embed);
        mha_param(p, PB_K_W, torch ? kq : s->kdim, torch ? s->kdim : kq, s->kdim);
        mha_param(p, PB_V_W, torch ? kvd : s->vdim, torch ? s->vdim : kvd, s->vdim);
        if (s->in_biases) {
            mha_param(p, PB_Q_B, s->qk_dim, 0, embed);
            mha_param(p, PB_K_B, kq, 0, s->kdim);
            mha_param(p, PB_V_B, kvd, 0, s->vdim);
        }
    }
    if (s->out_proj) {
        mha_param(p, PB_OUT_W, torch ? embed : s->v_dim, torch ? s->v_dim : embed, s->v_dim);
        if (s->out_bias) {
            mha_param(p, PB_OUT_B, embed, 0, s->v_dim);
        }
    }
    clattn_mha_host_weights weights = {
        .in_proj_weight = p->params[PB_IN_PROJ_W],
        .in_proj_bias = p->params[PB_IN_PROJ_B],
        .q_weight = p->params[PB_Q_W],
        .k_weight = p->params[PB_K_W],
        .v_weight = p->params[PB_V_W],
        .q_bias = p->params[PB_Q_B],
        .k_bias = p->params[PB_K_B],
        .v_bias = p->params[PB_V_B],
        .out_weight = p->params[PB_OUT_W],
        .out_bias = p->params[PB_OUT_B],
    };
    p->weights = weights;

    p->query_count = s->batch * s->seq_q * embed;
    p->key_count = s->batch * s->seq_k * s->kdim;
    p->value_count = s->batch * s->seq_k * s->vdim;
    draw_mha_inputs(p);

    const size_t mask_count = s->seq_q * s->seq_k;
    if (s->mask == PB_MASK_FLOAT) {
        p->attn_mask = float_mask_values(mask_count);
    } else if (s->mask == PB_MASK_BOOL) {
        float *values = bool_mask_values(mask_count);
        p->bool_mask = pb_calloc(mask_count, 1);
        p->attn_mask = pb_calloc(mask_count, sizeof(float));
        for (size_t i = 0; i < mask_count; ++i) {
            p->bool_mask[i] = u8_of(values[i]);
            p->attn_mask[i] = values[i] != 0.0f ? 0.0f : -INFINITY;
        }
        free(values);
    }
    if (s->padding) {
        p->padding = pb_calloc(s->batch * s->seq_k, 1);
        for (size_t i = 0; i < s->batch * s->seq_k; ++i) {
            p->padding[i] = pb_rand_below(4) == 0;
        }
        p->padding[0] = 0; /* batch entry 0 keeps key 0 */
        if (s->batch > 2) {
            memset(p->padding + 2 * s->seq_k, 1, s->seq_k); /* entry 2: every key masked */
        }
    }
    p->masks.attn_mask = p->attn_mask;
    p->masks.key_padding_mask = p->padding;

    p->out_dim = s->out_proj ? embed : s->v_dim;
    p->out_count = s->batch * s->seq_q * p->out_dim;
    if (s->need_weights != CLATTN_WEIGHTS_NONE) {
        p->attn_count = s->batch * s->seq_q * s->seq_k *
                        (s->need_weights == CLATTN_WEIGHTS_PER_HEAD ? s->num_heads : 1);
    }
    make_mha_layouts(p);
    describe_mha(p);
    pb_mha_reference(p);
}

void pb_mha_redraw_inputs(pb_mha_problem *p)
{
    draw_mha_inputs(p);
}

void pb_mha_reference(pb_mha_problem *p)
{
    if (p->out_ref == NULL) {
        p->out_ref = pb_calloc(p->out_count, sizeof(double));
        p->attn_ref = p->attn_count ? pb_calloc(p->attn_count, sizeof(double)) : NULL;
    }
    ref_mha_forward(&p->desc, &p->weights, p->query, p->key, p->value, &p->masks, p->out_ref,
                    p->attn_ref);
}

void pb_mha_free(pb_mha_problem *p)
{
    for (int i = 0; i < PB_PARAM_COUNT; ++i) {
        free(p->params[i]);
    }
    free(p->query);
    free(p->key);
    free(p->value);
    free(p->attn_mask);
    free(p->bool_mask);
    free(p->padding);
    free(p->out_ref);
    free(p->attn_ref);
    memset(p, 0, sizeof *p);
}

void pb_mha_desc(const pb_mha_problem *p, clattn_mha_desc *desc)
{
    clattn_mha_desc_init(desc);
    CLATTN_BIND_ROLES(*desc, p->layouts); /* the problem outlives the plan's creation */
    desc->num_heads = p->spec.num_heads;
    desc->num_kv_heads = PB_OR(p->spec.num_kv_heads, CLATTN_KV_HEADS_ALL);
    desc->layout = p->spec.layout;
    desc->causal = p->spec.causal;
    desc->scale = p->spec.scale;
    desc->norm = p->spec.norm;
    desc->need_weights = p->spec.need_weights;
    desc->path = p->spec.path;
    desc->rope = p->spec.rope;
    desc->rope_style = p->spec.rope_style;
    desc->rope_dims = PB_OR(p->spec.rope_dims, CLATTN_ROPE_WHOLE_HEAD);
    desc->rope_base = PB_OR(p->spec.rope_base, CLATTN_ROPE_BASE_DEFAULT);
    desc->rope_start = p->spec.rope_start;
}

static float *bytes_as_floats(const uint8_t *bytes, size_t count)
{
    if (bytes == NULL) {
        return NULL;
    }
    float *values = pb_calloc(count, sizeof(float));
    for (size_t i = 0; i < count; ++i) {
        values[i] = bytes[i];
    }
    return values;
}

cl_int pb_mha_upload(clattn_ctx *ctx, const pb_mha_problem *p, clattn_tensors *bound)
{
    const pb_mha_spec *s = &p->spec;
    const clattn_tensors *l = &p->layouts;
    memset(bound, 0, sizeof *bound);
    float *mask = s->mask == PB_MASK_BOOL
                      ? bytes_as_floats(p->bool_mask, s->seq_q * s->seq_k)
                      : NULL;
    float *padding = bytes_as_floats(p->padding, s->batch * s->seq_k);
    const clattn_tensor *param_layouts[PB_PARAM_COUNT] = {
        &l->in_proj_weight, &l->in_proj_bias, &l->q_weight, &l->k_weight, &l->v_weight,
        &l->q_bias,         &l->k_bias,       &l->v_bias,   &l->out_weight, &l->out_bias};
    clattn_tensor *param_bound[PB_PARAM_COUNT] = {
        &bound->in_proj_weight, &bound->in_proj_bias, &bound->q_weight, &bound->k_weight,
        &bound->v_weight,       &bound->q_bias,       &bound->k_bias,   &bound->v_bias,
        &bound->out_weight,     &bound->out_bias};
    cl_int err = upload_role(ctx, &l->q, &bound->q, p->query);
    if (err == CL_SUCCESS && mha_is_self(s)) {
        bound->k = bound->q;
        bound->v = bound->q;
    } else if (err == CL_SUCCESS) {
        if ((err = upload_role(ctx, &l->k, &bound->k, p->key)) == CL_SUCCESS) {
            err = upload_role(ctx, &l->v, &bound->v, p->value);
        }
    }
    if (err == CL_SUCCESS) {
        err = upload_role(ctx, &l->out, &bound->out, NULL);
    }
    if (err == CL_SUCCESS) {
        err = upload_role(ctx, &l->attn_mask, &bound->attn_mask, mask ? mask : p->attn_mask);
    }
    if (err == CL_SUCCESS) {
        err = upload_role(ctx, &l->key_padding_mask, &bound->key_padding_mask, padding);
    }
    if (err == CL_SUCCESS) {
        err = upload_role(ctx, &l->weights, &bound->weights, NULL);
    }
    for (int i = 0; i < PB_PARAM_COUNT && err == CL_SUCCESS; ++i) {
        err = upload_role(ctx, param_layouts[i], param_bound[i], p->params[i]);
    }
    if (err != CL_SUCCESS) {
        pb_release_tensors(bound);
    }
    free(padding);
    free(mask);
    return err;
}

cl_int pb_mha_poison(clattn_ctx *ctx, cl_command_queue queue, const clattn_tensors *bound)
{
    cl_int err = pb_rewrite(ctx, queue, &bound->out, NULL);
    if (err == CL_SUCCESS && bound->weights.mem != NULL) {
        err = pb_rewrite(ctx, queue, &bound->weights, NULL);
    }
    return err;
}

int pb_mha_check(clattn_ctx *ctx, cl_command_queue queue, const pb_mha_problem *p,
                 const clattn_tensors *bound)
{
    int ok = 1;
    size_t stray = 0;
    float *out = pb_nan_floats(p->out_count);
    if (pb_download(ctx, queue, &bound->out, out, &stray) != CL_SUCCESS) {
        free(out);
        return 0;
    }
    ok &= expect_finite(p->label, "out", out, p->out_count);
    ok &= pb_expect_close(p->label, "out", out, p->out_ref, p->out_count,
                          pb_tolerance(p->spec.out_dtype));
    ok &= expect_no_stray(p->label, "out", stray);
    free(out);
    if (bound->weights.mem != NULL && p->attn_ref != NULL) {
        float *attn = pb_nan_floats(p->attn_count);
        if (pb_download(ctx, queue, &bound->weights, attn, &stray) == CL_SUCCESS) {
            ok &= expect_finite(p->label, "attn_weights", attn, p->attn_count);
            ok &= pb_expect_close(p->label, "attn_weights", attn, p->attn_ref, p->attn_count,
                                  1e-4);
            ok &= expect_no_stray(p->label, "attn_weights", stray);
        } else {
            ok = 0;
        }
        free(attn);
    }
    return ok;
}

int pb_mha_check_host(const pb_mha_problem *p, const float *out, const float *attn)
{
    int ok = expect_finite(p->label, "out", out, p->out_count);
    ok &= pb_expect_close(p->label, "out", out, p->out_ref, p->out_count, 1e-4);
    if (attn != NULL && p->attn_ref != NULL) {
        ok &= expect_finite(p->label, "attn_weights", attn, p->attn_count);
        ok &= pb_expect_close(p->label, "attn_weights", attn, p->attn_ref, p->attn_count, 1e-4);
    }
    return ok;
}

static cl_int mha_upload_any(clattn_ctx *ctx, const void *problem, clattn_tensors *bound)
{
    return pb_mha_upload(ctx, problem, bound);
}

static int mha_check_any(clattn_ctx *ctx, cl_command_queue queue, const void *problem,
                         const clattn_tensors *bound)
{
    return pb_mha_check(ctx, queue, problem, bound);
}

clattn_status pb_mha_run(clattn_ctx *ctx, const pb_mha_problem *p, const pb_run_options *options)
{
    clattn_mha_desc desc;
    pb_mha_desc(p, &desc);
    clattn_plan *plan = NULL;
    clattn_status status = clattn_mha_plan_create(ctx, &desc, &plan);
    if (status != CLATTN_SUCCESS) {
        pb_fail("%s: clattn_mha_plan_create: %s (%d): %s", p->label, clattn_status_string(status),
                (int)status, clattn_last_error(ctx));
        return status;
    }
    const pb_mha_spec *s = &p->spec;
    const size_t dk = s->qk_dim / s->num_heads, dv = s->v_dim / s->num_heads;
    const int fused = s->path == CLATTN_PATH_FUSED ||
                      (s->path == CLATTN_PATH_AUTO && s->need_weights == CLATTN_WEIGHTS_NONE &&
                       dk <= 256 && dv <= 256);
    status = run_plan(ctx, plan, p, p->label, fused, options, mha_upload_any, mha_check_any);
    clattn_plan_release(plan);
    return status;
}
