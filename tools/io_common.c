/*
 * clattn_io's shared part: messages, shapes, file reading, decoding (io_internal.h); the formats
 * are io_npy.c (.npy read/write), io_safetensors.c (safetensors read) and io_png.c (heatmaps).
 * See clattn_io.h for the contract.
 *
 * Safety rule of every reader: a size taken from a file is compared with the file's real length
 * (or a documented limit) before anything is allocated from it, and every product of sizes is
 * overflow-checked. Values are decoded byte by byte from little-endian, so the readers and the
 * writer behave the same on any host byte order.
 */
#include "io_internal.h" /* first: it sets _POSIX_C_SOURCE and _FILE_OFFSET_BITS */

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

void io_clear_message(char *msg, size_t msg_size)
{
    if (msg != NULL && msg_size > 0)
        msg[0] = '\0';
}

/* Writes "<path>: <formatted text>" to msg and returns status. */
clattn_io_status io_fail(char *msg, size_t msg_size, clattn_io_status status, const char *path,
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
void io_quote_name(char *dst, size_t dst_size, const char *name)
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
void io_format_shape(char *dst, size_t dst_size, int ndim, const size_t *shape)
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

int io_mul_overflows(size_t a, size_t b, size_t *product)
{
    if (a != 0 && b > SIZE_MAX / a)
        return 1;
    *product = a * b;
    return 0;
}

/* Product of the first ndim entries; 1 for ndim 0. */
int io_shape_count(int ndim, const size_t *shape, size_t *count)
{
    size_t product = 1;
    for (int d = 0; d < ndim; ++d) {
        if (io_mul_overflows(product, shape[d], &product))
            return 1;
    }
    *count = product;
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Files
 * ------------------------------------------------------------------------------------------ */

/* Opens a regular file for reading and tells its length. */
clattn_io_status io_open_input(const char *path, FILE **out, uint64_t *size, char *msg,
                               size_t msg_size)
{
    clattn_io_status status = CLATTN_IO_OK;
    FILE *file = fopen(path, "rb");
    *out = NULL;
    if (file == NULL) {
        status = io_fail(msg, msg_size, CLATTN_IO_ERR_OPEN, path, "cannot open for reading: %s",
                         strerror(errno));
        goto done;
    }
#ifndef _WIN32
    struct stat info;
    if (fstat(fileno(file), &info) != 0) {
        status =
            io_fail(msg, msg_size, CLATTN_IO_ERR_OPEN, path, "cannot stat: %s", strerror(errno));
        goto done;
    }
    if (!S_ISREG(info.st_mode) || info.st_size < 0) {
        status = io_fail(msg, msg_size, CLATTN_IO_ERR_OPEN, path, "not a regular file");
        goto done;
    }
    *size = (uint64_t)info.st_size;
#else
    __int64 end = -1;
    if (_fseeki64(file, 0, SEEK_END) != 0 || (end = _ftelli64(file)) < 0 ||
        _fseeki64(file, 0, SEEK_SET) != 0) {
        status =
            io_fail(msg, msg_size, CLATTN_IO_ERR_OPEN, path, "cannot seek: %s", strerror(errno));
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

int io_seek_to(FILE *file, uint64_t offset)
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
clattn_io_status io_read_exact(FILE *file, void *dst, size_t size, const char *what,
                               const char *path, char *msg, size_t msg_size)
{
    if (size == 0 || fread(dst, 1, size, file) == size)
        return CLATTN_IO_OK;
    if (ferror(file))
        return io_fail(msg, msg_size, CLATTN_IO_ERR_OPEN, path, "read error in %s: %s", what,
                       strerror(errno));
    return io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path, "file ends inside %s", what);
}

/* ------------------------------------------------------------------------------------------
 * Little-endian decoding and conversion to float32
 * ------------------------------------------------------------------------------------------ */

uint16_t io_load_u16(const unsigned char *bytes)
{
    return (uint16_t)(bytes[0] | (unsigned)bytes[1] << 8);
}

uint32_t io_load_u32(const unsigned char *bytes)
{
    return (uint32_t)bytes[0] | (uint32_t)bytes[1] << 8 | (uint32_t)bytes[2] << 16 |
           (uint32_t)bytes[3] << 24;
}

uint64_t io_load_u64(const unsigned char *bytes)
{
    return (uint64_t)io_load_u32(bytes) | (uint64_t)io_load_u32(bytes + 4) << 32;
}

void io_store_u32(unsigned char *bytes, uint32_t value)
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

void io_convert_f32(const unsigned char *src, size_t count, float *dst)
{
    for (size_t i = 0; i < count; ++i)
        dst[i] = float_from_bits(io_load_u32(src + 4 * i));
}

void io_convert_f64(const unsigned char *src, size_t count, float *dst)
{
    for (size_t i = 0; i < count; ++i) {
        uint64_t bits = io_load_u64(src + 8 * i);
        double value;
        memcpy(&value, &bits, sizeof value);
        dst[i] = narrow_double(value);
    }
}

void io_convert_bool(const unsigned char *src, size_t count, float *dst)
{
    for (size_t i = 0; i < count; ++i)
        dst[i] = src[i] != 0 ? 1.0f : 0.0f;
}

void io_convert_u8(const unsigned char *src, size_t count, float *dst)
{
    for (size_t i = 0; i < count; ++i)
        dst[i] = (float)src[i];
}

void io_convert_f16(const unsigned char *src, size_t count, float *dst)
{
    for (size_t i = 0; i < count; ++i)
        dst[i] = half_to_float(io_load_u16(src + 2 * i));
}

void io_convert_bf16(const unsigned char *src, size_t count, float *dst)
{
    for (size_t i = 0; i < count; ++i)
        dst[i] = float_from_bits((uint32_t)io_load_u16(src + 2 * i) << 16);
}

void io_convert_i64(const unsigned char *src, size_t count, float *dst)
{
    for (size_t i = 0; i < count; ++i)
        dst[i] = (float)(int64_t)io_load_u64(src + 8 * i);
}

void io_convert_i32(const unsigned char *src, size_t count, float *dst)
{
    for (size_t i = 0; i < count; ++i)
        dst[i] = (float)(int32_t)io_load_u32(src + 4 * i);
}

/* Reads count elements of elem_size bytes from the file's position, converting into dst. */
clattn_io_status io_read_converted(FILE *file, size_t count, size_t elem_size, convert_fn convert,
                                   float *dst, const char *path, char *msg, size_t msg_size)
{
    unsigned char chunk[CHUNK_BYTES];
    size_t per_chunk = sizeof chunk / elem_size;
    for (size_t done = 0; done < count;) {
        size_t n = count - done < per_chunk ? count - done : per_chunk;
        clattn_io_status status =
            io_read_exact(file, chunk, n * elem_size, "the data", path, msg, msg_size);
        if (status != CLATTN_IO_OK)
            return status;
        convert(chunk, n, dst + done);
        done += n;
    }
    return CLATTN_IO_OK;
}

/* count floats (at least one, so data is never NULL on success). */
clattn_io_status io_alloc_floats(size_t count, float **out, const char *path, char *msg,
                                 size_t msg_size)
{
    size_t bytes;
    if (io_mul_overflows(count ? count : 1, sizeof(float), &bytes))
        return io_fail(msg, msg_size, CLATTN_IO_ERR_TOO_LARGE, path,
                       "%zu float32 values do not fit in memory", count);
    *out = malloc(bytes);
    if (*out == NULL)
        return io_fail(msg, msg_size, CLATTN_IO_ERR_MEMORY, path,
                       "out of memory allocating %zu bytes", bytes);
    return CLATTN_IO_OK;
}

const char *io_sniff_format(const unsigned char *head, size_t got, uint64_t file_size)
{
    static const unsigned char npy[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
    static const unsigned char png[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (got >= sizeof npy && memcmp(head, npy, sizeof npy) == 0)
        return "a .npy file";
    if (got >= sizeof png && memcmp(head, png, sizeof png) == 0)
        return "a PNG image";
    if (got >= 4 && memcmp(head, "PK\x03\x04", 4) == 0)
        return "a ZIP archive (numpy's .npz?)";
    /* safetensors: a little-endian u64 header length that fits the file (then '{', when a
     * ninth byte was read). The first 8 bytes of text or of another format read as a huge
     * number. */
    if (got >= 8 && (got == 8 || head[8] == '{') && file_size >= 10 && io_load_u64(head) >= 2 &&
        io_load_u64(head) <= file_size - 8)
        return "a safetensors file";
    return NULL;
}
