/*
 * clattn_io: .npy read/write, safetensors read, PNG heatmaps (see clattn_io.h for the contract).
 *
 * Safety rule of every reader: a size taken from a file is compared with the file's real length
 * (or a documented limit) before anything is allocated from it, and every product of sizes is
 * overflow-checked. Values are decoded byte by byte from little-endian, so the readers and the
 * writer behave the same on any host byte order.
 */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* fileno, fstat, fseeko */
#endif
#ifndef _FILE_OFFSET_BITS
#define _FILE_OFFSET_BITS 64 /* files over 2 GiB on 32-bit hosts */
#endif

#include "clattn_io.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef _WIN32
#include <sys/stat.h>
#include <sys/types.h>
#endif

#include <cjson/cJSON.h>
#include <png.h>

#include "font5x7.h"

#define NPY_MAX_HEADER ((uint64_t)1 << 20)           /* 1 MiB */
#define ST_MAX_HEADER ((uint64_t)100 << 20)          /* 100 MiB */
#define JSON_MAX_EXACT_INT 9007199254740992.0        /* 2^53: JSON numbers are doubles */
#define CHUNK_BYTES 16384                            /* conversion buffer, a multiple of 8 */
#define NAME_SHOWN_MAX 80                            /* longest tensor name quoted in a message */
#define SHAPE_TEXT_MAX (CLATTN_IO_MAX_DIMS * 22 + 4) /* "(a, b, ...)" with 20-digit entries */

/* ------------------------------------------------------------------------------------------
 * Status names, messages, arrays
 * ------------------------------------------------------------------------------------------ */

const char *clattn_io_status_string(clattn_io_status status)
{
    switch (status) {
    case CLATTN_IO_OK:
        return "CLATTN_IO_OK";
    case CLATTN_IO_ERR_OPEN:
        return "CLATTN_IO_ERR_OPEN";
    case CLATTN_IO_ERR_FORMAT:
        return "CLATTN_IO_ERR_FORMAT";
    case CLATTN_IO_ERR_UNSUPPORTED:
        return "CLATTN_IO_ERR_UNSUPPORTED";
    case CLATTN_IO_ERR_TOO_LARGE:
        return "CLATTN_IO_ERR_TOO_LARGE";
    case CLATTN_IO_ERR_MEMORY:
        return "CLATTN_IO_ERR_MEMORY";
    case CLATTN_IO_ERR_NOT_FOUND:
        return "CLATTN_IO_ERR_NOT_FOUND";
    case CLATTN_IO_ERR_ARGUMENT:
        return "CLATTN_IO_ERR_ARGUMENT";
    }
    return "CLATTN_IO_UNKNOWN_STATUS";
}

static void clear_message(char *msg, size_t msg_size)
{
    if (msg != NULL && msg_size > 0)
        msg[0] = '\0';
}

/* Writes "<path>: <formatted text>" to msg and returns status. */
static clattn_io_status fail(char *msg, size_t msg_size, clattn_io_status status, const char *path,
                             const char *format, ...)
{
    if (msg != NULL && msg_size > 0) {
        int prefix = snprintf(msg, msg_size, "%s: ", path != NULL ? path : "(no path)");
        if (prefix >= 0 && (size_t)prefix < msg_size) {
            va_list args;
            va_start(args, format);
            vsnprintf(msg + prefix, msg_size - (size_t)prefix, format, args);
            va_end(args);
        }
    }
    return status;
}

void clattn_array_free(clattn_array *array)
{
    if (array == NULL)
        return;
    free(array->data);
    memset(array, 0, sizeof *array);
}

/* A name from a file, safe to quote: control bytes become '?', long names are cut with "...". */
static void quote_name(char *dst, size_t dst_size, const char *name)
{
    size_t length = 0;
    if (dst_size == 0)
        return;
    for (; name[length] != '\0' && length < NAME_SHOWN_MAX && length + 1 < dst_size; ++length) {
        unsigned char byte = (unsigned char)name[length];
        dst[length] = (byte < 0x20 || byte == 0x7f) ? '?' : (char)byte;
    }
    dst[length] = '\0';
    if (name[length] != '\0' && length >= 3)
        memcpy(dst + length - 3, "...", 3);
}

/* Python's repr of a shape tuple: "()", "(5,)", "(3, 5)". */
static void format_shape(char *dst, size_t dst_size, int ndim, const size_t *shape)
{
    size_t used = 0;
    int written = snprintf(dst, dst_size, "(");
    for (int d = 0; d < ndim && written >= 0; ++d) {
        used += (size_t)written;
        if (used >= dst_size)
            return;
        written = snprintf(dst + used, dst_size - used, d == 0 ? "%zu" : ", %zu", shape[d]);
    }
    if (written < 0)
        return;
    used += (size_t)written;
    if (used < dst_size)
        snprintf(dst + used, dst_size - used, ndim == 1 ? ",)" : ")");
}

static int mul_overflows(size_t a, size_t b, size_t *product)
{
    if (a != 0 && b > SIZE_MAX / a)
        return 1;
    *product = a * b;
    return 0;
}

/* Product of the first ndim entries; 1 for ndim 0. */
static int shape_count(int ndim, const size_t *shape, size_t *count)
{
    size_t product = 1;
    for (int d = 0; d < ndim; ++d) {
        if (mul_overflows(product, shape[d], &product))
            return 1;
    }
    *count = product;
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Files
 * ------------------------------------------------------------------------------------------ */

/* Opens a regular file for reading and tells its length. */
static clattn_io_status open_input(const char *path, FILE **out, uint64_t *size, char *msg,
                                   size_t msg_size)
{
    clattn_io_status status = CLATTN_IO_OK;
    FILE *file = fopen(path, "rb");
    *out = NULL;
    if (file == NULL) {
        status = fail(msg, msg_size, CLATTN_IO_ERR_OPEN, path, "cannot open for reading: %s",
                      strerror(errno));
        goto done;
    }
#ifndef _WIN32
    struct stat info;
    if (fstat(fileno(file), &info) != 0) {
        status = fail(msg, msg_size, CLATTN_IO_ERR_OPEN, path, "cannot stat: %s", strerror(errno));
        goto done;
    }
    if (!S_ISREG(info.st_mode) || info.st_size < 0) {
        status = fail(msg, msg_size, CLATTN_IO_ERR_OPEN, path, "not a regular file");
        goto done;
    }
    *size = (uint64_t)info.st_size;
#else
    __int64 end = -1;
    if (_fseeki64(file, 0, SEEK_END) != 0 || (end = _ftelli64(file)) < 0 ||
        _fseeki64(file, 0, SEEK_SET) != 0) {
        status = fail(msg, msg_size, CLATTN_IO_ERR_OPEN, path, "cannot seek: %s", strerror(errno));
        goto done;
    }
    *size = (uint64_t)end;
#endif
done:
    if (status == CLATTN_IO_OK)
        *out = file;
    else if (file != NULL)
        fclose(file);
    return status;
}

static int seek_to(FILE *file, uint64_t offset)
{
#ifndef _WIN32
    if (offset > (uint64_t)INT64_MAX || (uint64_t)(off_t)offset != offset)
        return -1;
    return fseeko(file, (off_t)offset, SEEK_SET);
#else
    if (offset > (uint64_t)INT64_MAX)
        return -1;
    return _fseeki64(file, (__int64)offset, SEEK_SET);
#endif
}

/* Reads exactly `size` bytes; a short read is OPEN (I/O error) or FORMAT (end of file). */
static clattn_io_status read_exact(FILE *file, void *dst, size_t size, const char *what,
                                   const char *path, char *msg, size_t msg_size)
{
    if (size == 0 || fread(dst, 1, size, file) == size)
        return CLATTN_IO_OK;
    if (ferror(file))
        return fail(msg, msg_size, CLATTN_IO_ERR_OPEN, path, "read error in %s: %s", what,
                    strerror(errno));
    return fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path, "file ends inside %s", what);
}

/* ------------------------------------------------------------------------------------------
 * Little-endian decoding and conversion to float32
 * ------------------------------------------------------------------------------------------ */

static uint16_t load_u16(const unsigned char *bytes)
{
    return (uint16_t)(bytes[0] | (unsigned)bytes[1] << 8);
}

static uint32_t load_u32(const unsigned char *bytes)
{
    return (uint32_t)bytes[0] | (uint32_t)bytes[1] << 8 | (uint32_t)bytes[2] << 16 |
           (uint32_t)bytes[3] << 24;
}

static uint64_t load_u64(const unsigned char *bytes)
{
    return (uint64_t)load_u32(bytes) | (uint64_t)load_u32(bytes + 4) << 32;
}

static void store_u32(unsigned char *bytes, uint32_t value)
{
    for (int i = 0; i < 4; ++i)
        bytes[i] = (unsigned char)(value >> (8 * i));
}

