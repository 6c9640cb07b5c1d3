/* clattn_io: .npy read and write (NumPy format 1.0-3.0). */
#include "io_internal.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

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
        return io_fail(msg, msg_size, CLATTN_IO_ERR_UNSUPPORTED, path,
                       "descr is a structured dtype (a list of fields): use a plain float32, "
                       "float64, float16, bool or uint8 array");
    if (header->descr_length == 3) {
        const char *kind = descr + 1;
        int any_order = descr[0] == '<' || descr[0] == '>' || descr[0] == '|' || descr[0] == '=';
        if (descr[0] == '<' && strcmp(kind, "f4") == 0) {
            *dtype = (npy_dtype){4, io_convert_f32, CLATTN_IO_F32};
            return CLATTN_IO_OK;
        }
        if (descr[0] == '<' && strcmp(kind, "f8") == 0) {
            *dtype = (npy_dtype){8, io_convert_f64, CLATTN_IO_F32};
            return CLATTN_IO_OK;
        }
        if (descr[0] == '<' && strcmp(kind, "f2") == 0) {
            *dtype = (npy_dtype){2, io_convert_f16, CLATTN_IO_F16};
            return CLATTN_IO_OK;
        }
        if ((descr[0] == '<' || descr[0] == '|') && strcmp(kind, "V2") == 0) {
            *dtype = (npy_dtype){2, io_convert_bf16, CLATTN_IO_BF16};
            return CLATTN_IO_OK;
        }
        if (descr[0] == '<' && strcmp(kind, "i8") == 0) {
            *dtype = (npy_dtype){8, io_convert_i64, CLATTN_IO_INT};
            return CLATTN_IO_OK;
        }
        if (descr[0] == '<' && strcmp(kind, "i4") == 0) {
            *dtype = (npy_dtype){4, io_convert_i32, CLATTN_IO_INT};
            return CLATTN_IO_OK;
        }
        if (any_order && strcmp(kind, "b1") == 0) {
            *dtype = (npy_dtype){1, io_convert_bool, CLATTN_IO_BOOL};
            return CLATTN_IO_OK;
        }
        if (any_order && strcmp(kind, "u1") == 0) {
            *dtype = (npy_dtype){1, io_convert_u8, CLATTN_IO_BOOL};
            return CLATTN_IO_OK;
        }
        if (descr[0] == '>' &&
            (strcmp(kind, "f4") == 0 || strcmp(kind, "f8") == 0 || strcmp(kind, "f2") == 0))
            return io_fail(msg, msg_size, CLATTN_IO_ERR_UNSUPPORTED, path,
                           "descr '%s' is big-endian: only little-endian files are supported "
                           "(numpy: a.astype('<f4'))",
                           descr);
    }
    char shown[NPY_DESCR_MAX + 4];
    io_quote_name(shown, sizeof shown, descr);
    if (header->descr_length >= NPY_DESCR_MAX && strlen(shown) >= 3)
        memcpy(shown + strlen(shown) - 3, "...", 3);
    return io_fail(msg, msg_size, CLATTN_IO_ERR_UNSUPPORTED, path,
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
    if (got < sizeof magic || memcmp(preamble, magic, sizeof magic) != 0) {
        const char *what = io_sniff_format(preamble, got, file_size);
        if (what)
            return io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path, "not a .npy file (it is %s)",
                           what);
        return io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path, "not a .npy file (bad magic)");
    }
    if (got < 8)
        return io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                       "file ends inside the header (%zu bytes)", got);
    unsigned major = preamble[6], minor = preamble[7];
    if (major < 1 || major > 3 || minor != 0)
        return io_fail(msg, msg_size, CLATTN_IO_ERR_UNSUPPORTED, path,
                       ".npy format version %u.%u is not supported (1.0, 2.0 and 3.0 are)", major,
                       minor);
    size_t length_bytes = major == 1 ? 2 : 4;
    if (fread(preamble + 8, 1, length_bytes, file) != length_bytes)
        return io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                       "file ends inside the header (%" PRIu64 " bytes)", file_size);
    *header_length = major == 1 ? io_load_u16(preamble + 8) : io_load_u32(preamble + 8);
    uint64_t header_start = 8 + length_bytes;
    if (*header_length > file_size - header_start)
        return io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                       "header length %" PRIu32 " runs past the end of the file (%" PRIu64
                       " bytes)",
                       *header_length, file_size);
    if (*header_length > NPY_MAX_HEADER)
        return io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
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
        return io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                       "header is not a valid dict: %s at byte %zu of the header", cursor.problem,
                       (size_t)(cursor.at - cursor.start));
    const char *missing = !header->has_descr     ? "descr"
                          : !header->has_fortran ? "fortran_order"
                          : !header->has_shape   ? "shape"
                                                 : NULL;
    if (missing != NULL)
        return io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path, "header has no '%s' key",
                       missing);
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
        return io_fail(msg, msg_size, CLATTN_IO_ERR_UNSUPPORTED, path,
                       "the array is in Fortran order: save a C-order array "
                       "(numpy: np.ascontiguousarray(a))");
    if (header->ndim > CLATTN_IO_MAX_DIMS)
        return io_fail(msg, msg_size, CLATTN_IO_ERR_UNSUPPORTED, path,
                       "shape has %d dimensions; at most %d are supported", header->ndim,
                       CLATTN_IO_MAX_DIMS);
    char shape_text[SHAPE_TEXT_MAX];
    if (header->entry_overflow)
        return io_fail(msg, msg_size, CLATTN_IO_ERR_TOO_LARGE, path,
                       "a shape entry exceeds the largest size (%zu)", (size_t)SIZE_MAX);
    io_format_shape(shape_text, sizeof shape_text, header->ndim, header->shape);
    size_t bytes;
    if (io_shape_count(header->ndim, header->shape, count) ||
        io_mul_overflows(*count, dtype->elem_size, &bytes))
        return io_fail(msg, msg_size, CLATTN_IO_ERR_TOO_LARGE, path,
                       "shape %s of %s overflows the size of memory", shape_text, header->descr);
    if ((uint64_t)bytes != data_available)
        return io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                       "file has %" PRIu64 " bytes of data, shape %s of %s needs %zu",
                       data_available, shape_text, header->descr, bytes);
    return CLATTN_IO_OK;
}