static float float_from_bits(uint32_t bits)
{
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* float64 -> float32 with IEEE overflow to +-inf made explicit (out-of-range conversion is
 * undefined in ISO C without Annex F). 0x1.ffffffp127 is the midpoint between FLT_MAX and 2^128:
 * from there on, round-to-nearest-even gives infinity. */
static float narrow_double(double value)
{
    if (value >= 0x1.ffffffp127)
        return INFINITY;
    if (value <= -0x1.ffffffp127)
        return -INFINITY;
    return (float)value;
}

/* IEEE binary16 -> binary32, exact for every value (subnormals, infinities, NaN payloads). */
static float half_to_float(uint16_t half)
{
    uint32_t sign = (uint32_t)(half >> 15) << 31;
    uint32_t exponent = (half >> 10) & 0x1f;
    uint32_t mantissa = half & 0x3ff;
    if (exponent == 0x1f)
        return float_from_bits(sign | 0x7f800000u | mantissa << 13);
    if (exponent != 0)
        return float_from_bits(sign | (exponent + 112) << 23 | mantissa << 13);
    float magnitude = ldexpf((float)mantissa, -24); /* zero or subnormal: mantissa * 2^-24 */
    return sign ? -magnitude : magnitude;
}

typedef void (*convert_fn)(const unsigned char *src, size_t count, float *dst);

static void convert_f32(const unsigned char *src, size_t count, float *dst)
{
    for (size_t i = 0; i < count; ++i)
        dst[i] = float_from_bits(load_u32(src + 4 * i));
}

static void convert_f64(const unsigned char *src, size_t count, float *dst)
{
    for (size_t i = 0; i < count; ++i) {
        uint64_t bits = load_u64(src + 8 * i);
        double value;
        memcpy(&value, &bits, sizeof value);
        dst[i] = narrow_double(value);
    }
}

static void convert_bool(const unsigned char *src, size_t count, float *dst)
{
    for (size_t i = 0; i < count; ++i)
        dst[i] = src[i] != 0 ? 1.0f : 0.0f;
}

static void convert_u8(const unsigned char *src, size_t count, float *dst)
{
    for (size_t i = 0; i < count; ++i)
        dst[i] = (float)src[i];
}

static void convert_f16(const unsigned char *src, size_t count, float *dst)
{
    for (size_t i = 0; i < count; ++i)
        dst[i] = half_to_float(load_u16(src + 2 * i));
}

static void convert_bf16(const unsigned char *src, size_t count, float *dst)
{
    for (size_t i = 0; i < count; ++i)
        dst[i] = float_from_bits((uint32_t)load_u16(src + 2 * i) << 16);
}

static void convert_i64(const unsigned char *src, size_t count, float *dst)
{
    for (size_t i = 0; i < count; ++i)
        dst[i] = (float)(int64_t)load_u64(src + 8 * i);
}

static void convert_i32(const unsigned char *src, size_t count, float *dst)
{
    for (size_t i = 0; i < count; ++i)
        dst[i] = (float)(int32_t)load_u32(src + 4 * i);
}

/* Reads count elements of elem_size bytes from the file's position, converting into dst. */
static clattn_io_status read_converted(FILE *file, size_t count, size_t elem_size,
                                       convert_fn convert, float *dst, const char *path, char *msg,
                                       size_t msg_size)
{
    unsigned char chunk[CHUNK_BYTES];
    size_t per_chunk = sizeof chunk / elem_size;
    for (size_t done = 0; done < count;) {
        size_t n = count - done < per_chunk ? count - done : per_chunk;
        clattn_io_status status =
            read_exact(file, chunk, n * elem_size, "the data", path, msg, msg_size);
        if (status != CLATTN_IO_OK)
            return status;
        convert(chunk, n, dst + done);
        done += n;
    }
    return CLATTN_IO_OK;
}

/* count floats (at least one, so data is never NULL on success). */
static clattn_io_status alloc_floats(size_t count, float **out, const char *path, char *msg,
                                     size_t msg_size)
{
    size_t bytes;
    if (mul_overflows(count ? count : 1, sizeof(float), &bytes))
        return fail(msg, msg_size, CLATTN_IO_ERR_TOO_LARGE, path,
                    "%zu float32 values do not fit in memory", count);
    *out = malloc(bytes);
    if (*out == NULL)
        return fail(msg, msg_size, CLATTN_IO_ERR_MEMORY, path, "out of memory allocating %zu bytes",
                    bytes);
    return CLATTN_IO_OK;
}

/* ------------------------------------------------------------------------------------------
 * .npy header: a Python dict literal such as
 *   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
 * parsed strictly (the three keys once each, in any order, any whitespace, trailing commas),
 * without evaluating anything.
 * ------------------------------------------------------------------------------------------ */

#define NPY_DESCR_MAX 32

typedef struct npy_header {
    char descr[NPY_DESCR_MAX]; /* as found, cut to fit (for messages) */
    size_t descr_length;       /* full length */
    int has_descr, descr_is_list, has_fortran, fortran_order, has_shape;
    int ndim; /* number of entries found, may exceed CLATTN_IO_MAX_DIMS */
    size_t shape[CLATTN_IO_MAX_DIMS];
    int entry_overflow; /* an entry above SIZE_MAX */
} npy_header;

typedef struct npy_cursor {
    const char *start, *at, *end;
    const char *problem; /* set on the first syntax error */
} npy_cursor;

static int npy_error(npy_cursor *cursor, const char *problem)
{
    if (cursor->problem == NULL)
        cursor->problem = problem;
    return 0;
}

static void npy_skip_space(npy_cursor *cursor)
{
    while (cursor->at < cursor->end && (*cursor->at == ' ' || *cursor->at == '\t' ||
                                        *cursor->at == '\n' || *cursor->at == '\r'))
        ++cursor->at;
}

static int npy_accept(npy_cursor *cursor, char ch)
{
    npy_skip_space(cursor);
    if (cursor->at < cursor->end && *cursor->at == ch) {
        ++cursor->at;
        return 1;
    }
    return 0;
}

static int npy_peek(npy_cursor *cursor, char ch)
{
    npy_skip_space(cursor);
    return cursor->at < cursor->end && *cursor->at == ch;
}

/* A quoted string without escapes; copied (cut) into dst, full length in *length. */
static int npy_string(npy_cursor *cursor, char *dst, size_t dst_size, size_t *length)
{
    npy_skip_space(cursor);
    if (cursor->at >= cursor->end || (*cursor->at != '\'' && *cursor->at != '"'))
        return npy_error(cursor, "expected a quoted string");
    char quote = *cursor->at++;
    size_t count = 0;
    for (; cursor->at < cursor->end && *cursor->at != quote; ++cursor->at, ++count) {
        if (*cursor->at == '\\' || *cursor->at == '\n')
            return npy_error(cursor, "escape or newline inside a string");
        if (count + 1 < dst_size)
            dst[count] = *cursor->at;
    }
    if (cursor->at >= cursor->end)
        return npy_error(cursor, "unterminated string");
    ++cursor->at;
    dst[count + 1 < dst_size ? count : dst_size - 1] = '\0';
    *length = count;
    return 1;
}

static int is_identifier_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_';
}

static int npy_word(npy_cursor *cursor, const char *word)
{
    size_t length = strlen(word);
    npy_skip_space(cursor);
    if ((size_t)(cursor->end - cursor->at) < length || memcmp(cursor->at, word, length) != 0)
        return 0;
    if (cursor->at + length < cursor->end && is_identifier_char(cursor->at[length]))
        return 0;
    cursor->at += length;
    return 1;
}

/* A non-negative integer (Python 2 files may add an 'L'); entries above SIZE_MAX are flagged. */
static int npy_dimension(npy_cursor *cursor, npy_header *header)
{
    size_t value = 0;
    int overflow = 0;
    npy_skip_space(cursor);
    if (cursor->at >= cursor->end || *cursor->at < '0' || *cursor->at > '9')
        return npy_error(cursor, "shape entries must be non-negative integers");
    for (; cursor->at < cursor->end && *cursor->at >= '0' && *cursor->at <= '9'; ++cursor->at) {
        size_t digit = (size_t)(*cursor->at - '0');
        if (value > (SIZE_MAX - digit) / 10)
            overflow = 1;
        else
            value = value * 10 + digit;
    }
    if (cursor->at < cursor->end && (*cursor->at == 'L' || *cursor->at == 'l'))
        ++cursor->at;
    if (cursor->at < cursor->end && (is_identifier_char(*cursor->at) || *cursor->at == '.'))
        return npy_error(cursor, "shape entries must be non-negative integers");
    if (overflow)
        header->entry_overflow = 1;
    if (header->ndim < CLATTN_IO_MAX_DIMS)
        header->shape[header->ndim] = value;
    ++header->ndim;
    return 1;
}

/* A tuple of integers: (), (5,), (3, 4), (3, 4,). "(5)" is not a tuple in Python. */
static int npy_shape(npy_cursor *cursor, npy_header *header)
{
    if (!npy_accept(cursor, '('))
        return npy_error(cursor, "shape must be a tuple such as (3, 4)");
    if (npy_accept(cursor, ')'))
        return 1;
    int trailing_comma = 0;
    for (;;) {
        if (!npy_dimension(cursor, header))
            return 0;
        trailing_comma = npy_accept(cursor, ',');
        if (npy_accept(cursor, ')'))
            break;
        if (!trailing_comma)
            return npy_error(cursor, "expected ',' or ')' in shape");
    }
    if (header->ndim == 1 && !trailing_comma)
        return npy_error(cursor, "shape (n) is not a tuple; a 1-tuple is written (n,)");
    return 1;
}

/* Skips a structured dtype's list [...] (strings may hold brackets). */
static int npy_skip_list(npy_cursor *cursor)
{
    int depth = 0;
    char quote = 0;
    for (; cursor->at < cursor->end; ++cursor->at) {
        char ch = *cursor->at;
        if (quote != 0) {
            if (ch == quote)
                quote = 0;
        } else if (ch == '\'' || ch == '"') {
            quote = ch;
        } else if (ch == '[' || ch == '(') {
            ++depth;
        } else if (ch == ']' || ch == ')') {
            if (--depth == 0) {
                ++cursor->at;
                return 1;
            }
        }
    }
    return npy_error(cursor, "unterminated list");
}

static int npy_entry(npy_cursor *cursor, npy_header *header)
{
    char key[32];
    size_t key_length;
    if (!npy_string(cursor, key, sizeof key, &key_length))
        return 0;
    if (!npy_accept(cursor, ':'))
        return npy_error(cursor, "expected ':' after a key");
    if (strcmp(key, "descr") == 0 && key_length == 5) {
        if (header->has_descr)
            return npy_error(cursor, "key 'descr' appears twice");
        header->has_descr = 1;
        if (npy_peek(cursor, '[')) {
            header->descr_is_list = 1;
            return npy_skip_list(cursor);
        }
        return npy_string(cursor, header->descr, sizeof header->descr, &header->descr_length);
    }
    if (strcmp(key, "fortran_order") == 0 && key_length == 13) {
        if (header->has_fortran)
            return npy_error(cursor, "key 'fortran_order' appears twice");
        header->has_fortran = 1;
        if (npy_word(cursor, "True"))
            header->fortran_order = 1;
        else if (!npy_word(cursor, "False"))
            return npy_error(cursor, "fortran_order must be True or False");
        return 1;
    }
    if (strcmp(key, "shape") == 0 && key_length == 5) {
        if (header->has_shape)
            return npy_error(cursor, "key 'shape' appears twice");
        header->has_shape = 1;
        return npy_shape(cursor, header);
    }
    return npy_error(cursor, "unexpected key (only 'descr', 'fortran_order' and 'shape')");
}

static int npy_parse_dict(npy_cursor *cursor, npy_header *header)
{
    if (!npy_accept(cursor, '{'))
        return npy_error(cursor, "expected '{'");
    while (!npy_accept(cursor, '}')) {
        if (!npy_entry(cursor, header))
            return 0;
        if (!npy_accept(cursor, ',') && !npy_peek(cursor, '}'))
            return npy_error(cursor, "expected ',' or '}'");
    }
    npy_skip_space(cursor);
    if (cursor->at != cursor->end)
        return npy_error(cursor, "unexpected text after the dict");
    return 1;
}

/* The dtypes clattn reads. */
typedef struct npy_dtype {
    size_t elem_size;
    convert_fn convert;
    clattn_io_dtype source;
} npy_dtype;

static clattn_io_status npy_check_dtype(const npy_header *header, npy_dtype *dtype,
                                        const char *path, char *msg, size_t msg_size)
{
    const char *descr = header->descr;
    if (header->descr_is_list)
        return fail(msg, msg_size, CLATTN_IO_ERR_UNSUPPORTED, path,
                    "descr is a structured dtype (a list of fields): use a plain float32, "
                    "float64, float16, bool or uint8 array");
    if (header->descr_length == 3) {
        const char *kind = descr + 1;
        int any_order = descr[0] == '<' || descr[0] == '>' || descr[0] == '|' || descr[0] == '=';
        if (descr[0] == '<' && strcmp(kind, "f4") == 0) {
            *dtype = (npy_dtype){4, convert_f32, CLATTN_IO_F32};
            return CLATTN_IO_OK;
        }
        if (descr[0] == '<' && strcmp(kind, "f8") == 0) {
            *dtype = (npy_dtype){8, convert_f64, CLATTN_IO_F32};
            return CLATTN_IO_OK;
        }
        if (descr[0] == '<' && strcmp(kind, "f2") == 0) {
            *dtype = (npy_dtype){2, convert_f16, CLATTN_IO_F16};
            return CLATTN_IO_OK;
        }
        if ((descr[0] == '<' || descr[0] == '|') && strcmp(kind, "V2") == 0) {
            *dtype = (npy_dtype){2, convert_bf16, CLATTN_IO_BF16};
            return CLATTN_IO_OK;
        }
        if (descr[0] == '<' && strcmp(kind, "i8") == 0) {
            *dtype = (npy_dtype){8, convert_i64, CLATTN_IO_INT};
            return CLATTN_IO_OK;
        }
        if (descr[0] == '<' && strcmp(kind, "i4") == 0) {
            *dtype = (npy_dtype){4, convert_i32, CLATTN_IO_INT};
            return CLATTN_IO_OK;
        }
        if (any_order && strcmp(kind, "b1") == 0) {
            *dtype = (npy_dtype){1, convert_bool, CLATTN_IO_BOOL};
            return CLATTN_IO_OK;
        }
        if (any_order && strcmp(kind, "u1") == 0) {
            *dtype = (npy_dtype){1, convert_u8, CLATTN_IO_BOOL};
            return CLATTN_IO_OK;
        }
        if (descr[0] == '>' &&
            (strcmp(kind, "f4") == 0 || strcmp(kind, "f8") == 0 || strcmp(kind, "f2") == 0))
            return fail(msg, msg_size, CLATTN_IO_ERR_UNSUPPORTED, path,
                        "descr '%s' is big-endian: only little-endian files are supported "
                        "(numpy: a.astype('<f4'))",
                        descr);
    }
    char shown[NPY_DESCR_MAX + 4];
    quote_name(shown, sizeof shown, descr);
    if (header->descr_length >= NPY_DESCR_MAX && strlen(shown) >= 3)
        memcpy(shown + strlen(shown) - 3, "...", 3);
    return fail(msg, msg_size, CLATTN_IO_ERR_UNSUPPORTED, path,
                "descr '%s' is not supported: use float32, float64, float16, bfloat16, int64, "
                "int32, bool or uint8",
                shown);
}

/* Reads magic, version and header length; leaves the file at the start of the header. */
static clattn_io_status npy_read_preamble(FILE *file, uint64_t file_size, uint32_t *header_length,
                                          uint64_t *data_start, const char *path, char *msg,
                                          size_t msg_size)
{
    static const unsigned char magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
    unsigned char preamble[12];
    size_t got = fread(preamble, 1, 8, file);
    if (got < sizeof magic || memcmp(preamble, magic, sizeof magic) != 0)
        return fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path, "not a .npy file (bad magic)");
    if (got < 8)
        return fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                    "file ends inside the header (%zu bytes)", got);
    unsigned major = preamble[6], minor = preamble[7];
    if (major < 1 || major > 3 || minor != 0)
        return fail(msg, msg_size, CLATTN_IO_ERR_UNSUPPORTED, path,
                    ".npy format version %u.%u is not supported (1.0, 2.0 and 3.0 are)", major,
                    minor);
    size_t length_bytes = major == 1 ? 2 : 4;
    if (fread(preamble + 8, 1, length_bytes, file) != length_bytes)
        return fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                    "file ends inside the header (%" PRIu64 " bytes)", file_size);
    *header_length = major == 1 ? load_u16(preamble + 8) : load_u32(preamble + 8);
    uint64_t header_start = 8 + length_bytes;
    if (*header_length > file_size - header_start)
        return fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                    "header length %" PRIu32 " runs past the end of the file (%" PRIu64 " bytes)",
                    *header_length, file_size);
    if (*header_length > NPY_MAX_HEADER)
        return fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                    "header length %" PRIu32 " exceeds the 1 MiB limit", *header_length);
    *data_start = header_start + *header_length;
    return CLATTN_IO_OK;
}

static clattn_io_status npy_parse_header(const char *text, size_t length, npy_header *header,
                                         const char *path, char *msg, size_t msg_size)
{
    npy_cursor cursor = {text, text, text + length, NULL};
    memset(header, 0, sizeof *header);
    if (!npy_parse_dict(&cursor, header))
        return fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                    "header is not a valid dict: %s at byte %zu of the header", cursor.problem,
                    (size_t)(cursor.at - cursor.start));
    const char *missing = !header->has_descr     ? "descr"
                          : !header->has_fortran ? "fortran_order"
                          : !header->has_shape   ? "shape"
                                                 : NULL;
    if (missing != NULL)
        return fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path, "header has no '%s' key", missing);
    return CLATTN_IO_OK;
}

/* Checks dtype, order, rank and sizes; on success *count and *data_bytes describe the data. */
static clattn_io_status npy_check_layout(const npy_header *header, uint64_t data_available,
                                         npy_dtype *dtype, size_t *count, const char *path,
                                         char *msg, size_t msg_size)
{
    clattn_io_status status = npy_check_dtype(header, dtype, path, msg, msg_size);
    if (status != CLATTN_IO_OK)
        return status;
    if (header->fortran_order)
        return fail(msg, msg_size, CLATTN_IO_ERR_UNSUPPORTED, path,
                    "the array is in Fortran order: save a C-order array "
                    "(numpy: np.ascontiguousarray(a))");
    if (header->ndim > CLATTN_IO_MAX_DIMS)
        return fail(msg, msg_size, CLATTN_IO_ERR_UNSUPPORTED, path,
                    "shape has %d dimensions; at most %d are supported", header->ndim,
                    CLATTN_IO_MAX_DIMS);
    char shape_text[SHAPE_TEXT_MAX];
    if (header->entry_overflow)
        return fail(msg, msg_size, CLATTN_IO_ERR_TOO_LARGE, path,
                    "a shape entry exceeds the largest size (%zu)", (size_t)SIZE_MAX);
    format_shape(shape_text, sizeof shape_text, header->ndim, header->shape);
    size_t bytes;
    if (shape_count(header->ndim, header->shape, count) ||
        mul_overflows(*count, dtype->elem_size, &bytes))
        return fail(msg, msg_size, CLATTN_IO_ERR_TOO_LARGE, path,
                    "shape %s of %s overflows the size of memory", shape_text, header->descr);
    if ((uint64_t)bytes != data_available)
        return fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                    "file has %" PRIu64 " bytes of data, shape %s of %s needs %zu", data_available,
                    shape_text, header->descr, bytes);
    return CLATTN_IO_OK;
}

clattn_io_status clattn_npy_read(const char *path, clattn_array *out, char *msg, size_t msg_size)
{
    clattn_io_status status = CLATTN_IO_OK;
    FILE *file = NULL;
    char *text = NULL;
    clattn_array array;
    memset(&array, 0, sizeof array);
    clear_message(msg, msg_size);
    if (out != NULL)
        memset(out, 0, sizeof *out);
    if (path == NULL || out == NULL) {
        status = fail(msg, msg_size, CLATTN_IO_ERR_ARGUMENT, path, "clattn_npy_read: %s is NULL",
                      path == NULL ? "path" : "out");
        goto done;
    }
    uint64_t file_size = 0, data_start = 0;
    uint32_t header_length = 0;
    status = open_input(path, &file, &file_size, msg, msg_size);
    if (status != CLATTN_IO_OK)
        goto done;
    status = npy_read_preamble(file, file_size, &header_length, &data_start, path, msg, msg_size);
    if (status != CLATTN_IO_OK)
        goto done;
    text = malloc((size_t)header_length + 1);
    if (text == NULL) {
        status = fail(msg, msg_size, CLATTN_IO_ERR_MEMORY, path, "out of memory for the header");
        goto done;
    }
    status = read_exact(file, text, header_length, "the header", path, msg, msg_size);
    if (status != CLATTN_IO_OK)
        goto done;
    npy_header header;
    status = npy_parse_header(text, header_length, &header, path, msg, msg_size);
    if (status != CLATTN_IO_OK)
        goto done;
    npy_dtype dtype = {0, NULL, CLATTN_IO_F32};
    size_t count = 0;
    status = npy_check_layout(&header, file_size - data_start, &dtype, &count, path, msg, msg_size);
    if (status != CLATTN_IO_OK)
        goto done;
    status = alloc_floats(count, &array.data, path, msg, msg_size);
    if (status != CLATTN_IO_OK)
        goto done;
    status = read_converted(file, count, dtype.elem_size, dtype.convert, array.data, path, msg,
                            msg_size);
    if (status != CLATTN_IO_OK)
        goto done;
    array.ndim = header.ndim;
    memcpy(array.shape, header.shape, sizeof array.shape);
    array.count = count;
    array.source = dtype.source;
done:
    if (status == CLATTN_IO_OK)
        *out = array;
    else
        clattn_array_free(&array);
    free(text);
    if (file != NULL)
        fclose(file);
    return status;
}