clattn_io_status clattn_npy_read(const char *path, clattn_array *out, char *msg, size_t msg_size)
{
    clattn_io_status status = CLATTN_IO_OK;
    FILE *file = NULL;
    char *text = NULL;
    clattn_array array;
    memset(&array, 0, sizeof array);
    io_clear_message(msg, msg_size);
    if (out != NULL)
        memset(out, 0, sizeof *out);
    if (path == NULL || out == NULL) {
        status = io_fail(msg, msg_size, CLATTN_IO_ERR_ARGUMENT, path, "clattn_npy_read: %s is NULL",
                         path == NULL ? "path" : "out");
        goto done;
    }
    uint64_t file_size = 0, data_start = 0;
    uint32_t header_length = 0;
    status = io_open_input(path, &file, &file_size, msg, msg_size);
    if (status != CLATTN_IO_OK)
        goto done;
    status = npy_read_preamble(file, file_size, &header_length, &data_start, path, msg, msg_size);
    if (status != CLATTN_IO_OK)
        goto done;
    text = malloc((size_t)header_length + 1);
    if (text == NULL) {
        status = io_fail(msg, msg_size, CLATTN_IO_ERR_MEMORY, path, "out of memory for the header");
        goto done;
    }
    status = io_read_exact(file, text, header_length, "the header", path, msg, msg_size);
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
    status = io_alloc_floats(count, &array.data, path, msg, msg_size);
    if (status != CLATTN_IO_OK)
        goto done;
    status = io_read_converted(file, count, dtype.elem_size, dtype.convert, array.data, path, msg,
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

void clattn_io_round16(const float *src, size_t count, clattn_io_dtype dtype, uint16_t *dst)
{
    if (dtype != CLATTN_IO_F16 && dtype != CLATTN_IO_BF16)
        return;
    for (size_t i = 0; i < count; ++i)
        dst[i] = dtype == CLATTN_IO_F16 ? float_to_half(src[i]) : float_to_bfloat16(src[i]);
}

void clattn_io_widen16(const uint16_t *src, size_t count, clattn_io_dtype dtype, float *dst)
{
    if (dtype != CLATTN_IO_F16 && dtype != CLATTN_IO_BF16)
        return;
    for (size_t i = 0; i < count; ++i) {
        unsigned char bytes[2] = {(unsigned char)(src[i] & 0xffu), (unsigned char)(src[i] >> 8)};
        if (dtype == CLATTN_IO_F16)
            io_convert_f16(bytes, 1, dst + i);
        else
            io_convert_bf16(bytes, 1, dst + i);
    }
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
                io_store_u32(chunk + 4 * i, bits_from_float(value));
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
    io_clear_message(msg, msg_size);
    if (path == NULL || ndim < 0 || ndim > CLATTN_IO_MAX_DIMS || (ndim > 0 && shape == NULL)) {
        status = io_fail(msg, msg_size, CLATTN_IO_ERR_ARGUMENT, path,
                         "%s: need a path, 0 <= ndim <= %d (got %d) and a shape", caller,
                         CLATTN_IO_MAX_DIMS, ndim);
        goto done;
    }
    const char *descr = dtype == CLATTN_IO_F32    ? "<f4"
                        : dtype == CLATTN_IO_F16  ? "<f2"
                        : dtype == CLATTN_IO_BF16 ? "<V2"
                                                  : NULL;
    if (descr == NULL) {
        status = io_fail(msg, msg_size, CLATTN_IO_ERR_ARGUMENT, path,
                         "%s: dtype %d is not CLATTN_IO_F32, CLATTN_IO_F16 or CLATTN_IO_BF16",
                         caller, (int)dtype);
        goto done;
    }
    if (io_shape_count(ndim, shape, &count) ||
        io_mul_overflows(count, dtype == CLATTN_IO_F32 ? 4 : 2, &bytes)) {
        status = io_fail(msg, msg_size, CLATTN_IO_ERR_TOO_LARGE, path,
                         "the shape's element count overflows");
        goto done;
    }
    if (count > 0 && data == NULL) {
        status = io_fail(msg, msg_size, CLATTN_IO_ERR_ARGUMENT, path,
                         "%s: data is NULL for %zu values", caller, count);
        goto done;
    }
    /* numpy's layout: the dict, spaces, '\n', so that the data starts at a multiple of 64. */
    char shape_text[SHAPE_TEXT_MAX];
    char header[SHAPE_TEXT_MAX + 192];
    io_format_shape(shape_text, sizeof shape_text, ndim, shape);
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
            io_fail(msg, msg_size, CLATTN_IO_ERR_OPEN, path, "cannot create: %s", strerror(errno));
        goto done;
    }
    if (fwrite(preamble, 1, sizeof preamble, file) != sizeof preamble ||
        fwrite(header, 1, used, file) != used || write_values(file, data, count, dtype) != 0) {
        status =
            io_fail(msg, msg_size, CLATTN_IO_ERR_OPEN, path, "write error: %s", strerror(errno));
        goto done;
    }
done:
    if (file != NULL) {
        if (fclose(file) != 0 && status == CLATTN_IO_OK)
            status = io_fail(msg, msg_size, CLATTN_IO_ERR_OPEN, path, "write error on close: %s",
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