static uint32_t bits_from_float(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

/* Rounds value >> shift (1 <= shift <= 31) to the nearest integer, ties to even. */
static uint32_t shift_round_even(uint32_t value, unsigned shift)
{
    const uint32_t kept = value >> shift, rest = value & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    return kept + (rest > half || (rest == half && (kept & 1u)));
}

/* IEEE binary32 -> binary16, round to nearest even: past 65504 (from the midpoint 65520 on) to
 * +-inf, below 2^-14 to subnormals (or a signed zero under 2^-25); a NaN stays a quiet NaN with
 * its sign and the top of its payload. */
static uint16_t float_to_half(float value)
{
    const uint32_t bits = bits_from_float(value);
    const uint16_t sign = (uint16_t)(bits >> 16 & 0x8000u);
    const uint32_t exponent = bits >> 23 & 0xffu, mantissa = bits & 0x7fffffu;
    if (exponent == 0xff)
        return (uint16_t)(sign | 0x7c00u | (mantissa ? 0x200u | mantissa >> 13 : 0u));
    if (exponent > 142) /* 2^16 and beyond */
        return (uint16_t)(sign | 0x7c00u);
    if (exponent >= 113) /* a normal half, 2^-14 .. 2^16; a carry may reach the exponent (inf) */
        return (uint16_t)(sign | shift_round_even((exponent - 112) << 23 | mantissa, 13));
    /* Subnormal half: value / 2^-24 = (2^23 + mantissa) * 2^(exponent - 126); under 2^-25
     * (float subnormals included) it rounds to zero. A carry to 0x400 is the smallest normal. */
    if (exponent < 102)
        return sign;
    return (uint16_t)(sign | shift_round_even(0x800000u | mantissa, 126 - exponent));
}

/* IEEE binary32 -> bfloat16 (its top 16 bits), round to nearest even, overflow to +-inf; a NaN
 * stays a quiet NaN (the rounding carry could turn a NaN payload into infinity). */
static uint16_t float_to_bfloat16(float value)
{
    const uint32_t bits = bits_from_float(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)(bits >> 16 | 0x40u);
    return (uint16_t)((bits + 0x7fffu + (bits >> 16 & 1u)) >> 16);
}

/* Writes count floats as little-endian float32, float16 or bfloat16 (elem_size 4, 2, 2). */
static int write_values(FILE *file, const float *data, size_t count, clattn_io_dtype dtype)
{
    unsigned char chunk[CHUNK_BYTES];
    const size_t elem_size = dtype == CLATTN_IO_F32 ? 4 : 2, per_chunk = sizeof chunk / elem_size;
    for (size_t done = 0; done < count;) {
        size_t n = count - done < per_chunk ? count - done : per_chunk;
        for (size_t i = 0; i < n; ++i) {
            const float value = data[done + i];
            if (dtype == CLATTN_IO_F32) {
                store_u32(chunk + 4 * i, bits_from_float(value));
                continue;
            }
            const uint16_t bits =
                dtype == CLATTN_IO_F16 ? float_to_half(value) : float_to_bfloat16(value);
            chunk[2 * i] = (unsigned char)(bits & 0xff);
            chunk[2 * i + 1] = (unsigned char)(bits >> 8);
        }
        if (fwrite(chunk, elem_size, n, file) != n)
            return -1;
        done += n;
    }
    return 0;
}

static clattn_io_status npy_write(const char *caller, const char *path, const float *data, int ndim,
                                  const size_t *shape, clattn_io_dtype dtype, char *msg,
                                  size_t msg_size)
{
    clattn_io_status status = CLATTN_IO_OK;
    FILE *file = NULL;
    size_t count = 0, bytes = 0;
    clear_message(msg, msg_size);
    if (path == NULL || ndim < 0 || ndim > CLATTN_IO_MAX_DIMS || (ndim > 0 && shape == NULL)) {
        status = fail(msg, msg_size, CLATTN_IO_ERR_ARGUMENT, path,
                      "%s: need a path, 0 <= ndim <= %d (got %d) and a shape", caller,
                      CLATTN_IO_MAX_DIMS, ndim);
        goto done;
    }
    const char *descr = dtype == CLATTN_IO_F32    ? "<f4"
                        : dtype == CLATTN_IO_F16  ? "<f2"
                        : dtype == CLATTN_IO_BF16 ? "<V2"
                                                  : NULL;
    if (descr == NULL) {
        status = fail(msg, msg_size, CLATTN_IO_ERR_ARGUMENT, path,
                      "%s: dtype %d is not CLATTN_IO_F32, CLATTN_IO_F16 or CLATTN_IO_BF16", caller,
                      (int)dtype);
        goto done;
    }
    if (shape_count(ndim, shape, &count) ||
        mul_overflows(count, dtype == CLATTN_IO_F32 ? 4 : 2, &bytes)) {
        status = fail(msg, msg_size, CLATTN_IO_ERR_TOO_LARGE, path,
                      "the shape's element count overflows");
        goto done;
    }
    if (count > 0 && data == NULL) {
        status = fail(msg, msg_size, CLATTN_IO_ERR_ARGUMENT, path,
                      "%s: data is NULL for %zu values", caller, count);
        goto done;
    }
    /* numpy's layout: the dict, spaces, '\n', so that the data starts at a multiple of 64. */
    char shape_text[SHAPE_TEXT_MAX];
    char header[SHAPE_TEXT_MAX + 192];
    format_shape(shape_text, sizeof shape_text, ndim, shape);
    int length =
        snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                 descr, shape_text);
    size_t used = (size_t)length;
    size_t padding = (64 - (10 + used + 1) % 64) % 64;
    memset(header + used, ' ', padding);
    used += padding;
    header[used++] = '\n';
    unsigned char preamble[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
    preamble[8] = (unsigned char)(used & 0xff);
    preamble[9] = (unsigned char)(used >> 8);
    file = fopen(path, "wb");
    if (file == NULL) {
        status =
            fail(msg, msg_size, CLATTN_IO_ERR_OPEN, path, "cannot create: %s", strerror(errno));
        goto done;
    }
    if (fwrite(preamble, 1, sizeof preamble, file) != sizeof preamble ||
        fwrite(header, 1, used, file) != used || write_values(file, data, count, dtype) != 0) {
        status = fail(msg, msg_size, CLATTN_IO_ERR_OPEN, path, "write error: %s", strerror(errno));
        goto done;
    }
done:
    if (file != NULL) {
        if (fclose(file) != 0 && status == CLATTN_IO_OK)
            status = fail(msg, msg_size, CLATTN_IO_ERR_OPEN, path, "write error on close: %s",
                          strerror(errno));
        if (status != CLATTN_IO_OK)
            remove(path);
    }
    return status;
}

clattn_io_status clattn_npy_write(const char *path, const float *data, int ndim,
                                  const size_t *shape, char *msg, size_t msg_size)
{
    return npy_write("clattn_npy_write", path, data, ndim, shape, CLATTN_IO_F32, msg, msg_size);
}

clattn_io_status clattn_npy_write_typed(const char *path, const float *data, int ndim,
                                        const size_t *shape, clattn_io_dtype dtype, char *msg,
                                        size_t msg_size)
{
    return npy_write("clattn_npy_write_typed", path, data, ndim, shape, dtype, msg, msg_size);
}

/* ------------------------------------------------------------------------------------------
 * safetensors: u64 little-endian N, N bytes of JSON, the data section.
 *   {"__metadata__": {...}, "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}
 * ------------------------------------------------------------------------------------------ */

typedef enum st_kind { ST_UNKNOWN, ST_F32, ST_F16, ST_BF16, ST_F64, ST_OTHER } st_kind;

typedef struct st_dtype_info {
    const char *name;
    size_t size;
    st_kind kind;
} st_dtype_info;

static const st_dtype_info st_dtypes[] = {
    {"F64", 8, ST_F64},    {"F32", 4, ST_F32},       {"F16", 2, ST_F16},       {"BF16", 2, ST_BF16},
    {"I64", 8, ST_OTHER},  {"I32", 4, ST_OTHER},     {"I16", 2, ST_OTHER},     {"I8", 1, ST_OTHER},
    {"U64", 8, ST_OTHER},  {"U32", 4, ST_OTHER},     {"U16", 2, ST_OTHER},     {"U8", 1, ST_OTHER},
    {"BOOL", 1, ST_OTHER}, {"F8_E4M3", 1, ST_OTHER}, {"F8_E5M2", 1, ST_OTHER},
};

#define ST_DTYPE_MAX 24

typedef struct st_tensor {
    char *name;
    char dtype[ST_DTYPE_MAX]; /* as found, cut to fit (for messages) */
    st_kind kind;
    int ndim; /* may exceed CLATTN_IO_MAX_DIMS (then only listable) */
    size_t shape[CLATTN_IO_MAX_DIMS];
    size_t count;
    uint64_t begin, end; /* relative to the data section */
} st_tensor;

struct clattn_safetensors {
    FILE *file;
    char *path;
    uint64_t data_start, data_length;
    size_t count;
    st_tensor *tensors;  /* header order */
    st_tensor **by_name; /* sorted by name, for lookup and the duplicate check */
};

static char *copy_string(const char *text)
{
    size_t length = strlen(text) + 1;
    char *copy = malloc(length);
    if (copy != NULL)
        memcpy(copy, text, length);
    return copy;
}

/* A JSON number that is an integer in [0, 2^53]. */
static int json_size(const cJSON *item, uint64_t *value)
{
    if (!cJSON_IsNumber(item))
        return 0;
    double number = item->valuedouble;
    if (!(number >= 0.0) || number > JSON_MAX_EXACT_INT || floor(number) != number)
        return 0;
    *value = (uint64_t)number;
    return 1;
}

static void json_describe(const cJSON *item, char *dst, size_t dst_size)
{
    if (cJSON_IsNumber(item))
        snprintf(dst, dst_size, "%.17g", item->valuedouble);
    else if (cJSON_IsString(item))
        snprintf(dst, dst_size, "a string");
    else
        snprintf(dst, dst_size, "not a number");
}

static clattn_io_status st_parse_shape(const cJSON *shape, st_tensor *tensor, const char *shown,
                                       const char *path, char *msg, size_t msg_size)
{
    if (!cJSON_IsArray(shape))
        return fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path, "tensor '%s' has no \"shape\" array",
                    shown);
    int index = 0;
    size_t count = 1;
    int overflow = 0;
    for (const cJSON *entry = shape->child; entry != NULL; entry = entry->next, ++index) {
        uint64_t value;
        if (!json_size(entry, &value)) {
            char found[40];
            json_describe(entry, found, sizeof found);
            return fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                        "tensor '%s' shape entry %d (%s) is not an integer in [0, 2^53]", shown,
                        index, found);
        }
        if (value > SIZE_MAX || mul_overflows(count, (size_t)value, &count))
            overflow = 1;
        if (index < CLATTN_IO_MAX_DIMS)
            tensor->shape[index] = (size_t)value;
    }
    if (overflow)
        return fail(msg, msg_size, CLATTN_IO_ERR_TOO_LARGE, path,
                    "tensor '%s' shape's element count overflows", shown);
    tensor->ndim = index;
    tensor->count = count;
    return CLATTN_IO_OK;
}

static clattn_io_status st_parse_offsets(const cJSON *offsets, st_tensor *tensor,
                                         uint64_t data_length, const char *shown, const char *path,
                                         char *msg, size_t msg_size)
{
    if (!cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2 ||
        !json_size(offsets->child, &tensor->begin) ||
        !json_size(offsets->child->next, &tensor->end))
        return fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                    "tensor '%s' \"data_offsets\" is not two integers [begin, end]", shown);
    if (tensor->end < tensor->begin)
        return fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                    "tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64 ") end before they begin",
                    shown, tensor->begin, tensor->end);
    if (tensor->end > data_length)
        return fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                    "tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64
                    ") end past the data section (%" PRIu64 " bytes)",
                    shown, tensor->begin, tensor->end, data_length);
    return CLATTN_IO_OK;
}

/* Validates one tensor entry: dtype, shape, offsets inside the data section, size match. */
static clattn_io_status st_parse_tensor(const cJSON *item, st_tensor *tensor, uint64_t data_length,
                                        const char *path, char *msg, size_t msg_size)
{
    char shown[NAME_SHOWN_MAX + 1];
    quote_name(shown, sizeof shown, item->string);
    if (!cJSON_IsObject(item))
        return fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path, "tensor '%s' is not a JSON object",
                    shown);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    if (!cJSON_IsString(dtype) || dtype->valuestring == NULL)
        return fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                    "tensor '%s' has no \"dtype\" string", shown);
    quote_name(tensor->dtype, sizeof tensor->dtype, dtype->valuestring);
    tensor->kind = ST_UNKNOWN;
    size_t elem_size = 0;
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; ++i) {
        if (strcmp(dtype->valuestring, st_dtypes[i].name) == 0) {
            tensor->kind = st_dtypes[i].kind;
            elem_size = st_dtypes[i].size;
        }
    }
    clattn_io_status status = st_parse_shape(cJSON_GetObjectItemCaseSensitive(item, "shape"),
                                             tensor, shown, path, msg, msg_size);
    if (status != CLATTN_IO_OK)
        return status;
    status = st_parse_offsets(cJSON_GetObjectItemCaseSensitive(item, "data_offsets"), tensor,
                              data_length, shown, path, msg, msg_size);
    if (status != CLATTN_IO_OK || tensor->kind == ST_UNKNOWN)
        return status;
    size_t bytes;
    if (mul_overflows(tensor->count, elem_size, &bytes))
        return fail(msg, msg_size, CLATTN_IO_ERR_TOO_LARGE, path, "tensor '%s' byte size overflows",
                    shown);
    if ((uint64_t)bytes != tensor->end - tensor->begin) {
        char shape_text[SHAPE_TEXT_MAX];
        format_shape(shape_text, sizeof shape_text,
                     tensor->ndim < CLATTN_IO_MAX_DIMS ? tensor->ndim : CLATTN_IO_MAX_DIMS,
                     tensor->shape);
        return fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                    "tensor '%s' has shape %s%s of %s (%zu bytes) but data_offsets [%" PRIu64
                    ", %" PRIu64 ") hold %" PRIu64 " bytes",
                    shown, shape_text, tensor->ndim > CLATTN_IO_MAX_DIMS ? "..." : "",
                    tensor->dtype, bytes, tensor->begin, tensor->end, tensor->end - tensor->begin);
    }
    return CLATTN_IO_OK;
}

static int st_compare_names(const void *a, const void *b)
{
    const st_tensor *const *left = a;
    const st_tensor *const *right = b;
    return strcmp((*left)->name, (*right)->name);
}

static int st_is_metadata(const cJSON *item)
{
    return item->string != NULL && strcmp(item->string, "__metadata__") == 0;
}

/* Fills file->tensors from the parsed header, then sorts and checks for duplicate names. */
static clattn_io_status st_load_tensors(clattn_safetensors *file, const cJSON *root, char *msg,
                                        size_t msg_size)
{
    const char *path = file->path;
    size_t count = 0;
    for (const cJSON *item = root->child; item != NULL; item = item->next)
        count += !st_is_metadata(item);
    file->tensors = calloc(count ? count : 1, sizeof *file->tensors);
    file->by_name = calloc(count ? count : 1, sizeof *file->by_name);
    if (file->tensors == NULL || file->by_name == NULL)
        return fail(msg, msg_size, CLATTN_IO_ERR_MEMORY, path, "out of memory for %zu tensors",
                    count);
    for (const cJSON *item = root->child; item != NULL; item = item->next) {
        if (st_is_metadata(item))
            continue;
        if (item->string == NULL)
            return fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path, "header entry without a name");
        st_tensor *tensor = &file->tensors[file->count];
        tensor->name = copy_string(item->string);
        if (tensor->name == NULL)
            return fail(msg, msg_size, CLATTN_IO_ERR_MEMORY, path, "out of memory");
        file->by_name[file->count] = tensor;
        ++file->count;
        clattn_io_status status =
            st_parse_tensor(item, tensor, file->data_length, path, msg, msg_size);
        if (status != CLATTN_IO_OK)
            return status;
    }
    qsort(file->by_name, file->count, sizeof *file->by_name, st_compare_names);
    for (size_t i = 1; i < file->count; ++i) {
        if (strcmp(file->by_name[i - 1]->name, file->by_name[i]->name) == 0) {
            char shown[NAME_SHOWN_MAX + 1];
            quote_name(shown, sizeof shown, file->by_name[i]->name);
            return fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                        "tensor name '%s' appears more than once", shown);
        }
    }
    return CLATTN_IO_OK;
}

/* Reads and parses the JSON header; file->file is positioned after the length field. */
static clattn_io_status st_parse_header(clattn_safetensors *file, uint64_t header_length, char *msg,
                                        size_t msg_size)
{
    clattn_io_status status = CLATTN_IO_OK;
    const char *path = file->path;
    cJSON *root = NULL;
    char *text = malloc((size_t)header_length + 1);
    if (text == NULL) {
        status = fail(msg, msg_size, CLATTN_IO_ERR_MEMORY, path,
                      "out of memory for a %" PRIu64 "-byte header", header_length);
        goto done;
    }
    status = read_exact(file->file, text, (size_t)header_length, "the header", path, msg, msg_size);
    if (status != CLATTN_IO_OK)
        goto done;
    const char *end = NULL;
    root = cJSON_ParseWithLengthOpts(text, (size_t)header_length, &end, 0);
    if (root == NULL) {
        size_t at = end != NULL && end >= text ? (size_t)(end - text) : 0;
        status = fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                      "header is not valid JSON (error near byte %zu of %" PRIu64 ")", at,
                      header_length);
        goto done;
    }
    for (const char *at = end; at < text + header_length; ++at) {
        if (*at != ' ' && *at != '\t' && *at != '\n' && *at != '\r') {
            status =
                fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                     "unexpected bytes after the JSON header (at byte %zu)", (size_t)(at - text));
            goto done;
        }
    }
    if (!cJSON_IsObject(root)) {
        status =
            fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path, "header is JSON but not an object");
        goto done;
    }
    status = st_load_tensors(file, root, msg, msg_size);
done:
    cJSON_Delete(root);
    free(text);
    return status;
}

clattn_io_status clattn_safetensors_open(const char *path, clattn_safetensors **out, char *msg,
                                         size_t msg_size)
{
    clattn_io_status status = CLATTN_IO_OK;
    clattn_safetensors *file = NULL;
    clear_message(msg, msg_size);
    if (out != NULL)
        *out = NULL;
    if (path == NULL || out == NULL) {
        status = fail(msg, msg_size, CLATTN_IO_ERR_ARGUMENT, path,
                      "clattn_safetensors_open: %s is NULL", path == NULL ? "path" : "out");
        goto done;
    }
    file = calloc(1, sizeof *file);
    if (file == NULL || (file->path = copy_string(path)) == NULL) {
        status = fail(msg, msg_size, CLATTN_IO_ERR_MEMORY, path, "out of memory");
        goto done;
    }
    uint64_t file_size = 0;
    status = open_input(path, &file->file, &file_size, msg, msg_size);
    if (status != CLATTN_IO_OK)
        goto done;
    unsigned char length_bytes[8];
    if (file_size < sizeof length_bytes) {
        status =
            fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                 "file is %" PRIu64 " bytes, too short for the 8-byte header length", file_size);
        goto done;
    }
    status = read_exact(file->file, length_bytes, sizeof length_bytes, "the header length", path,
                        msg, msg_size);
    if (status != CLATTN_IO_OK)
        goto done;
    uint64_t header_length = load_u64(length_bytes);
    if (header_length > file_size - 8) {
        status = fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                      "header length %" PRIu64 " runs past the end of the file (%" PRIu64 " bytes)",
                      header_length, file_size);
        goto done;
    }
    if (header_length > ST_MAX_HEADER) {
        status = fail(msg, msg_size, CLATTN_IO_ERR_TOO_LARGE, path,
                      "header length %" PRIu64 " exceeds the 100 MiB limit", header_length);
        goto done;
    }
    file->data_start = 8 + header_length;
    file->data_length = file_size - file->data_start;
    status = st_parse_header(file, header_length, msg, msg_size);
done:
    if (status == CLATTN_IO_OK)
        *out = file;
    else
        clattn_safetensors_close(file);
    return status;
}

void clattn_safetensors_close(clattn_safetensors *file)
{
    if (file == NULL)
        return;
    if (file->tensors != NULL) {
        for (size_t i = 0; i < file->count; ++i)
            free(file->tensors[i].name);
    }
    free(file->tensors);
    free(file->by_name);
    if (file->file != NULL)
        fclose(file->file);
    free(file->path);
    free(file);
}

size_t clattn_safetensors_count(const clattn_safetensors *file)
{
    return file != NULL ? file->count : 0;
}

const char *clattn_safetensors_name(const clattn_safetensors *file, size_t i)
{
    if (file == NULL || i >= file->count)
        return NULL;
    return file->tensors[i].name;
}

static const st_tensor *st_find(const clattn_safetensors *file, const char *name)
{
    if (file == NULL || name == NULL || file->count == 0)
        return NULL;
    st_tensor key;
    key.name = (char *)name; /* only read by the comparison */
    const st_tensor *key_pointer = &key;
    st_tensor *const *found =
        bsearch(&key_pointer, file->by_name, file->count, sizeof *file->by_name, st_compare_names);
    return found != NULL ? *found : NULL;
}

int clattn_safetensors_has(const clattn_safetensors *file, const char *name)
{
    return st_find(file, name) != NULL;
}

/* "the file has 3 tensors: a, b, c" (the first few, for a NOT_FOUND message). */
static void st_list_names(const clattn_safetensors *file, char *dst, size_t dst_size)
{
    size_t used = 0;
    int written = snprintf(dst, dst_size, "the file has %zu tensor%s%s", file->count,
                           file->count == 1 ? "" : "s", file->count ? ": " : "");
    for (size_t i = 0; i < file->count && i < 8 && written >= 0; ++i) {
        used += (size_t)written;
        if (used >= dst_size)
            return;
        char shown[NAME_SHOWN_MAX + 1];
        quote_name(shown, sizeof shown, file->tensors[i].name);
        written = snprintf(dst + used, dst_size - used, "%s%s", i ? ", " : "", shown);
    }
    if (written >= 0 && file->count > 8 && used + (size_t)written < dst_size)
        snprintf(dst + used + (size_t)written, dst_size - used - (size_t)written, ", ...");
}

clattn_io_status clattn_safetensors_read(const clattn_safetensors *file, const char *name,
                                         clattn_array *out, char *msg, size_t msg_size)
{
    clattn_io_status status = CLATTN_IO_OK;
    clattn_array array;
    memset(&array, 0, sizeof array);
    clear_message(msg, msg_size);
    if (out != NULL)
        memset(out, 0, sizeof *out);
    const char *path = file != NULL ? file->path : NULL;
    if (file == NULL || name == NULL || out == NULL) {
        status =
            fail(msg, msg_size, CLATTN_IO_ERR_ARGUMENT, path, "clattn_safetensors_read: %s is NULL",
                 file == NULL   ? "file"
                 : name == NULL ? "name"
                                : "out");
        goto done;
    }
    char shown[NAME_SHOWN_MAX + 1];
    quote_name(shown, sizeof shown, name);
    const st_tensor *tensor = st_find(file, name);
    if (tensor == NULL) {
        char names[512];
        st_list_names(file, names, sizeof names);
        status =
            fail(msg, msg_size, CLATTN_IO_ERR_NOT_FOUND, path, "no tensor '%s' (%s)", shown, names);
        goto done;
    }
    convert_fn convert = tensor->kind == ST_F32    ? convert_f32
                         : tensor->kind == ST_F16  ? convert_f16
                         : tensor->kind == ST_BF16 ? convert_bf16
                         : tensor->kind == ST_F64  ? convert_f64 /* as float64 .npy: rounded */
                                                   : NULL;
    if (convert == NULL) {
        status = fail(msg, msg_size, CLATTN_IO_ERR_UNSUPPORTED, path,
                      "tensor '%s' has dtype %s: only F32, F16, BF16 and F64 can be read", shown,
                      tensor->dtype);
        goto done;
    }
    if (tensor->ndim > CLATTN_IO_MAX_DIMS) {
        status = fail(msg, msg_size, CLATTN_IO_ERR_UNSUPPORTED, path,
                      "tensor '%s' has %d dimensions; at most %d are supported", shown,
                      tensor->ndim, CLATTN_IO_MAX_DIMS);
        goto done;
    }
    status = alloc_floats(tensor->count, &array.data, path, msg, msg_size);
    if (status != CLATTN_IO_OK)
        goto done;
    if (seek_to(file->file, file->data_start + tensor->begin) != 0) {
        status = fail(msg, msg_size, CLATTN_IO_ERR_OPEN, path, "cannot seek to tensor '%s': %s",
                      shown, strerror(errno));
        goto done;
    }
    status = read_converted(file->file, tensor->count,
                            tensor->kind == ST_F64   ? 8
                            : tensor->kind == ST_F32 ? 4
                                                     : 2,
                            convert,
                            array.data, path, msg, msg_size);
    if (status != CLATTN_IO_OK)
        goto done;
    array.ndim = tensor->ndim;
    memcpy(array.shape, tensor->shape, sizeof array.shape);
    array.count = tensor->count;
    array.source = CLATTN_IO_F32;
done:
    if (status == CLATTN_IO_OK)
        *out = array;
    else
        clattn_array_free(&array);
    return status;
}

/* ------------------------------------------------------------------------------------------
 * PNG heatmap
 *
 * Layout (pixels; S = font scale 2, text line TH = 18, digits 14 tall, advance 12 per char):
 *
 *   margin 16
 *   | block | gap 24 | block | ... (up to 4 blocks per row, rows of blocks 24 apart) | gap 24 |
 *   colour bar block | margin 16
 *
 *   block:   "head N" (TH) / 8 / map area / frame 1, tick 4, 2, tick numbers (TH), 6, "key" (TH)
 *   left of the map: "query" rotated (TH wide), 6, tick numbers (right-aligned), 2, tick 4,
 *   frame 1.  map area height = max(map height, length of "query").
 *
 * Map: maps up to 512 cells a side draw each cell as a square of `cell` pixels, cell =
 * ceil(128 / max(rows, cols)) (so small maps are at least 128 px); bigger maps are downsampled
 * by an integer factor ceil(max(rows, cols) / 512), each pixel showing the maximum of the cells
 * it covers (NaN wins, so a NaN is never hidden). The image is rendered one row of blocks at a
 * time, so memory stays at one band of the image.
 * ------------------------------------------------------------------------------------------ */

#define HM_SCALE 2
#define HM_ADVANCE ((FONT_GLYPH_COLS + 1) * HM_SCALE)
#define HM_TEXT_H (FONT_GLYPH_ROWS * HM_SCALE)
#define HM_DIGIT_H (FONT_DIGIT_ROWS * HM_SCALE)
#define HM_MARGIN 16
#define HM_GAP 24
#define HM_TITLE_GAP 8
#define HM_TICK 4
#define HM_LABEL_GAP 6 /* between tick numbers and an axis label */
#define HM_MIN_PANEL 128
#define HM_MAX_PANEL 512
#define HM_PER_ROW 4
#define HM_BAR_W 16
#define HM_BAR_LABEL_CHARS 8 /* "%.3g" of a positive float is at most 8 characters */
#define HM_MAX_SIDE 16384
#define HM_MAX_TICK_GAPS 6 /* at most about 7 tick numbers per axis */

typedef struct hm_layout {
    size_t heads, rows, cols;
    clattn_heatmap_scale scale;
    const unsigned char *masked; /* NULL, or (rows, cols) / (heads, rows, cols) */
    int masked_per_panel;
    const char *panel, *row_label, *col_label, *value_label;
    int numbered;            /* titles "<panel> N" */
    char footer[160];        /* the pooling, stated on the picture ("" when none) */
    size_t footer_h;
    size_t cell, factor; /* pixels per cell (factor 1), or cells per pixel (cell 1) */
    size_t map_w, map_h, area_h;
    size_t gutter, content_w; /* map_x = block_x + gutter */
    size_t block_w, block_h, per_row, grid_rows;
    size_t bar_x, bar_y, bar_h;
    size_t width, height;
} hm_layout;

static size_t hm_text_w(size_t chars)
{
    return chars ? chars * HM_ADVANCE - HM_SCALE : 0;
}

static size_t decimal_digits(size_t value)
{
    size_t digits = 1;
    while (value >= 10) {
        value /= 10;
        ++digits;
    }
    return digits;
}

static size_t max_size(size_t a, size_t b)
{
    return a > b ? a : b;
}

/* 0 on success; 1 when the image would exceed HM_MAX_SIDE (width/height still set when they
 * fit in size_t, for the message). */
static int hm_compute_layout(size_t heads, size_t rows, size_t cols,
                             const clattn_heatmap_options *options, hm_layout *layout)
{
    static const clattn_heatmap_options defaults = {0};
    const clattn_heatmap_options *o = options ? options : &defaults;
    memset(layout, 0, sizeof *layout);
    layout->heads = heads;
    layout->rows = rows;
    layout->cols = cols;
    layout->scale = o->scale;
    layout->masked = o->masked;
    layout->masked_per_panel = o->masked_per_panel;
    layout->numbered = !(o->panel_title && heads == 1);
    layout->panel = o->panel_title ? o->panel_title : "head";
    layout->row_label = o->row_label ? o->row_label : "query";
    layout->col_label = o->col_label ? o->col_label : "key";
    layout->value_label = o->value_label                    ? o->value_label
                          : o->scale == CLATTN_HEATMAP_ROW ? "weight / row max"
                          : o->scale == CLATTN_HEATMAP_LOG ? "log10 weight"
                                                           : "weight";
    const size_t min_panel =
        o->min_panel == 0 ? HM_MIN_PANEL : (o->min_panel > HM_MAX_PANEL ? HM_MAX_PANEL
                                                                         : o->min_panel);
    size_t longest = max_size(rows, cols);
    if (longest <= HM_MAX_PANEL) {
        layout->factor = 1;
        layout->cell = longest < min_panel ? (min_panel + longest - 1) / longest : 1;
        layout->map_w = cols * layout->cell;
        layout->map_h = rows * layout->cell;
    } else {
        layout->cell = 1;
        layout->factor = longest / HM_MAX_PANEL + (longest % HM_MAX_PANEL != 0);
        layout->map_w = cols / layout->factor + (cols % layout->factor != 0);
        layout->map_h = rows / layout->factor + (rows % layout->factor != 0);
        snprintf(layout->footer, sizeof layout->footer,
                 "max-pooled: %zu x %zu cells shown as %zu x %zu pixels, each the max of %zu x "
                 "%zu cells",
                 rows, cols, layout->map_h, layout->map_w, layout->factor, layout->factor);
        layout->footer_h = HM_TEXT_H + HM_GAP / 2;
    }
    const size_t row_label_w = hm_text_w(strlen(layout->row_label));
    layout->area_h = max_size(layout->map_h, row_label_w);
    layout->gutter =
        HM_TEXT_H + HM_LABEL_GAP + hm_text_w(decimal_digits(rows - 1)) + 2 + HM_TICK + 1;
    size_t title_w = hm_text_w(strlen(layout->panel) +
                               (layout->numbered ? 1 + decimal_digits(heads - 1) : 0));
    layout->content_w = max_size(layout->map_w + 1 + hm_text_w(decimal_digits(cols - 1)) / 2,
                                 max_size(title_w, hm_text_w(strlen(layout->col_label))));
    layout->block_w = layout->gutter + layout->content_w;
    layout->block_h = HM_TEXT_H + HM_TITLE_GAP + layout->area_h + 1 + HM_TICK + 2 + HM_TEXT_H +
                      HM_LABEL_GAP + HM_TEXT_H;
    layout->per_row = heads < HM_PER_ROW ? heads : HM_PER_ROW;
    layout->grid_rows = heads / HM_PER_ROW + (heads % HM_PER_ROW != 0);
    size_t grid_w = layout->per_row * layout->block_w + (layout->per_row - 1) * HM_GAP;
    layout->bar_x = HM_MARGIN + grid_w + HM_GAP;
    layout->bar_y = HM_MARGIN + HM_TEXT_H + HM_TITLE_GAP;
    layout->bar_h = layout->area_h;
    layout->width = layout->bar_x +
                    max_size(HM_BAR_W + 1 + HM_TICK + 2 + hm_text_w(HM_BAR_LABEL_CHARS),
                             hm_text_w(strlen(layout->value_label))) +
                    HM_MARGIN;
    layout->width = max_size(layout->width, 2 * HM_MARGIN + hm_text_w(strlen(layout->footer)));
    if (layout->grid_rows > HM_MAX_SIDE) {
        layout->height = SIZE_MAX;
        return 1;
    }
    layout->height = 2 * HM_MARGIN + layout->grid_rows * layout->block_h +
                     (layout->grid_rows - 1) * HM_GAP + layout->footer_h;
    return layout->width > HM_MAX_SIDE || layout->height > HM_MAX_SIDE;
}

/* Image rows [y0, y1) held in memory, width * 3 bytes each. Drawing is clipped to them. */
typedef struct hm_canvas {
    unsigned char *pixels;
    long width, y0, y1;
} hm_canvas;

typedef struct hm_rgb {
    unsigned char r, g, b;
} hm_rgb;

static const hm_rgb hm_white = {255, 255, 255};
static const hm_rgb hm_ink = {32, 32, 32};
static const hm_rgb hm_frame = {96, 96, 96};
static const hm_rgb hm_nan = {230, 40, 200}; /* magenta: not on the ramp */
static const hm_rgb hm_masked = {176, 176, 176}; /* grey: masked cells, not on the ramp */

static void hm_fill(hm_canvas *canvas, long x, long y, long w, long h, hm_rgb colour)
{
    long x_end = x + w < canvas->width ? x + w : canvas->width;
    long y_end = y + h < canvas->y1 ? y + h : canvas->y1;
    for (long row = y > canvas->y0 ? y : canvas->y0; row < y_end; ++row) {
        unsigned char *line = canvas->pixels + (size_t)(row - canvas->y0) * canvas->width * 3;
        for (long col = x > 0 ? x : 0; col < x_end; ++col) {
            line[3 * col] = colour.r;
            line[3 * col + 1] = colour.g;
            line[3 * col + 2] = colour.b;
        }
    }
}

static void hm_outline(hm_canvas *canvas, long x, long y, long w, long h, hm_rgb colour)
{
    hm_fill(canvas, x, y, w, 1, colour);
    hm_fill(canvas, x, y + h - 1, w, 1, colour);
    hm_fill(canvas, x, y, 1, h, colour);
    hm_fill(canvas, x + w - 1, y, 1, h, colour);
}

static const unsigned char *hm_glyph(char ch)
{
    if (ch >= 'A' && ch <= 'Z')
        ch = (char)(ch - 'A' + 'a');
    for (size_t i = 0; i < sizeof font_glyphs / sizeof font_glyphs[0]; ++i) {
        if (font_glyphs[i].ch == ch)
            return font_glyphs[i].rows;
    }
    return font_missing_glyph;
}

/* Text with its top-left at (x, y); vertical text reads upwards, (x, y) the top-left of its
 * box (TH wide, text_w tall), the letters' tops facing left. */
static void hm_text(hm_canvas *canvas, long x, long y, const char *text, int vertical)
{
    long length = (long)hm_text_w(strlen(text));
    for (long index = 0; text[index] != '\0'; ++index) {
        const unsigned char *rows = hm_glyph(text[index]);
        for (long gy = 0; gy < FONT_GLYPH_ROWS; ++gy) {
            for (long gx = 0; gx < FONT_GLYPH_COLS; ++gx) {
                if (!(rows[gy] >> (FONT_GLYPH_COLS - 1 - gx) & 1))
                    continue;
                long u = index * HM_ADVANCE + gx * HM_SCALE; /* along the text */
                long v = gy * HM_SCALE;                      /* down the glyph */
                if (vertical)
                    hm_fill(canvas, x + v, y + length - u - HM_SCALE, HM_SCALE, HM_SCALE, hm_ink);
                else
                    hm_fill(canvas, x + u, y + v, HM_SCALE, HM_SCALE, hm_ink);
            }
        }
    }
}

/* The colour ramp: dark blue -> blue -> teal -> yellow, lightness rising monotonically. */
static hm_rgb hm_ramp(float t)
{
    static const float stops[4][3] = {{14, 16, 64}, {24, 88, 148}, {36, 160, 136}, {250, 228, 48}};
    if (!(t > 0.0f))
        t = 0.0f;
    if (t > 1.0f)
        t = 1.0f;
    float position = t * 3.0f;
    int segment = position >= 3.0f ? 2 : (int)position;
    float f = position - (float)segment;
    hm_rgb colour;
    unsigned char channel[3];
    for (int c = 0; c < 3; ++c) {
        float value = stops[segment][c] + (stops[segment + 1][c] - stops[segment][c]) * f;
        channel[c] = (unsigned char)(value + 0.5f);
    }
    colour.r = channel[0];
    colour.g = channel[1];
    colour.b = channel[2];
    return colour;
}

/* A weight's position on the ramp, 0 .. 1, under the layout's scale: row_max is the largest
 * visible weight of its row (ROW), vmax the largest of all (GLOBAL). */
static float hm_position_on_ramp(const hm_layout *layout, float weight, float row_max, float vmax)
{
    switch (layout->scale) {
    case CLATTN_HEATMAP_LOG:
        return weight > 0.0f ? (float)((log10((double)weight) + 4.0) / 4.0) : 0.0f;
    case CLATTN_HEATMAP_GLOBAL:
        return weight / vmax;
    default:
        return row_max > 0.0f ? weight / row_max : 0.0f;
    }
}

/* Pixel offset, inside the map, of the centre of cell `index` along an axis. */
static long hm_position(const hm_layout *layout, size_t index)
{
    if (layout->factor == 1)
        return (long)(index * layout->cell + layout->cell / 2);
    return (long)(index / layout->factor);
}

/* Whether ticks `distance` cells apart are at least min_px pixels apart (overflow-free). */
static int hm_far_enough(const hm_layout *layout, size_t distance, size_t min_px)
{
    if (layout->factor == 1)
        return distance >= (min_px + layout->cell - 1) / layout->cell;
    return distance / layout->factor >= min_px;
}

/* The step between tick numbers: the smallest of 1, 2, 5, 10, 20, 50, ... that leaves min_px
 * between neighbouring ticks and at most about HM_MAX_TICK_GAPS gaps along the axis; n when none
 * fits (then only the first and last are drawn). */
static size_t hm_tick_step(const hm_layout *layout, size_t n, size_t min_px)
{
    static const size_t mantissas[3] = {1, 2, 5};
    for (size_t scale = 1; scale < n && scale <= SIZE_MAX / 10; scale *= 10) {
        for (int m = 0; m < 3; ++m) {
            size_t step = mantissas[m] * scale;
            if (step >= n)
                return n;
            if (hm_far_enough(layout, step, min_px) && step >= (n - 1) / HM_MAX_TICK_GAPS)
                return step;
        }
    }
    return n;
}

static void hm_tick(hm_canvas *canvas, const hm_layout *layout, size_t index, long map_x,
                    long map_y, int vertical_axis)
{
    char label[24];
    snprintf(label, sizeof label, "%zu", index);
    long label_w = (long)hm_text_w(strlen(label));
    long at = hm_position(layout, index);
    if (vertical_axis) {
        long y = map_y + at;
        hm_fill(canvas, map_x - 1 - HM_TICK, y, HM_TICK, 1, hm_frame);
        hm_text(canvas, map_x - 1 - HM_TICK - 2 - label_w, y - HM_DIGIT_H / 2, label, 0);
    } else {
        long x = map_x + at;
        long below = map_y + (long)layout->map_h + 1;
        hm_fill(canvas, x, below, 1, HM_TICK, hm_frame);
        hm_text(canvas, x - label_w / 2, below + HM_TICK + 2, label, 0);
    }
}

/* Ticks along an axis of n cells: 0, the multiples of the step not too close to the last
 * index, and the last index unless it is too close to 0. */
static void hm_axis_ticks(hm_canvas *canvas, const hm_layout *layout, size_t n, size_t min_px,
                          long map_x, long map_y, int vertical_axis)
{
    size_t step = hm_tick_step(layout, n, min_px);
    size_t last = n - 1;
    hm_tick(canvas, layout, 0, map_x, map_y, vertical_axis);
    for (size_t index = step; index < last; index += step) {
        if (hm_far_enough(layout, last - index, min_px))
            hm_tick(canvas, layout, index, map_x, map_y, vertical_axis);
        if (index > SIZE_MAX - step)
            break;
    }
    if (last > 0 && hm_far_enough(layout, last, min_px))
        hm_tick(canvas, layout, last, map_x, map_y, vertical_axis);
}

/* The colour of the cells one pixel block covers (one cell when not pooled): the largest of
 * their ramp positions, skipping masked cells; masked grey when every cell is masked; NaN
 * magenta when any is NaN (a NaN is never hidden). */
static hm_rgb hm_block_colour(const hm_layout *layout, const float *map,
                              const unsigned char *masked, const float *row_max, float vmax,
                              size_t row0, size_t row_end, size_t col0, size_t col_end)
{
    float best = -INFINITY;
    for (size_t row = row0; row < row_end; ++row) {
        for (size_t col = col0; col < col_end; ++col) {
            const size_t at = row * layout->cols + col;
            if (masked && masked[at])
                continue;
            float value = map[at];
            if (isnan(value))
                return hm_nan;
            value = hm_position_on_ramp(layout, value, row_max ? row_max[row] : vmax, vmax);
            if (value > best)
                best = value;
        }
    }
    return best == -INFINITY ? hm_masked : hm_ramp(best);
}

static void hm_draw_map(hm_canvas *canvas, const hm_layout *layout, const float *map,
                        const unsigned char *masked, const float *row_max, float vmax, long map_x,
                        long map_y)
{
    long first = canvas->y0 > map_y ? canvas->y0 - map_y : 0;
    long end = canvas->y1 - map_y < (long)layout->map_h ? canvas->y1 - map_y : (long)layout->map_h;
    if (layout->factor == 1) {
        long cell = (long)layout->cell;
        for (long row = first / cell; row * cell < end; ++row) {
            for (size_t col = 0; col < layout->cols; ++col) {
                hm_rgb colour = hm_block_colour(layout, map, masked, row_max, vmax, (size_t)row,
                                                (size_t)row + 1, col, col + 1);
                hm_fill(canvas, map_x + (long)col * cell, map_y + row * cell, cell, cell, colour);
            }
        }
        return;
    }
    const size_t f = layout->factor;
    for (long py = first; py < end; ++py) {
        const size_t row0 = (size_t)py * f;
        const size_t row_end = row0 + f < layout->rows ? row0 + f : layout->rows;
        for (size_t px = 0; px < layout->map_w; ++px) {
            const size_t col0 = px * f, col_end = col0 + f < layout->cols ? col0 + f : layout->cols;
            hm_fill(canvas, map_x + (long)px, map_y + py, 1, 1,
                    hm_block_colour(layout, map, masked, row_max, vmax, row0, row_end, col0,
                                    col_end));
        }
    }
}

static void hm_draw_block(hm_canvas *canvas, const hm_layout *layout, const float *weights,
                          float vmax, size_t head)
{
    long block_x = (long)(HM_MARGIN + (head % HM_PER_ROW) * (layout->block_w + HM_GAP));
    long block_y = (long)(HM_MARGIN + (head / HM_PER_ROW) * (layout->block_h + HM_GAP));
    long map_x = block_x + (long)layout->gutter;
    long map_y = block_y + HM_TEXT_H + HM_TITLE_GAP;
    long map_w = (long)layout->map_w, map_h = (long)layout->map_h;
    char title[176];
    if (layout->numbered)
        snprintf(title, sizeof title, "%.140s %zu", layout->panel, head);
    else
        snprintf(title, sizeof title, "%.150s", layout->panel);
    long title_w = (long)hm_text_w(strlen(title));
    hm_text(canvas, map_x + (map_w > title_w ? (map_w - title_w) / 2 : 0), block_y, title, 0);
    long query_h = (long)hm_text_w(strlen(layout->row_label));
    hm_text(canvas, block_x, map_y + (map_h > query_h ? (map_h - query_h) / 2 : 0),
            layout->row_label, 1);
    long key_w = (long)hm_text_w(strlen(layout->col_label));
    long key_y = map_y + map_h + 1 + HM_TICK + 2 + HM_TEXT_H + HM_LABEL_GAP;
    hm_text(canvas, map_x + (map_w > key_w ? (map_w - key_w) / 2 : 0), key_y, layout->col_label,
            0);
    hm_outline(canvas, map_x - 1, map_y - 1, map_w + 2, map_h + 2, hm_frame);
    const size_t cells = layout->rows * layout->cols;
    const float *map = weights + head * cells;
    const unsigned char *masked =
        layout->masked ? layout->masked + (layout->masked_per_panel ? head * cells : 0) : NULL;
    /* ROW: each row's largest visible finite weight (no memory: the global scale instead). */
    float *row_max = NULL;
    if (layout->scale == CLATTN_HEATMAP_ROW &&
        (row_max = malloc(layout->rows * sizeof *row_max)) != NULL) {
        for (size_t row = 0; row < layout->rows; ++row) {
            float best = 0.0f;
            for (size_t col = 0; col < layout->cols; ++col) {
                const size_t at = row * layout->cols + col;
                if ((!masked || !masked[at]) && isfinite(map[at]) && map[at] > best)
                    best = map[at];
            }
            row_max[row] = best;
        }
    }
    hm_draw_map(canvas, layout, map, masked, row_max, vmax, map_x, map_y);
    free(row_max);
    hm_axis_ticks(canvas, layout, layout->rows, HM_DIGIT_H + 4, map_x, map_y, 1);
    size_t x_label_w = hm_text_w(decimal_digits(layout->cols - 1));
    hm_axis_ticks(canvas, layout, layout->cols, x_label_w + 8, map_x, map_y, 0);
}

static void hm_draw_bar(hm_canvas *canvas, const hm_layout *layout, float vmax)
{
    long x = (long)layout->bar_x, y = (long)layout->bar_y, h = (long)layout->bar_h;
    /* What the colours mean, over the bar (on the panels' title line). */
    hm_text(canvas, x, HM_MARGIN, layout->value_label, 0);
    for (long row = 0; row < h; ++row) {
        float t = h > 1 ? 1.0f - (float)row / (float)(h - 1) : 1.0f;
        hm_fill(canvas, x, y + row, HM_BAR_W, 1, hm_ramp(t));
    }
    hm_outline(canvas, x - 1, y - 1, HM_BAR_W + 2, h + 2, hm_frame);
    if (layout->masked) { /* the masked colour's swatch under the bar */
        const long swatch_y = y + h + 1 + HM_TICK + 2;
        hm_fill(canvas, x, swatch_y, HM_BAR_W, HM_TEXT_H, hm_masked);
        hm_outline(canvas, x - 1, swatch_y - 1, HM_BAR_W + 2, HM_TEXT_H + 2, hm_frame);
        hm_text(canvas, x + HM_BAR_W + 1 + HM_TICK + 2, swatch_y, "masked", 0);
    }
    const double values[3] = {layout->scale == CLATTN_HEATMAP_GLOBAL ? vmax : 1.0,
                              layout->scale == CLATTN_HEATMAP_GLOBAL ? vmax / 2.0
                              : layout->scale == CLATTN_HEATMAP_LOG  ? 0.01
                                                                     : 0.5,
                              layout->scale == CLATTN_HEATMAP_LOG ? 1e-4 : 0.0};
    const long offsets[3] = {0, (h - 1) / 2, h - 1};
    for (int i = 0; i < 3; ++i) {
        char label[32];
        if (layout->scale == CLATTN_HEATMAP_LOG)
            snprintf(label, sizeof label, "%s", i == 0 ? "1" : i == 1 ? "1e-2" : "1e-4");
        else
            snprintf(label, sizeof label, "%.3g", values[i]);
        hm_fill(canvas, x + HM_BAR_W + 1, y + offsets[i], HM_TICK, 1, hm_frame);
        hm_text(canvas, x + HM_BAR_W + 1 + HM_TICK + 2, y + offsets[i] - HM_DIGIT_H / 2, label, 0);
    }
}

typedef struct hm_job {
    const hm_layout *layout;
    const float *weights;
    float vmax;
    unsigned char *band; /* width * 3 * band rows */
} hm_job;

/* Renders each row of blocks into the band buffer and hands its rows to libpng. */
static void hm_write_rows(png_structp png, const hm_job *job)
{
    const hm_layout *layout = job->layout;
    size_t row_bytes = layout->width * 3;
    for (size_t grid_row = 0; grid_row < layout->grid_rows; ++grid_row) {
        size_t y0 = grid_row == 0 ? 0 : HM_MARGIN + grid_row * (layout->block_h + HM_GAP);
        size_t y1 = grid_row + 1 == layout->grid_rows
                        ? layout->height
                        : HM_MARGIN + (grid_row + 1) * (layout->block_h + HM_GAP);
        hm_canvas canvas = {job->band, (long)layout->width, (long)y0, (long)y1};
        hm_fill(&canvas, 0, (long)y0, (long)layout->width, (long)(y1 - y0), hm_white);
        for (size_t column = 0; column < HM_PER_ROW; ++column) {
            size_t head = grid_row * HM_PER_ROW + column;
            if (head < layout->heads)
                hm_draw_block(&canvas, layout, job->weights, job->vmax, head);
        }
        if (grid_row == 0)
            hm_draw_bar(&canvas, layout, job->vmax);
        if (grid_row + 1 == layout->grid_rows && layout->footer[0])
            hm_text(&canvas, HM_MARGIN, (long)(layout->height - HM_MARGIN - HM_TEXT_H),
                    layout->footer, 0);
        for (size_t y = y0; y < y1; ++y)
            png_write_row(png, job->band + (y - y0) * row_bytes);
    }
}

typedef struct hm_png_failure {
    char text[160];
} hm_png_failure;

static void hm_png_error(png_structp png, png_const_charp message)
{
    hm_png_failure *failure = png_get_error_ptr(png);
    if (failure != NULL)
        snprintf(failure->text, sizeof failure->text, "%s", message);
    png_longjmp(png, 1);
}

static void hm_png_warning(png_structp png, png_const_charp message)
{
    (void)png;
    (void)message;
}

/* libpng reports errors by longjmp to here: nothing this function changes after setjmp is
 * read after it, so no local needs to be volatile. */
static clattn_io_status hm_write_png(FILE *stream, const hm_job *job, hm_png_failure *failure)
{
    clattn_io_status status = CLATTN_IO_OK;
    png_infop info = NULL;
    png_structp png =
        png_create_write_struct(PNG_LIBPNG_VER_STRING, failure, hm_png_error, hm_png_warning);
    if (png != NULL)
        info = png_create_info_struct(png);
    if (png == NULL || info == NULL) {
        snprintf(failure->text, sizeof failure->text, "out of memory");
        status = CLATTN_IO_ERR_MEMORY;
        goto done;
    }
    if (setjmp(png_jmpbuf(png))) {
        status = CLATTN_IO_ERR_OPEN;
        goto done;
    }
    png_init_io(png, stream);
    png_set_IHDR(png, info, (png_uint_32)job->layout->width, (png_uint_32)job->layout->height, 8,
                 PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    hm_write_rows(png, job);
    png_write_end(png, info);
done:
    png_destroy_write_struct(&png, &info);
    return status;
}

/* Largest finite weight; 1 when there is no positive finite weight. */
static float hm_scale_max(const float *weights, size_t count)
{
    float vmax = 0.0f;
    for (size_t i = 0; i < count; ++i) {
        if (isfinite(weights[i]) && weights[i] > vmax)
            vmax = weights[i];
    }
    return vmax > 0.0f ? vmax : 1.0f;
}

clattn_io_status clattn_png_write_heatmap(const char *path, const float *weights, size_t heads,
                                          size_t rows, size_t cols, char *msg, size_t msg_size)
{
    return clattn_png_write_heatmap_ex(path, weights, heads, rows, cols, NULL, msg, msg_size);
}

clattn_io_status clattn_png_write_heatmap_ex(const char *path, const float *weights, size_t heads,
                                             size_t rows, size_t cols,
                                             const clattn_heatmap_options *options, char *msg,
                                             size_t msg_size)
{
    clattn_io_status status = CLATTN_IO_OK;
    FILE *stream = NULL;
    unsigned char *band = NULL;
    size_t count = 0;
    hm_layout layout;
    clear_message(msg, msg_size);
    if (path == NULL || weights == NULL || heads == 0 || rows == 0 || cols == 0) {
        status = fail(msg, msg_size, CLATTN_IO_ERR_ARGUMENT, path,
                      "clattn_png_write_heatmap: need a path, weights and heads, rows, cols > 0 "
                      "(got %zu, %zu, %zu)",
                      heads, rows, cols);
        goto done;
    }
    if (mul_overflows(heads, rows, &count) || mul_overflows(count, cols, &count)) {
        status =
            fail(msg, msg_size, CLATTN_IO_ERR_TOO_LARGE, path,
                 "%zu heads of %zu x %zu weights overflow the size of memory", heads, rows, cols);
        goto done;
    }
    if (options && (unsigned)options->scale > (unsigned)CLATTN_HEATMAP_GLOBAL) {
        status = fail(msg, msg_size, CLATTN_IO_ERR_ARGUMENT, path,
                      "clattn_png_write_heatmap_ex: scale %d is not ROW, LOG or GLOBAL",
                      (int)options->scale);
        goto done;
    }
    if (hm_compute_layout(heads, rows, cols, options, &layout)) {
        char height[32];
        if (layout.height == SIZE_MAX)
            snprintf(height, sizeof height, "more than %d", HM_MAX_SIDE);
        else
            snprintf(height, sizeof height, "%zu", layout.height);
        status = fail(msg, msg_size, CLATTN_IO_ERR_TOO_LARGE, path,
                      "%zu heads of %zu x %zu need an image of %zu x %s pixels; the limit is "
                      "%d x %d",
                      heads, rows, cols, layout.width, height, HM_MAX_SIDE, HM_MAX_SIDE);
        goto done;
    }
    /* The tallest band: the first or last row of blocks with the margin and a gap. */
    size_t band_rows = HM_MARGIN + layout.block_h + HM_GAP + HM_MARGIN + layout.footer_h;
    band = malloc(layout.width * 3 * band_rows);
    if (band == NULL) {
        status = fail(msg, msg_size, CLATTN_IO_ERR_MEMORY, path, "out of memory for the image");
        goto done;
    }
    hm_job job = {&layout, weights, hm_scale_max(weights, count), band};
    /* The last band holds the last row of blocks, the margin and the footer. */
    stream = fopen(path, "wb");
    if (stream == NULL) {
        status =
            fail(msg, msg_size, CLATTN_IO_ERR_OPEN, path, "cannot create: %s", strerror(errno));
        goto done;
    }
    hm_png_failure failure = {""};
    status = hm_write_png(stream, &job, &failure);
    if (status != CLATTN_IO_OK)
        fail(msg, msg_size, status, path, "cannot write the PNG: libpng: %s", failure.text);
done:
    if (stream != NULL) {
        if (fclose(stream) != 0 && status == CLATTN_IO_OK)
            status = fail(msg, msg_size, CLATTN_IO_ERR_OPEN, path, "write error on close: %s",
                          strerror(errno));
        if (status != CLATTN_IO_OK)
            remove(path);
    }
    free(band);
    return status;
}
