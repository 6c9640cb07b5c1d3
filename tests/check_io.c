/*
 * check_io: the file-format module (tools/io_*.c, clattn_io.h) without any OpenCL device.
 *
 * Every test builds its files byte by byte in a private temporary directory (mkdtemp), reads
 * them back through the public API and checks the status, the message (it must start with the
 * file's path) and the values. Files written by numpy itself live in tests/io/ (made by
 * tests/io_fixtures.py); their directory is the first argument (default: tests/io).
 *
 * Failures are collected and reported once at the end of each test, so a test always frees
 * what it allocated (the suite runs under ASan/LSan, with CK_FORK=no).
 *
 *     check_io [fixture_dir]
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, truncate, opendir */

#include <check.h>
#include <dirent.h>
#include <float.h>
#include <math.h>
#include <png.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clattn_io.h"

#define COUNT_OF(array) ((int)(sizeof(array) / sizeof((array)[0])))
#define MSG_SIZE 512

static char temp_dir[256];
static const char *fixture_dir = "tests/io";

/* --- failure collector ------------------------------------------------------------------- */

static char failure_text[16384];
static size_t failure_length;
static int failure_count;

static void begin_test(void)
{
    failure_text[0] = '\0';
    failure_length = 0;
    failure_count = 0;
}

static int expect(int ok, const char *format, ...) CK_ATTRIBUTE_FORMAT(printf, 2, 3);
static int expect(int ok, const char *format, ...)
{
    if (ok)
        return 1;
    ++failure_count;
    if (failure_length + 2 < sizeof failure_text) {
        va_list args;
        va_start(args, format);
        int written = vsnprintf(failure_text + failure_length, sizeof failure_text - failure_length,
                                format, args);
        va_end(args);
        if (written > 0)
            failure_length += (size_t)written;
        if (failure_length + 2 < sizeof failure_text) {
            failure_text[failure_length++] = '\n';
            failure_text[failure_length] = '\0';
        } else {
            failure_length = sizeof failure_text - 1;
        }
    }
    return 0;
}

#define END_CHECKS()                                                                               \
    ck_assert_msg(failure_count == 0, "%d failure(s):\n%s", failure_count, failure_text)

static int starts_with(const char *text, const char *prefix)
{
    return strncmp(text, prefix, strlen(prefix)) == 0;
}

/* The status is `want`, and on an error the message starts with "<path>: " and holds
 * `needle` (when not NULL). */
static int expect_status(const char *what, clattn_io_status got, clattn_io_status want,
                         const char *msg, const char *path, const char *needle)
{
    int ok = expect(got == want, "%s: status %s, want %s (message: %s)", what,
                    clattn_io_status_string(got), clattn_io_status_string(want), msg);
    if (want != CLATTN_IO_OK && got != CLATTN_IO_OK) {
        char prefix[300];
        snprintf(prefix, sizeof prefix, "%s: ", path);
        ok &= expect(starts_with(msg, prefix), "%s: message does not start with the path: %s", what,
                     msg);
        if (needle != NULL)
            ok &= expect(strstr(msg, needle) != NULL, "%s: message lacks \"%s\": %s", what, needle,
                         msg);
    }
    return ok;
}

/* --- files ------------------------------------------------------------------------------- */

static void temp_path(char *dst, size_t dst_size, const char *name)
{
    snprintf(dst, dst_size, "%s/%s", temp_dir, name);
}

static void write_file(const char *path, const void *bytes, size_t length)
{
    FILE *file = fopen(path, "wb");
    ck_assert_msg(file != NULL, "cannot create %s", path);
    ck_assert_msg(length == 0 || fwrite(bytes, 1, length, file) == length, "write %s", path);
    ck_assert_msg(fclose(file) == 0, "close %s", path);
}

/* Whole file into memory (test files are small); NULL when missing. */
static unsigned char *read_file(const char *path, size_t *length)
{
    FILE *file = fopen(path, "rb");
    if (file == NULL)
        return NULL;
    size_t capacity = 4096, used = 0;
    unsigned char *bytes = malloc(capacity);
    ck_assert(bytes != NULL);
    size_t got;
    while ((got = fread(bytes + used, 1, capacity - used, file)) > 0) {
        used += got;
        if (used == capacity) {
            capacity *= 2;
            bytes = realloc(bytes, capacity);
            ck_assert(bytes != NULL);
        }
    }
    fclose(file);
    *length = used;
    return bytes;
}

static int file_exists(const char *path)
{
    FILE *file = fopen(path, "rb");
    if (file != NULL)
        fclose(file);
    return file != NULL;
}

/* A growable byte buffer for building files. */
typedef struct bytes {
    unsigned char *data;
    size_t length, capacity;
} bytes;

static void put(bytes *buffer, const void *src, size_t length)
{
    if (buffer->length + length > buffer->capacity) {
        size_t capacity = buffer->capacity ? buffer->capacity : 256;
        while (capacity < buffer->length + length)
            capacity *= 2;
        buffer->data = realloc(buffer->data, capacity);
        ck_assert(buffer->data != NULL);
        buffer->capacity = capacity;
    }
    if (length > 0)
        memcpy(buffer->data + buffer->length, src, length);
    buffer->length += length;
}

static void put_text(bytes *buffer, const char *text)
{
    put(buffer, text, strlen(text));
}

static void put_le(bytes *buffer, uint64_t value, int width)
{
    unsigned char raw[8];
    for (int i = 0; i < width; ++i)
        raw[i] = (unsigned char)(value >> (8 * i));
    put(buffer, raw, (size_t)width);
}

static void put_f32(bytes *buffer, float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    put_le(buffer, bits, 4);
}

static void put_f64(bytes *buffer, double value)
{
    uint64_t bits;
    memcpy(&bits, &value, sizeof bits);
    put_le(buffer, bits, 8);
}

static void bytes_free(bytes *buffer)
{
    free(buffer->data);
    memset(buffer, 0, sizeof *buffer);
}

static uint32_t bits_of(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

/* --- .npy files built by hand -------------------------------------------------------------- */

/* Magic, version major.0, the header length (2 bytes for 1.0, else 4) and the header text. */
static void put_npy_header(bytes *buffer, int major, const char *header)
{
    put(buffer, "\x93NUMPY", 6);
    unsigned char version[2] = {(unsigned char)major, 0};
    put(buffer, version, 2);
    put_le(buffer, strlen(header), major == 1 ? 2 : 4);
    put_text(buffer, header);
}

/* numpy's dict, padded with spaces and '\n' so the data starts at a multiple of 64. */
static void npy_dict(char *dst, size_t dst_size, const char *descr, const char *fortran,
                     const char *shape, int major)
{
    int length = snprintf(dst, dst_size, "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }",
                          descr, fortran, shape);
    size_t used = (size_t)length;
    size_t preamble = major == 1 ? 10 : 12;
    while ((preamble + used + 1) % 64 != 0 && used + 2 < dst_size)
        dst[used++] = ' ';
    dst[used++] = '\n';
    dst[used] = '\0';
}

static void expect_shape(const char *what, const clattn_array *array, int ndim, const size_t *shape)
{
    int same = array->ndim == ndim;
    for (int d = 0; same && d < ndim; ++d)
        same = array->shape[d] == shape[d];
    expect(same, "%s: ndim %d shape[0] %zu, want ndim %d shape[0] %zu", what, array->ndim,
           array->shape[0], ndim, ndim ? shape[0] : 0);
}

/* A successful read gives a consistent array: count = product(shape), data present, and every
 * value readable (ASan checks the extent). */
static void expect_consistent(const char *what, const clattn_array *array)
{
    size_t count = 1;
    int ok = expect(array->ndim >= 0 && array->ndim <= CLATTN_IO_MAX_DIMS, "%s: ndim %d", what,
                    array->ndim);
    for (int d = 0; ok && d < array->ndim; ++d)
        count *= array->shape[d];
    if (ok)
        ok = expect(count == array->count, "%s: count %zu, shape says %zu", what, array->count,
                    count);
    ok = ok && expect(array->data != NULL, "%s: data is NULL", what);
    volatile float sink = 0.0f;
    for (size_t i = 0; ok && i < array->count; ++i)
        sink += array->data[i];
    (void)sink;
}

/* --- .npy: write/read round trips ---------------------------------------------------------- */

typedef struct shape_case {
    int ndim;
    size_t shape[4];
    const char *repr; /* numpy's repr of the shape */
} shape_case;

static const shape_case round_trip_shapes[] = {
    {0, {0}, "()"},         {1, {1}, "(1,)"},
    {2, {3, 5}, "(3, 5)"},  {3, {2, 3, 4}, "(2, 3, 4)"},
    {1, {0}, "(0,)"},       {3, {3, 0, 2}, "(3, 0, 2)"},
    {1, {4099}, "(4099,)"}, {4, {1, 1, 1, 7}, "(1, 1, 1, 7)"},
};

START_TEST(test_npy_round_trip)
{
    begin_test();
    const shape_case *sc = &round_trip_shapes[_i];
    char path[300], msg[MSG_SIZE], what[64];
    snprintf(what, sizeof what, "round trip %s", sc->repr);
    temp_path(path, sizeof path, "round_trip.npy");
    size_t count = 1;
    for (int d = 0; d < sc->ndim; ++d)
        count *= sc->shape[d];
    float *values = malloc((count ? count : 1) * sizeof *values);
    ck_assert(values != NULL);
    for (size_t i = 0; i < count; ++i)
        values[i] = (float)i * 0.25f - 3.0f;
    if (count >= 4) {
        values[1] = NAN;
        values[2] = -INFINITY;
        values[3] = -0.0f;
    }
    clattn_io_status status = clattn_npy_write(path, values, sc->ndim, sc->shape, msg, MSG_SIZE);
    expect_status(what, status, CLATTN_IO_OK, msg, path, NULL);

    /* numpy's layout: header padded to 64 with '\n' last, the dict exactly as numpy writes it */
    size_t length = 0;
    unsigned char *raw = read_file(path, &length);
    if (expect(raw != NULL && length >= 10, "%s: file missing", what)) {
        size_t header_length = raw[8] | (size_t)raw[9] << 8;
        char dict[200];
        snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }",
                 sc->repr);
        expect(memcmp(raw, "\x93NUMPY\x01\x00", 8) == 0, "%s: magic/version", what);
        expect((10 + header_length) % 64 == 0, "%s: data starts at %zu", what, 10 + header_length);
        expect(length == 10 + header_length + 4 * count, "%s: file length %zu", what, length);
        expect(10 + header_length <= length && raw[10 + header_length - 1] == '\n',
               "%s: header does not end with a newline", what);
        expect(length >= 10 + strlen(dict) && memcmp(raw + 10, dict, strlen(dict)) == 0,
               "%s: header is not %s", what, dict);
    }
    free(raw);

    clattn_array array;
    status = clattn_npy_read(path, &array, msg, MSG_SIZE);
    if (expect_status(what, status, CLATTN_IO_OK, msg, path, NULL)) {
        expect_shape(what, &array, sc->ndim, sc->shape);
        expect(array.count == count, "%s: count %zu want %zu", what, array.count, count);
        expect(array.source == CLATTN_IO_F32, "%s: source %d", what, (int)array.source);
        expect(array.data != NULL, "%s: data NULL", what);
        expect(count == 0 || memcmp(array.data, values, count * sizeof *values) == 0,
               "%s: values differ bitwise", what);
        expect(msg[0] == '\0', "%s: message on success: %s", what, msg);
    }
    clattn_array_free(&array);
    expect(array.data == NULL && array.count == 0, "%s: free does not zero", what);
    clattn_array_free(NULL);
    free(values);
    remove(path);
    END_CHECKS();
}
END_TEST

START_TEST(test_npy_dtypes)
{
    begin_test();
    char path[300], msg[MSG_SIZE], header[256];
    clattn_array array;
    temp_path(path, sizeof path, "dtypes.npy");

    /* float64: narrowed with overflow to +-inf, NaN kept, tiny values flush to zero */
    const double doubles[] = {0.1,    -2.5, 1e300, -1e300, NAN, 1e-320, 3.4028235677973366e38,
                              DBL_MAX};
    const float want_f8[] = {0.1f, -2.5f, INFINITY, -INFINITY, NAN, 0.0f, INFINITY, INFINITY};
    bytes file = {0};
    npy_dict(header, sizeof header, "<f8", "False", "(2, 4)", 1);
    put_npy_header(&file, 1, header);
    for (int i = 0; i < COUNT_OF(doubles); ++i)
        put_f64(&file, doubles[i]);
    write_file(path, file.data, file.length);
    bytes_free(&file);
    clattn_io_status status = clattn_npy_read(path, &array, msg, MSG_SIZE);
    if (expect_status("<f8", status, CLATTN_IO_OK, msg, path, NULL)) {
        expect(array.source == CLATTN_IO_F32 && array.count == 8, "<f8: source/count");
        for (int i = 0; i < 8; ++i) {
            int same = isnan(want_f8[i]) ? isnan(array.data[i])
                                         : bits_of(array.data[i]) == bits_of(want_f8[i]);
            expect(same, "<f8: value %d is %a, want %a", i, (double)array.data[i],
                   (double)want_f8[i]);
        }
    }
    clattn_array_free(&array);

    /* FLT_MAX itself and the largest double that still rounds to FLT_MAX stay finite */
    npy_dict(header, sizeof header, "<f8", "False", "(2,)", 1);
    put_npy_header(&file, 1, header);
    put_f64(&file, (double)FLT_MAX);
    put_f64(&file, 0x1.fffffefffffffp127);
    write_file(path, file.data, file.length);
    bytes_free(&file);
    status = clattn_npy_read(path, &array, msg, MSG_SIZE);
    if (expect_status("<f8 FLT_MAX", status, CLATTN_IO_OK, msg, path, NULL))
        expect(array.data[0] == FLT_MAX && array.data[1] == FLT_MAX, "<f8: %a %a",
               (double)array.data[0], (double)array.data[1]);
    clattn_array_free(&array);

    /* float16: exact, subnormals and infinities included */
    const uint16_t halves[] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x3555, 0x7c00};
    const float want_f2[] = {1.0f, -2.0f, 65504.0f, 0x1p-24f, 0.333251953125f, INFINITY};
    npy_dict(header, sizeof header, "<f2", "False", "(2, 3)", 1);
    put_npy_header(&file, 1, header);
    for (int i = 0; i < COUNT_OF(halves); ++i)
        put_le(&file, halves[i], 2);
    write_file(path, file.data, file.length);
    bytes_free(&file);
    status = clattn_npy_read(path, &array, msg, MSG_SIZE);
    if (expect_status("<f2", status, CLATTN_IO_OK, msg, path, NULL)) {
        expect(array.source == CLATTN_IO_F16 && array.count == 6, "<f2: source/count");
        for (int i = 0; i < 6; ++i)
            expect(bits_of(array.data[i]) == bits_of(want_f2[i]), "<f2: value %d is %a, want %a", i,
                   (double)array.data[i], (double)want_f2[i]);
    }
    clattn_array_free(&array);

    /* bfloat16 as numpy saves ml_dtypes.bfloat16 ('<V2'), exact */
    const uint16_t brains[] = {0x3f80, 0xc000, 0x7f7f, 0x0001, 0x3eab, 0xff80};
    const float want_bf[] = {1.0f, -2.0f, 0x1.fep127f, 0x1p-133f, 0.333984375f, -INFINITY};
    const char *v2_descrs[] = {"<V2", "|V2"};
    for (int k = 0; k < 2; ++k) {
        npy_dict(header, sizeof header, v2_descrs[k], "False", "(6,)", 1);
        put_npy_header(&file, 1, header);
        for (int i = 0; i < COUNT_OF(brains); ++i)
            put_le(&file, brains[i], 2);
        write_file(path, file.data, file.length);
        bytes_free(&file);
        status = clattn_npy_read(path, &array, msg, MSG_SIZE);
        if (expect_status(v2_descrs[k], status, CLATTN_IO_OK, msg, path, NULL)) {
            expect(array.source == CLATTN_IO_BF16 && array.count == 6, "%s: source/count",
                   v2_descrs[k]);
            for (int i = 0; i < 6; ++i)
                expect(bits_of(array.data[i]) == bits_of(want_bf[i]), "%s: value %d is %a, want %a",
                       v2_descrs[k], i, (double)array.data[i], (double)want_bf[i]);
        }
        clattn_array_free(&array);
    }

    /* int64 and int32: signed, exact below 2^24 */
    const int64_t ints[] = {0, 1, -1, 16777216, -7, 123456};
    const char *int_descrs[] = {"<i8", "<i4"};
    for (int k = 0; k < 2; ++k) {
        npy_dict(header, sizeof header, int_descrs[k], "False", "(3, 2)", 1);
        put_npy_header(&file, 1, header);
        for (int i = 0; i < COUNT_OF(ints); ++i)
            put_le(&file, (uint64_t)ints[i], k == 0 ? 8 : 4);
        write_file(path, file.data, file.length);
        bytes_free(&file);
        status = clattn_npy_read(path, &array, msg, MSG_SIZE);
        if (expect_status(int_descrs[k], status, CLATTN_IO_OK, msg, path, NULL)) {
            expect(array.source == CLATTN_IO_INT && array.count == 6, "%s: source/count",
                   int_descrs[k]);
            for (int i = 0; i < 6; ++i)
                expect(array.data[i] == (float)ints[i], "%s: value %d is %g, want %lld",
                       int_descrs[k], i, (double)array.data[i], (long long)ints[i]);
        }
        clattn_array_free(&array);
    }

    /* bool: any non-zero byte is true */
    const unsigned char bools[] = {0, 1, 2, 255, 0, 1};
    npy_dict(header, sizeof header, "|b1", "False", "(3, 2)", 1);
    put_npy_header(&file, 1, header);
    put(&file, bools, sizeof bools);
    write_file(path, file.data, file.length);
    bytes_free(&file);
    status = clattn_npy_read(path, &array, msg, MSG_SIZE);
    if (expect_status("|b1", status, CLATTN_IO_OK, msg, path, NULL)) {
        expect(array.source == CLATTN_IO_BOOL && array.count == 6, "|b1: source/count");
        for (int i = 0; i < 6; ++i)
            expect(array.data[i] == (bools[i] ? 1.0f : 0.0f), "|b1: value %d is %g", i,
                   (double)array.data[i]);
    }
    clattn_array_free(&array);

    /* uint8 under both spellings: the byte value */
    const char *u1_descrs[] = {"|u1", "<u1"};
    const unsigned char u1[] = {0, 7, 128, 255};
    for (int k = 0; k < 2; ++k) {
        npy_dict(header, sizeof header, u1_descrs[k], "False", "(4,)", 1);
        put_npy_header(&file, 1, header);
        put(&file, u1, sizeof u1);
        write_file(path, file.data, file.length);
        bytes_free(&file);
        status = clattn_npy_read(path, &array, msg, MSG_SIZE);
        if (expect_status(u1_descrs[k], status, CLATTN_IO_OK, msg, path, NULL)) {
            expect(array.source == CLATTN_IO_BOOL, "%s: source", u1_descrs[k]);
            for (int i = 0; i < 4; ++i)
                expect(array.data[i] == (float)u1[i], "%s: value %d is %g", u1_descrs[k], i,
                       (double)array.data[i]);
        }
        clattn_array_free(&array);
    }
    remove(path);
    END_CHECKS();
}
END_TEST

/* Headers numpy or other writers may produce: any key order, quotes, whitespace, trailing
 * commas, Python 2 longs, versions 2.0 and 3.0, no padding at all. */
typedef struct header_case {
    int major;
    const char *header;
    int ndim;
    size_t shape[3];
} header_case;

static const header_case header_cases[] = {
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 2, {2, 3}},
    {1, "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}", 2, {2, 3}},
    {1, "{\"fortran_order\":False,\"shape\":(6,),\"descr\":\"<f4\"}\n", 1, {6}},
    {1,
     "  {  'descr' : '<f4' ,\n 'fortran_order' :False,'shape':( 1 , 2 , 3 , ) , }  \n",
     3,
     {1, 2, 3}},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }", 2, {2, 3}},
    {2, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", 2, {3, 2}},
    {3, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }\t\r\n", 1, {6}},
    {1, "{'descr':'<f4','fortran_order':False,'shape':(1,1,6)}", 3, {1, 1, 6}},
};

START_TEST(test_npy_header_variants)
{
    begin_test();
    const header_case *hc = &header_cases[_i];
    char path[300], msg[MSG_SIZE], what[120];
    snprintf(what, sizeof what, "header %d (v%d.0)", _i, hc->major);
    temp_path(path, sizeof path, "variant.npy");
    bytes file = {0};
    put_npy_header(&file, hc->major, hc->header);
    for (int i = 0; i < 6; ++i)
        put_f32(&file, (float)i + 0.5f);
    write_file(path, file.data, file.length);
    bytes_free(&file);
    clattn_array array;
    clattn_io_status status = clattn_npy_read(path, &array, msg, MSG_SIZE);
    if (expect_status(what, status, CLATTN_IO_OK, msg, path, NULL)) {
        expect_shape(what, &array, hc->ndim, hc->shape);
        for (int i = 0; i < 6; ++i)
            expect(array.data[i] == (float)i + 0.5f, "%s: value %d", what, i);
    }
    clattn_array_free(&array);
    remove(path);
    END_CHECKS();
}
END_TEST

/* --- .npy: malformed and unsupported files ------------------------------------------------- */

typedef enum body_kind {
    BODY_DATA,  /* `data_bytes` bytes of data after the header */
    BODY_RAW,   /* only `raw` (raw_length bytes), nothing else */
    BODY_LENGTH /* magic, version, the length field `length_field` and `data_bytes` of spaces */
} body_kind;

typedef struct bad_npy {
    const char *name;
    body_kind kind;
    int major;
    const char *header; /* BODY_DATA: the header text */
    size_t data_bytes;
    const char *raw;
    size_t raw_length;
    uint64_t length_field;
    clattn_io_status want;
    const char *needle;
} bad_npy;

#define F4_HEADER(shape) "{'descr': '<f4', 'fortran_order': False, 'shape': " shape ", }\n"

static const bad_npy bad_npys[] = {
    {"empty file", BODY_RAW, 1, NULL, 0, "", 0, 0, CLATTN_IO_ERR_FORMAT, "bad magic"},
    {"wrong magic", BODY_RAW, 1, NULL, 0, "\x93NUMPX\x01\x00\x10\x00{}", 12, 0,
     CLATTN_IO_ERR_FORMAT, "not a .npy file (bad magic)"},
    {"text file", BODY_RAW, 1, NULL, 0, "hello, world\n", 13, 0, CLATTN_IO_ERR_FORMAT, "bad magic"},
    /* issue 46: another format is named, not only refused */
    {"a safetensors file", BODY_RAW, 1, NULL, 0, "\x02\0\0\0\0\0\0\0{}", 10, 0,
     CLATTN_IO_ERR_FORMAT, "not a .npy file (it is a safetensors file)"},
    {"a PNG image", BODY_RAW, 1, NULL, 0, "\x89PNG\r\n\x1a\n\0\0", 10, 0, CLATTN_IO_ERR_FORMAT,
     "not a .npy file (it is a PNG image)"},
    {"magic only", BODY_RAW, 1, NULL, 0, "\x93NUMPY\x01", 7, 0, CLATTN_IO_ERR_FORMAT, "header"},
    {"truncated length field", BODY_RAW, 2, NULL, 0, "\x93NUMPY\x02\x00\x10\x00", 10, 0,
     CLATTN_IO_ERR_FORMAT, "header"},
    {"truncated header", BODY_RAW, 1, NULL, 0, "\x93NUMPY\x01\x00\x40\x00{'descr': '<f4'", 25, 0,
     CLATTN_IO_ERR_FORMAT, "past the end"},
    {"header length past EOF", BODY_LENGTH, 1, NULL, 10, NULL, 0, 60000, CLATTN_IO_ERR_FORMAT,
     "header length 60000 runs past the end of the file"},
    {"absurd header length", BODY_LENGTH, 2, NULL, 10, NULL, 0, 0xffffffffu, CLATTN_IO_ERR_FORMAT,
     "past the end"},
    {"header over 1 MiB", BODY_LENGTH, 2, NULL, (1u << 20) + 1, NULL, 0, (1u << 20) + 1,
     CLATTN_IO_ERR_FORMAT, "1 MiB"},
    {"version 4.0", BODY_DATA, 4, F4_HEADER("(1,)"), 4, NULL, 0, 0, CLATTN_IO_ERR_UNSUPPORTED,
     "version 4.0"},
    {"shape product overflow", BODY_DATA, 1, F4_HEADER("(4294967296, 4294967296, 16)"), 0, NULL, 0,
     0, CLATTN_IO_ERR_TOO_LARGE, "overflows"},
    {"byte count overflow", BODY_DATA, 1, F4_HEADER("(4611686018427387904,)"), 0, NULL, 0, 0,
     CLATTN_IO_ERR_TOO_LARGE, "overflows"},
    {"shape entry over SIZE_MAX", BODY_DATA, 1, F4_HEADER("(99999999999999999999999,)"), 0, NULL, 0,
     0, CLATTN_IO_ERR_TOO_LARGE, "shape entry"},
    {"data shorter than the shape", BODY_DATA, 1, F4_HEADER("(2, 3)"), 20, NULL, 0, 0,
     CLATTN_IO_ERR_FORMAT, "file has 20 bytes of data, shape (2, 3) of <f4 needs 24"},
    {"data longer than the shape", BODY_DATA, 1, F4_HEADER("(2, 3)"), 28, NULL, 0, 0,
     CLATTN_IO_ERR_FORMAT, "file has 28 bytes of data, shape (2, 3) of <f4 needs 24"},
    {"scalar without data", BODY_DATA, 1, F4_HEADER("()"), 0, NULL, 0, 0, CLATTN_IO_ERR_FORMAT,
     "shape () of <f4 needs 4"},
    {"Fortran order", BODY_DATA, 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }\n",
     24, NULL, 0, 0, CLATTN_IO_ERR_UNSUPPORTED, "Fortran order"},
    {"int16", BODY_DATA, 1, "{'descr': '<i2', 'fortran_order': False, 'shape': (3,), }\n", 6, NULL,
     0, 0, CLATTN_IO_ERR_UNSUPPORTED,
     "descr '<i2' is not supported: use float32, float64, float16, bfloat16, int64, int32, bool "
     "or uint8"},
    {"big-endian float32", BODY_DATA, 1,
     "{'descr': '>f4', 'fortran_order': False, 'shape': (3,), }\n", 12, NULL, 0, 0,
     CLATTN_IO_ERR_UNSUPPORTED, "big-endian"},
    {"big-endian float64", BODY_DATA, 1,
     "{'descr': '>f8', 'fortran_order': False, 'shape': (3,), }\n", 24, NULL, 0, 0,
     CLATTN_IO_ERR_UNSUPPORTED, "'>f8' is big-endian"},
    {"big-endian float16", BODY_DATA, 1,
     "{'descr': '>f2', 'fortran_order': False, 'shape': (3,), }\n", 6, NULL, 0, 0,
     CLATTN_IO_ERR_UNSUPPORTED, "'>f2' is big-endian"},
    {"float16 data short", BODY_DATA, 1,
     "{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }\n", 5, NULL, 0, 0,
     CLATTN_IO_ERR_FORMAT, "needs 6"},
    {"object array", BODY_DATA, 1, "{'descr': '|O', 'fortran_order': False, 'shape': (3,), }\n", 24,
     NULL, 0, 0, CLATTN_IO_ERR_UNSUPPORTED, "'|O'"},
    {"structured dtype", BODY_DATA, 1,
     "{'descr': [('x', '<f4'), ('y', '<f4')], 'fortran_order': False, 'shape': (3,), }\n", 24, NULL,
     0, 0, CLATTN_IO_ERR_UNSUPPORTED, "structured"},
    {"nine dimensions", BODY_DATA, 1, F4_HEADER("(1, 1, 1, 1, 1, 1, 1, 1, 2)"), 8, NULL, 0, 0,
     CLATTN_IO_ERR_UNSUPPORTED, "9 dimensions"},
    {"missing shape", BODY_DATA, 1, "{'descr': '<f4', 'fortran_order': False}\n", 4, NULL, 0, 0,
     CLATTN_IO_ERR_FORMAT, "no 'shape' key"},
    {"missing descr", BODY_DATA, 1, "{'fortran_order': False, 'shape': (1,)}\n", 4, NULL, 0, 0,
     CLATTN_IO_ERR_FORMAT, "no 'descr' key"},
    {"duplicate key", BODY_DATA, 1,
     "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}\n", 4, NULL, 0, 0,
     CLATTN_IO_ERR_FORMAT, "twice"},
    {"unknown key", BODY_DATA, 1,
     "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}\n", 4, NULL, 0, 0,
     CLATTN_IO_ERR_FORMAT, "unexpected key"},
    {"shape not a tuple", BODY_DATA, 1, F4_HEADER("(5)"), 20, NULL, 0, 0, CLATTN_IO_ERR_FORMAT,
     "not a tuple"},
    {"shape as a list", BODY_DATA, 1, F4_HEADER("[5]"), 20, NULL, 0, 0, CLATTN_IO_ERR_FORMAT,
     "tuple"},
    {"negative dimension", BODY_DATA, 1, F4_HEADER("(-1, 3)"), 0, NULL, 0, 0, CLATTN_IO_ERR_FORMAT,
     "non-negative integers"},
    {"fractional dimension", BODY_DATA, 1, F4_HEADER("(2.5,)"), 8, NULL, 0, 0, CLATTN_IO_ERR_FORMAT,
     "non-negative integers"},
    {"fortran_order not a bool", BODY_DATA, 1,
     "{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}\n", 4, NULL, 0, 0, CLATTN_IO_ERR_FORMAT,
     "True or False"},
    {"text after the dict", BODY_DATA, 1,
     "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x\n", 4, NULL, 0, 0,
     CLATTN_IO_ERR_FORMAT, "after the dict"},
    {"unterminated string", BODY_DATA, 1, "{'descr: <f4, fortran_order: False}", 4, NULL, 0, 0,
     CLATTN_IO_ERR_FORMAT, "unterminated"},
    {"unclosed dict", BODY_DATA, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)\n", 4,
     NULL, 0, 0, CLATTN_IO_ERR_FORMAT, "not a valid dict"},
    {"empty header", BODY_DATA, 1, "", 4, NULL, 0, 0, CLATTN_IO_ERR_FORMAT, "expected '{'"},
};

START_TEST(test_npy_malformed)
{
    begin_test();
    const bad_npy *bad = &bad_npys[_i];
    char path[300], msg[MSG_SIZE];
    temp_path(path, sizeof path, "bad.npy");
    bytes file = {0};
    if (bad->kind == BODY_RAW) {
        put(&file, bad->raw, bad->raw_length);
    } else if (bad->kind == BODY_LENGTH) {
        put(&file, "\x93NUMPY", 6);
        unsigned char version[2] = {(unsigned char)bad->major, 0};
        put(&file, version, 2);
        put_le(&file, bad->length_field, bad->major == 1 ? 2 : 4);
        for (size_t i = 0; i < bad->data_bytes; ++i)
            put(&file, " ", 1);
    } else {
        put_npy_header(&file, bad->major, bad->header);
        for (size_t i = 0; i < bad->data_bytes; ++i)
            put(&file, "\x01", 1);
    }
    write_file(path, file.data, file.length);
    bytes_free(&file);
    clattn_array array;
    memset(&array, 0x5a, sizeof array);
    clattn_io_status status = clattn_npy_read(path, &array, msg, MSG_SIZE);
    expect_status(bad->name, status, bad->want, msg, path, bad->needle);
    expect(array.data == NULL && array.ndim == 0 && array.count == 0, "%s: out not zeroed on error",
           bad->name);
    clattn_array_free(&array);
    /* a NULL message buffer is allowed */
    status = clattn_npy_read(path, &array, NULL, 0);
    expect(status == bad->want, "%s: status without a message buffer %s", bad->name,
           clattn_io_status_string(status));
    clattn_array_free(&array);
    remove(path);
    END_CHECKS();
}
END_TEST

START_TEST(test_npy_open_errors)
{
    begin_test();
    char path[300], msg[MSG_SIZE];
    clattn_array array;
    temp_path(path, sizeof path, "does_not_exist.npy");
    clattn_io_status status = clattn_npy_read(path, &array, msg, MSG_SIZE);
    expect_status("missing file", status, CLATTN_IO_ERR_OPEN, msg, path, "cannot open");
    status = clattn_npy_read(temp_dir, &array, msg, MSG_SIZE);
    expect_status("directory", status, CLATTN_IO_ERR_OPEN, msg, temp_dir, NULL);
    status = clattn_npy_read(NULL, &array, msg, MSG_SIZE);
    expect(status == CLATTN_IO_ERR_ARGUMENT, "NULL path: %s", clattn_io_status_string(status));
    status = clattn_npy_read(path, NULL, msg, MSG_SIZE);
    expect(status == CLATTN_IO_ERR_ARGUMENT, "NULL out: %s", clattn_io_status_string(status));
    /* a tiny message buffer is truncated, never overrun */
    char tiny[8];
    status = clattn_npy_read(path, &array, tiny, sizeof tiny);
    expect(status == CLATTN_IO_ERR_OPEN && strlen(tiny) == 7, "tiny buffer: '%s'", tiny);
    END_CHECKS();
}
END_TEST

START_TEST(test_npy_write_errors)
{
    begin_test();
    char path[300], msg[MSG_SIZE];
    const float values[4] = {1, 2, 3, 4};
    size_t shape[9] = {1, 1, 1, 1, 1, 1, 1, 1, 4};
    temp_path(path, sizeof path, "write.npy");
    clattn_io_status status = clattn_npy_write(path, values, 9, shape, msg, MSG_SIZE);
    expect_status("nine dims", status, CLATTN_IO_ERR_ARGUMENT, msg, path, "ndim");
    status = clattn_npy_write(path, values, -1, shape, msg, MSG_SIZE);
    expect_status("negative ndim", status, CLATTN_IO_ERR_ARGUMENT, msg, path, NULL);
    status = clattn_npy_write(path, values, 2, NULL, msg, MSG_SIZE);
    expect_status("NULL shape", status, CLATTN_IO_ERR_ARGUMENT, msg, path, NULL);
    status = clattn_npy_write(NULL, values, 1, shape, msg, MSG_SIZE);
    expect(status == CLATTN_IO_ERR_ARGUMENT, "NULL path: %s", clattn_io_status_string(status));
    size_t four[1] = {4};
    status = clattn_npy_write(path, NULL, 1, four, msg, MSG_SIZE);
    expect_status("NULL data", status, CLATTN_IO_ERR_ARGUMENT, msg, path, NULL);
    size_t zero[2] = {0, 5};
    status = clattn_npy_write(path, NULL, 2, zero, msg, MSG_SIZE);
    expect_status("NULL data, no values", status, CLATTN_IO_OK, msg, path, NULL);
    size_t huge[3] = {(size_t)1 << 31, (size_t)1 << 31, (size_t)1 << 31};
    status = clattn_npy_write(path, values, 3, huge, msg, MSG_SIZE);
    expect_status("count overflow", status, CLATTN_IO_ERR_TOO_LARGE, msg, path, "overflows");
    size_t bytes_overflow[1] = {SIZE_MAX / 2};
    status = clattn_npy_write(path, values, 1, bytes_overflow, msg, MSG_SIZE);
    expect_status("byte overflow", status, CLATTN_IO_ERR_TOO_LARGE, msg, path, "overflows");
    char missing_dir[300];
    temp_path(missing_dir, sizeof missing_dir, "no_such_dir/out.npy");
    status = clattn_npy_write(missing_dir, values, 1, four, msg, MSG_SIZE);
    expect_status("missing directory", status, CLATTN_IO_ERR_OPEN, msg, missing_dir, "cannot");
    remove(path);
    END_CHECKS();
}
END_TEST

/* --- .npy: float16 and bfloat16 written from float32 --------------------------------------- */

/* Independent decoders: a half is mantissa * 2^(exponent - 25) (hidden bit for normals), a
 * bfloat16 is the top half of a float32. */
static double half_value(uint16_t bits)
{
    const int exponent = bits >> 10 & 0x1f, mantissa = bits & 0x3ff;
    const double sign = bits & 0x8000 ? -1.0 : 1.0;
    if (exponent == 0x1f)
        return mantissa ? NAN : sign * INFINITY;
    if (exponent == 0)
        return sign * ldexp(mantissa, -24);
    return sign * ldexp(mantissa + 1024, exponent - 25);
}

static float float_with_bits(uint32_t bits)
{
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static double bfloat16_value(uint16_t bits)
{
    return float_with_bits((uint32_t)bits << 16);
}

typedef struct typed_value {
    float value;
    uint16_t want; /* the expected bits; 0xffff: any NaN of the value's sign */
} typed_value;

static const typed_value f16_cases[] = {
    {0.0f, 0x0000},
    {-0.0f, 0x8000},
    {1.0f, 0x3c00},
    {1.0f / 3.0f, 0x3555},
    {-2.0f, 0xc000},
    {65504.0f, 0x7bff},   /* the largest half */
    {65519.996f, 0x7bff}, /* just under the midpoint to 2^16 */
    {65520.0f, 0x7c00},   /* the midpoint: ties to even, which is infinity */
    {-65520.0f, 0xfc00},
    {FLT_MAX, 0x7c00},
    {1e-7f, 0x0002}, /* 1.68 * 2^-24: a subnormal */
    {-1e-7f, 0x8002},
    {0x1p-24f, 0x0001},   /* the smallest subnormal */
    {0x1p-25f, 0x0000},   /* half of it: a tie, to even (zero) */
    {0x1.8p-25f, 0x0001}, /* 0.75 of it */
    {0x1.8p-24f, 0x0002}, /* 1.5 of it: a tie, to even (2) */
    {1e-8f, 0x0000},
    {1e-40f, 0x0000},       /* a float subnormal */
    {0x1.ffcp-15f, 0x0400}, /* 1023.5 units: a tie, to the smallest normal */
    {0x1p-14f, 0x0400},
    {1.0f + 0x1p-11f, 0x3c00}, /* ties between normals: to the even mantissa */
    {1.0f + 0x3p-11f, 0x3c02},
    {1.0f + 0x1p-11f + 0x1p-20f, 0x3c01},
    {2049.0f, 0x6800}, /* spacing 2 from 2048 on */
    {2051.0f, 0x6802},
    {INFINITY, 0x7c00},
    {-INFINITY, 0xfc00},
    {NAN, 0xffff},
};

static const typed_value bf16_cases[] = {
    {0.0f, 0x0000},
    {-0.0f, 0x8000},
    {1.0f, 0x3f80},
    {1.0f / 3.0f, 0x3eab}, /* 0x3eaaaaab rounds up */
    {-2.5f, 0xc020},
    {1.0f + 0x1p-8f, 0x3f80}, /* ties: to the even mantissa */
    {1.0f + 0x3p-8f, 0x3f82},
    {1.0f + 0x1p-8f + 0x1p-20f, 0x3f81},
    {65520.0f, 0x4780}, /* 65536 */
    {3.140625f, 0x4049},
    {FLT_MAX, 0x7f80}, /* past the midpoint above bfloat16's largest: infinity */
    {1e-40f, 0x0001},  /* float subnormals stay subnormal */
    {INFINITY, 0x7f80},
    {-INFINITY, 0xff80},
    {NAN, 0xffff},
};

static void check_typed_file(const char *what, clattn_io_dtype dtype, const typed_value *cases,
                             int count)
{
    char path[300], msg[MSG_SIZE];
    const int bf16 = dtype == CLATTN_IO_BF16;
    temp_path(path, sizeof path, "typed.npy");
    /* two NaNs more: a negative one, and one whose payload lies only in the low 16 bits
     * (truncating it would give infinity) */
    float values[64];
    size_t n = 0;
    for (int i = 0; i < count; ++i)
        values[n++] = cases[i].value;
    values[n++] = -NAN;
    values[n++] = float_with_bits(0x7f800001u);
    const size_t shape[2] = {1, n};
    clattn_io_status status = clattn_npy_write_typed(path, values, 2, shape, dtype, msg, MSG_SIZE);
    expect_status(what, status, CLATTN_IO_OK, msg, path, NULL);

    size_t length = 0;
    unsigned char *raw = read_file(path, &length);
    uint16_t bits[64] = {0};
    if (expect(raw != NULL && length >= 10, "%s: file missing", what)) {
        const size_t header_length = raw[8] | (size_t)raw[9] << 8, start = 10 + header_length;
        char dict[200];
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (1, %zu), }",
                 bf16 ? "<V2" : "<f2", n);
        expect(start % 64 == 0 && raw[start - 1] == '\n', "%s: data starts at %zu", what, start);
        expect(memcmp(raw + 10, dict, strlen(dict)) == 0, "%s: header is not %s", what, dict);
        if (expect(length == start + 2 * n, "%s: file length %zu", what, length))
            for (size_t i = 0; i < n; ++i)
                bits[i] = (uint16_t)(raw[start + 2 * i] | raw[start + 2 * i + 1] << 8);
    }
    free(raw);
    const uint16_t exponent_mask = bf16 ? 0x7f80 : 0x7c00, sign_mask = 0x8000;
    for (int i = 0; i < count; ++i) {
        if (cases[i].want == 0xffff)
            expect((bits[i] & exponent_mask) == exponent_mask &&
                       (bits[i] & 0x7fff) != exponent_mask,
                   "%s: NaN written as 0x%04x", what, (unsigned)bits[i]);
        else
            expect(bits[i] == cases[i].want, "%s: %a written as 0x%04x, want 0x%04x", what,
                   (double)cases[i].value, (unsigned)bits[i], (unsigned)cases[i].want);
    }
    for (size_t i = (size_t)count; i < n; ++i)
        expect((bits[i] & exponent_mask) == exponent_mask && (bits[i] & 0x7fff) != exponent_mask &&
                   (bits[i] & sign_mask) == (i == (size_t)count ? sign_mask : 0),
               "%s: NaN %zu written as 0x%04x", what, i - (size_t)count, (unsigned)bits[i]);

    clattn_array array;
    status = clattn_npy_read(path, &array, msg, MSG_SIZE);
    if (expect_status(what, status, CLATTN_IO_OK, msg, path, NULL)) {
        expect_shape(what, &array, 2, shape);
        expect(array.source == dtype, "%s: read back as source %d", what, (int)array.source);
        for (size_t i = 0; i < n && i < array.count; ++i) {
            const double want = bf16 ? bfloat16_value(bits[i]) : half_value(bits[i]);
            expect(isnan(want) ? isnan(array.data[i])
                               : array.data[i] == want && !signbit(array.data[i]) == !signbit(want),
                   "%s: value %zu (0x%04x) reads as %a, want %a", what, i, (unsigned)bits[i],
                   (double)array.data[i], want);
        }
    }
    clattn_array_free(&array);
    remove(path);
}

/* Every written value is the nearest of its type, ties to the even one: checked against the
 * neighbours of the written bits, for values drawn across the whole range of float16 and
 * bfloat16 (a seeded generator; the seed is the case's index). */
static void check_typed_nearest(const char *what, clattn_io_dtype dtype)
{
    enum { COUNT = 20000 };
    char path[300], msg[MSG_SIZE];
    const int bf16 = dtype == CLATTN_IO_BF16;
    temp_path(path, sizeof path, "nearest.npy");
    float *values = malloc(COUNT * sizeof *values);
    ck_assert(values != NULL);
    uint64_t state = 0x9e3779b97f4a7c15u;
    for (size_t i = 0; i < COUNT; ++i) {
        state = state * 6364136223846793005u + 1442695040888963407u;
        const uint32_t random = (uint32_t)(state >> 32);
        /* magnitudes 2^-27 .. 2^17 for half, the whole float range for bfloat16; a quarter of
         * them exact ties (the bits below the kept mantissa at 1000...) */
        const int exponent = bf16 ? (int)(random % 250) - 125 : (int)(random % 45) - 27;
        float mantissa = 1.0f + (float)(random >> 9 & 0x3fff) / 16384.0f;
        if ((random >> 29 & 3) == 0)
            mantissa =
                1.0f + (float)(random >> 9 & (bf16 ? 0xff : 0x7ff)) / (bf16 ? 256.0f : 2048.0f);
        values[i] = ldexpf(random >> 31 ? -mantissa : mantissa, exponent);
    }
    const size_t shape[1] = {COUNT};
    clattn_io_status status = clattn_npy_write_typed(path, values, 1, shape, dtype, msg, MSG_SIZE);
    size_t length = 0;
    unsigned char *raw = read_file(path, &length);
    if (expect_status(what, status, CLATTN_IO_OK, msg, path, NULL) &&
        expect(raw != NULL && length == 128 + 2 * COUNT, "%s: file length %zu", what, length)) {
        const uint16_t largest = bf16 ? 0x7f7f : 0x7bff, infinity = bf16 ? 0x7f80 : 0x7c00;
        /* past the largest finite value: rounding reaches infinity from the midpoint to the
         * next power of two (2^128 or 2^16) on */
        const double next = bf16 ? 0x1p128 : 65536.0, limit = bf16 ? 0x1.fep127 : 65520.0;
        size_t wrong = 0, ties = 0;
        for (size_t i = 0; i < COUNT; ++i) {
            const uint16_t bits = (uint16_t)(raw[128 + 2 * i] | raw[128 + 2 * i + 1] << 8);
            const uint16_t magnitude = bits & 0x7fff;
            const double x = fabs((double)values[i]);
            int ok = (bits >> 15) == (values[i] < 0.0f);
            if (magnitude == infinity) {
                ok = ok && x >= limit;
            } else if (magnitude > largest) {
                ok = 0;
            } else {
                double (*value_of)(uint16_t) = bf16 ? bfloat16_value : half_value;
                const double here = fabs(x - value_of(magnitude));
                const double up = fabs(x - (magnitude < largest ? value_of(magnitude + 1) : next));
                const double down = magnitude > 0 ? fabs(x - value_of(magnitude - 1)) : INFINITY;
                ok = ok && here <= up && here <= down &&
                     ((here != up && here != down) || (magnitude & 1) == 0);
                ties += here == up || here == down;
            }
            if (!ok && wrong++ < 5)
                expect(0, "%s: %a written as 0x%04x, not the nearest", what, (double)values[i],
                       (unsigned)bits);
        }
        expect(wrong == 0, "%s: %zu of %d values not rounded to the nearest", what, wrong, COUNT);
        expect(ties > COUNT / 20, "%s: only %zu ties drawn", what, ties);
    }
    free(raw);
    free(values);
    remove(path);
}

START_TEST(test_npy_write_typed)
{
    begin_test();
    check_typed_file("float16", CLATTN_IO_F16, f16_cases, COUNT_OF(f16_cases));
    check_typed_file("bfloat16", CLATTN_IO_BF16, bf16_cases, COUNT_OF(bf16_cases));
    check_typed_nearest("float16 nearest", CLATTN_IO_F16);
    check_typed_nearest("bfloat16 nearest", CLATTN_IO_BF16);

    /* F32 through the typed writer: the same bytes as clattn_npy_write */
    char path[300], other[300], msg[MSG_SIZE];
    temp_path(path, sizeof path, "typed_f32.npy");
    temp_path(other, sizeof other, "plain_f32.npy");
    const float values[5] = {1.0f / 3.0f, -0.0f, NAN, 65520.0f, 1e-40f};
    const size_t five[1] = {5};
    clattn_io_status status =
        clattn_npy_write_typed(path, values, 1, five, CLATTN_IO_F32, msg, MSG_SIZE);
    expect_status("typed f32", status, CLATTN_IO_OK, msg, path, NULL);
    status = clattn_npy_write(other, values, 1, five, msg, MSG_SIZE);
    expect_status("plain f32", status, CLATTN_IO_OK, msg, other, NULL);
    size_t length = 0, other_length = 0;
    unsigned char *raw = read_file(path, &length), *other_raw = read_file(other, &other_length);
    expect(raw != NULL && other_raw != NULL && length == 128 + 20 && length == other_length &&
               memcmp(raw, other_raw, length) == 0,
           "typed f32: %zu bytes differ from clattn_npy_write's %zu", length, other_length);
    free(raw);
    free(other_raw);
    remove(other);
    remove(path);

    /* refusals: other dtypes, the argument checks, sizes that overflow at 2 bytes a value */
    status = clattn_npy_write_typed(path, values, 1, five, CLATTN_IO_BOOL, msg, MSG_SIZE);
    expect_status("bool dtype", status, CLATTN_IO_ERR_ARGUMENT, msg, path, "dtype");
    status = clattn_npy_write_typed(path, values, 1, five, CLATTN_IO_INT, msg, MSG_SIZE);
    expect_status("int dtype", status, CLATTN_IO_ERR_ARGUMENT, msg, path, "dtype");
    status = clattn_npy_write_typed(path, values, 1, five, (clattn_io_dtype)42, msg, MSG_SIZE);
    expect_status("unknown dtype", status, CLATTN_IO_ERR_ARGUMENT, msg, path, "dtype");
    expect(!file_exists(path), "a refused write left %s", path);
    status = clattn_npy_write_typed(path, values, 9, five, CLATTN_IO_F16, msg, MSG_SIZE);
    expect_status("nine dims", status, CLATTN_IO_ERR_ARGUMENT, msg, path, "ndim");
    status = clattn_npy_write_typed(path, NULL, 1, five, CLATTN_IO_BF16, msg, MSG_SIZE);
    expect_status("NULL data", status, CLATTN_IO_ERR_ARGUMENT, msg, path, NULL);
    const size_t bytes_overflow[1] = {SIZE_MAX / 2 + 1}, fits[1] = {SIZE_MAX / 2};
    status = clattn_npy_write_typed(path, values, 1, bytes_overflow, CLATTN_IO_F16, msg, MSG_SIZE);
    expect_status("f16 byte overflow", status, CLATTN_IO_ERR_TOO_LARGE, msg, path, "overflows");
    status = clattn_npy_write_typed(path, values, 1, fits, CLATTN_IO_F32, msg, MSG_SIZE);
    expect_status("f32 byte overflow", status, CLATTN_IO_ERR_TOO_LARGE, msg, path, "overflows");
    const size_t zero[2] = {0, 3};
    status = clattn_npy_write_typed(path, NULL, 2, zero, CLATTN_IO_BF16, msg, MSG_SIZE);
    expect_status("empty bf16", status, CLATTN_IO_OK, msg, path, NULL);
    clattn_array array;
    status = clattn_npy_read(path, &array, msg, MSG_SIZE);
    if (expect_status("empty bf16 read", status, CLATTN_IO_OK, msg, path, NULL))
        expect(array.count == 0 && array.source == CLATTN_IO_BF16, "empty bf16: %zu values",
               array.count);
    clattn_array_free(&array);
    remove(path);
    END_CHECKS();
}
END_TEST

/* --- numpy-written fixtures ---------------------------------------------------------------- */

static void fixture_path(char *dst, size_t dst_size, const char *name)
{
    snprintf(dst, dst_size, "%s/%s", fixture_dir, name);
}

START_TEST(test_npy_numpy_files)
{
    begin_test();
    char path[600], msg[MSG_SIZE];
    clattn_array array;
    const size_t shape34[2] = {3, 4}, shape23[2] = {2, 3}, shape3[1] = {3};
    const size_t shape03[2] = {0, 3};
    const char *f4_files[] = {"np_f4_v1.npy", "np_f4_v3.npy"};
    for (int k = 0; k < 2; ++k) {
        fixture_path(path, sizeof path, f4_files[k]);
        clattn_io_status status = clattn_npy_read(path, &array, msg, MSG_SIZE);
        if (expect_status(f4_files[k], status, CLATTN_IO_OK, msg, path, NULL)) {
            expect_shape(f4_files[k], &array, 2, shape34);
            for (int i = 0; i < 12; ++i)
                expect(array.data[i] == 0.5f * (float)i - 1.0f, "%s: value %d is %g", f4_files[k],
                       i, (double)array.data[i]);
        }
        clattn_array_free(&array);
    }
    fixture_path(path, sizeof path, "np_f8_v2.npy");
    clattn_io_status status = clattn_npy_read(path, &array, msg, MSG_SIZE);
    if (expect_status("np_f8_v2", status, CLATTN_IO_OK, msg, path, NULL)) {
        const float want[6] = {0.1f, -2.0f, INFINITY, -INFINITY, INFINITY, NAN};
        expect_shape("np_f8_v2", &array, 2, shape23);
        for (int i = 0; i < 6; ++i)
            expect(isnan(want[i]) ? isnan(array.data[i]) : array.data[i] == want[i],
                   "np_f8_v2: value %d is %g", i, (double)array.data[i]);
    }
    clattn_array_free(&array);
    fixture_path(path, sizeof path, "np_bool.npy");
    status = clattn_npy_read(path, &array, msg, MSG_SIZE);
    if (expect_status("np_bool", status, CLATTN_IO_OK, msg, path, NULL)) {
        const float want[6] = {1, 0, 1, 0, 0, 1};
        expect_shape("np_bool", &array, 2, shape23);
        expect(array.source == CLATTN_IO_BOOL, "np_bool: source");
        expect(memcmp(array.data, want, sizeof want) == 0, "np_bool: values");
    }
    clattn_array_free(&array);
    fixture_path(path, sizeof path, "np_u1.npy");
    status = clattn_npy_read(path, &array, msg, MSG_SIZE);
    if (expect_status("np_u1", status, CLATTN_IO_OK, msg, path, NULL)) {
        expect_shape("np_u1", &array, 1, shape3);
        expect(array.data[0] == 0 && array.data[1] == 7 && array.data[2] == 255, "np_u1 values");
    }
    clattn_array_free(&array);
    fixture_path(path, sizeof path, "np_scalar.npy");
    status = clattn_npy_read(path, &array, msg, MSG_SIZE);
    if (expect_status("np_scalar", status, CLATTN_IO_OK, msg, path, NULL))
        expect(array.ndim == 0 && array.count == 1 && array.data[0] == 2.5f, "np_scalar");
    clattn_array_free(&array);
    fixture_path(path, sizeof path, "np_empty.npy");
    status = clattn_npy_read(path, &array, msg, MSG_SIZE);
    if (expect_status("np_empty", status, CLATTN_IO_OK, msg, path, NULL)) {
        expect_shape("np_empty", &array, 2, shape03);
        expect(array.count == 0 && array.data != NULL, "np_empty: count/data");
    }
    clattn_array_free(&array);
    const struct {
        const char *name;
        clattn_io_status want;
        const char *needle;
    } refused[] = {
        {"np_fortran.npy", CLATTN_IO_ERR_UNSUPPORTED, "Fortran"},
        {"np_big_endian.npy", CLATTN_IO_ERR_UNSUPPORTED, "big-endian"},
    };
    /* numpy's own int64 file reads as integers */
    fixture_path(path, sizeof path, "np_i8.npy");
    status = clattn_npy_read(path, &array, msg, MSG_SIZE);
    if (expect_status("np_i8", status, CLATTN_IO_OK, msg, path, NULL))
        expect(array.source == CLATTN_IO_INT && array.count == 3 && array.data[0] == 0.0f &&
                   array.data[1] == 1.0f && array.data[2] == 2.0f,
               "np_i8: source %d count %zu", (int)array.source, array.count);
    clattn_array_free(&array);
    for (int k = 0; k < COUNT_OF(refused); ++k) {
        fixture_path(path, sizeof path, refused[k].name);
        status = clattn_npy_read(path, &array, msg, MSG_SIZE);
        expect_status(refused[k].name, status, refused[k].want, msg, path, refused[k].needle);
        clattn_array_free(&array);
    }
    END_CHECKS();
}
END_TEST

/* --- safetensors built by hand ------------------------------------------------------------- */

/* u64 header length, the header text, then `data` (data_length bytes). */
static void write_safetensors(const char *path, const char *header, const void *data,
                              size_t data_length)
{
    bytes file = {0};
    put_le(&file, strlen(header), 8);
    put_text(&file, header);
    put(&file, data, data_length);
    write_file(path, file.data, file.length);
    bytes_free(&file);
}

static uint16_t f16_bits[] = {
    0x0000, /* 0 */
    0x8000, /* -0 */
    0x3c00, /* 1 */
    0xc000, /* -2 */
    0x7bff, /* 65504, the largest half */
    0x0001, /* 2^-24, the smallest subnormal */
    0x03ff, /* the largest subnormal, 1023 * 2^-24 */
    0x0400, /* 2^-14, the smallest normal */
    0x3555, /* 0.333251953125 */
    0x7c00, /* inf */
    0xfc00, /* -inf */
    0x7e00, /* NaN */
};
static const float f16_want[] = {0.0f,      -0.0f,        1.0f,     -2.0f,           65504.0f,
                                 0x1p-24f,  0x1.ff8p-15f, 0x1p-14f, 0.333251953125f, INFINITY,
                                 -INFINITY, NAN};

static uint16_t bf16_bits[] = {0x3f80, 0xc020, 0x4049, 0x7f80, 0xff80, 0x7fc0, 0x0001, 0x8000};
static const float bf16_want[] = {1.0f,      -2.5f, 3.140625f, INFINITY,
                                  -INFINITY, NAN,   0x1p-133f, -0.0f};

static int same_float(float got, float want)
{
    if (isnan(want))
        return isnan(got);
    return bits_of(got) == bits_of(want);
}

/* A file with every kind of entry: F32 (2, 3), F16 and BF16 vectors, a scalar, an empty
 * tensor, an I64 and an unknown dtype (listable, not readable), __metadata__, header padding. */
static void write_mixed_safetensors(const char *path)
{
    bytes data = {0};
    for (int i = 0; i < 6; ++i)
        put_f32(&data, (float)i - 2.5f); /* [0, 24) */
    for (int i = 0; i < COUNT_OF(f16_bits); ++i)
        put_le(&data, f16_bits[i], 2); /* [24, 48) */
    for (int i = 0; i < COUNT_OF(bf16_bits); ++i)
        put_le(&data, bf16_bits[i], 2); /* [48, 64) */
    put_f32(&data, 42.0f);              /* [64, 68) */
    put_le(&data, 7, 8);                /* [68, 76) */
    put_le(&data, 0xabcd, 2);           /* [76, 78) */
    const char *header =
        "{\"__metadata__\": {\"format\": \"pt\"},"
        " \"weight\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 24]},"
        " \"half\": {\"dtype\": \"F16\", \"shape\": [12], \"data_offsets\": [24, 48]},"
        " \"brain\": {\"shape\": [2, 4], \"data_offsets\": [48, 64], \"dtype\": \"BF16\"},"
        " \"scalar\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [64, 68]},"
        " \"empty\": {\"dtype\": \"F32\", \"shape\": [0, 4], \"data_offsets\": [68, 68]},"
        " \"ids\": {\"dtype\": \"I64\", \"shape\": [1], \"data_offsets\": [68, 76]},"
        " \"odd\": {\"dtype\": \"X9\", \"shape\": [7, 7], \"data_offsets\": [76, 78]}}    ";
    write_safetensors(path, header, data.data, data.length);
    bytes_free(&data);
}

START_TEST(test_st_read)
{
    begin_test();
    char path[300], msg[MSG_SIZE];
    temp_path(path, sizeof path, "mixed.safetensors");
    write_mixed_safetensors(path);
    clattn_safetensors *file = NULL;
    clattn_io_status status = clattn_safetensors_open(path, &file, msg, MSG_SIZE);
    if (!expect_status("open", status, CLATTN_IO_OK, msg, path, NULL)) {
        END_CHECKS();
        return;
    }
    const char *names[] = {"weight", "half", "brain", "scalar", "empty", "ids", "odd"};
    expect(clattn_safetensors_count(file) == 7, "count %zu", clattn_safetensors_count(file));
    for (int i = 0; i < COUNT_OF(names); ++i) {
        const char *name = clattn_safetensors_name(file, (size_t)i);
        expect(name != NULL && strcmp(name, names[i]) == 0, "name %d is %s, want %s", i,
               name ? name : "NULL", names[i]);
        expect(clattn_safetensors_has(file, names[i]), "has(%s)", names[i]);
    }
    expect(clattn_safetensors_name(file, 7) == NULL, "name(7) is not NULL");
    expect(!clattn_safetensors_has(file, "__metadata__"), "__metadata__ listed as a tensor");
    expect(!clattn_safetensors_has(file, "weigh"), "has(weigh)");
    expect(!clattn_safetensors_has(file, NULL), "has(NULL)");

    clattn_array array;
    const size_t shape23[2] = {2, 3}, shape12[1] = {12}, shape24[2] = {2, 4}, shape04[2] = {0, 4};
    status = clattn_safetensors_read(file, "weight", &array, msg, MSG_SIZE);
    if (expect_status("weight", status, CLATTN_IO_OK, msg, path, NULL)) {
        expect_shape("weight", &array, 2, shape23);
        for (int i = 0; i < 6; ++i)
            expect(array.data[i] == (float)i - 2.5f, "weight %d is %g", i, (double)array.data[i]);
        expect(array.source == CLATTN_IO_F32, "weight: source");
    }
    clattn_array_free(&array);
    status = clattn_safetensors_read(file, "half", &array, msg, MSG_SIZE);
    if (expect_status("half", status, CLATTN_IO_OK, msg, path, NULL)) {
        expect_shape("half", &array, 1, shape12);
        for (int i = 0; i < COUNT_OF(f16_bits); ++i)
            expect(same_float(array.data[i], f16_want[i]), "F16 0x%04x -> %a, want %a",
                   (unsigned)f16_bits[i], (double)array.data[i], (double)f16_want[i]);
    }
    clattn_array_free(&array);
    status = clattn_safetensors_read(file, "brain", &array, msg, MSG_SIZE);
    if (expect_status("brain", status, CLATTN_IO_OK, msg, path, NULL)) {
        expect_shape("brain", &array, 2, shape24);
        for (int i = 0; i < COUNT_OF(bf16_bits); ++i)
            expect(same_float(array.data[i], bf16_want[i]), "BF16 0x%04x -> %a, want %a",
                   (unsigned)bf16_bits[i], (double)array.data[i], (double)bf16_want[i]);
    }
    clattn_array_free(&array);
    status = clattn_safetensors_read(file, "scalar", &array, msg, MSG_SIZE);
    if (expect_status("scalar", status, CLATTN_IO_OK, msg, path, NULL))
        expect(array.ndim == 0 && array.count == 1 && array.data[0] == 42.0f, "scalar");
    clattn_array_free(&array);
    status = clattn_safetensors_read(file, "empty", &array, msg, MSG_SIZE);
    if (expect_status("empty", status, CLATTN_IO_OK, msg, path, NULL)) {
        expect_shape("empty", &array, 2, shape04);
        expect(array.count == 0 && array.data != NULL, "empty: count/data");
    }
    clattn_array_free(&array);
    status = clattn_safetensors_read(file, "ids", &array, msg, MSG_SIZE);
    expect_status("ids (I64)", status, CLATTN_IO_ERR_UNSUPPORTED, msg, path,
                  "tensor 'ids' has dtype I64: only F32, F16, BF16 and F64 can be read");
    expect(array.data == NULL, "ids: data set on error");
    status = clattn_safetensors_read(file, "odd", &array, msg, MSG_SIZE);
    expect_status("odd (X9)", status, CLATTN_IO_ERR_UNSUPPORTED, msg, path, "dtype X9");
    status = clattn_safetensors_read(file, "missing", &array, msg, MSG_SIZE);
    expect_status("missing", status, CLATTN_IO_ERR_NOT_FOUND, msg, path,
                  "no tensor 'missing' (the file has 7 tensors: weight, half, brain");
    expect(array.data == NULL && array.count == 0, "missing: out not zeroed");
    status = clattn_safetensors_read(file, NULL, &array, msg, MSG_SIZE);
    expect_status("NULL name", status, CLATTN_IO_ERR_ARGUMENT, msg, path, NULL);
    status = clattn_safetensors_read(file, "weight", NULL, msg, MSG_SIZE);
    expect_status("NULL out", status, CLATTN_IO_ERR_ARGUMENT, msg, path, NULL);
    status = clattn_safetensors_read(NULL, "weight", &array, msg, MSG_SIZE);
    expect(status == CLATTN_IO_ERR_ARGUMENT, "NULL file: %s", clattn_io_status_string(status));
    clattn_safetensors_close(file);

    /* NULL handling of the small accessors */
    clattn_safetensors_close(NULL);
    expect(clattn_safetensors_count(NULL) == 0, "count(NULL)");
    expect(clattn_safetensors_name(NULL, 0) == NULL, "name(NULL)");
    expect(!clattn_safetensors_has(NULL, "weight"), "has(NULL file)");
    status = clattn_safetensors_open(path, NULL, msg, MSG_SIZE);
    expect(status == CLATTN_IO_ERR_ARGUMENT, "open without out: %s",
           clattn_io_status_string(status));
    remove(path);
    END_CHECKS();
}
END_TEST

/* A file from the fixtures, laid out as the safetensors library writes one. */
START_TEST(test_st_fixture)
{
    begin_test();
    char path[600], msg[MSG_SIZE];
    fixture_path(path, sizeof path, "st_mixed.safetensors");
    clattn_safetensors *file = NULL;
    clattn_io_status status = clattn_safetensors_open(path, &file, msg, MSG_SIZE);
    if (expect_status("open fixture", status, CLATTN_IO_OK, msg, path, NULL)) {
        clattn_array array;
        expect(clattn_safetensors_count(file) == 4, "fixture count %zu",
               clattn_safetensors_count(file));
        status = clattn_safetensors_read(file, "weight", &array, msg, MSG_SIZE);
        if (expect_status("fixture weight", status, CLATTN_IO_OK, msg, path, NULL)) {
            for (int i = 0; i < 6; ++i)
                expect(array.data[i] == (float)i - 2.5f, "fixture weight %d", i);
        }
        clattn_array_free(&array);
        const float half_want[6] = {0.0f, 1.0f, -2.0f, 65504.0f, 0x1p-24f, INFINITY};
        status = clattn_safetensors_read(file, "half", &array, msg, MSG_SIZE);
        if (expect_status("fixture half", status, CLATTN_IO_OK, msg, path, NULL)) {
            for (int i = 0; i < 6; ++i)
                expect(same_float(array.data[i], half_want[i]), "fixture half %d is %a", i,
                       (double)array.data[i]);
        }
        clattn_array_free(&array);
        const float brain_want[4] = {1.0f, -2.5f, 3.140625f, -INFINITY};
        status = clattn_safetensors_read(file, "brain", &array, msg, MSG_SIZE);
        if (expect_status("fixture brain", status, CLATTN_IO_OK, msg, path, NULL)) {
            for (int i = 0; i < 4; ++i)
                expect(same_float(array.data[i], brain_want[i]), "fixture brain %d is %a", i,
                       (double)array.data[i]);
        }
        clattn_array_free(&array);
        status = clattn_safetensors_read(file, "ids", &array, msg, MSG_SIZE);
        expect_status("fixture ids", status, CLATTN_IO_ERR_UNSUPPORTED, msg, path, "I64");
    }
    clattn_safetensors_close(file);
    END_CHECKS();
}
END_TEST

typedef struct bad_st {
    const char *name;
    const char *header; /* NULL: raw bytes below */
    size_t data_length; /* bytes of data after the header */
    int64_t length_fix; /* added to the header length field */
    const char *raw;    /* whole file when header is NULL */
    size_t raw_length;
    clattn_io_status want;
    const char *needle;
} bad_st;

#define ST_ONE(dtype, shape, offsets)                                                              \
    "{\"t\": {\"dtype\": \"" dtype "\", \"shape\": " shape ", \"data_offsets\": " offsets "}}"

static const bad_st bad_sts[] = {
    {"empty file", NULL, 0, 0, "", 0, CLATTN_IO_ERR_FORMAT, "too short"},
    {"seven bytes", NULL, 0, 0, "\x02\0\0\0\0\0\0", 7, CLATTN_IO_ERR_FORMAT, "too short"},
    {"header length past EOF", ST_ONE("F32", "[1]", "[0, 4]"), 4, 100, NULL, 0,
     CLATTN_IO_ERR_FORMAT,
     "not a safetensors file: header length 161 runs past the end of the file"},
    /* issue 46: a .npy given as --weights was "a 379 TB header" */
    {"a .npy file", NULL, 0, 0, "\x93NUMPY\x01\x00\x10\x00{'descr': '<f4'}", 26,
     CLATTN_IO_ERR_FORMAT, "not a safetensors file (it is a .npy file)"},
    {"header length 2^62", NULL, 0, 0, "\0\0\0\0\0\0\0\x40{}", 10, CLATTN_IO_ERR_FORMAT,
     "header length 4611686018427387904 runs past the end"},
    {"header length 2^64-1", NULL, 0, 0, "\xff\xff\xff\xff\xff\xff\xff\xff{}", 10,
     CLATTN_IO_ERR_FORMAT, "runs past the end"},
    {"invalid JSON", "{\"t\": {\"dtype\": \"F32\",, }}", 0, 0, NULL, 0, CLATTN_IO_ERR_FORMAT,
     "not valid JSON"},
    {"empty header", "", 0, 0, NULL, 0, CLATTN_IO_ERR_FORMAT, "not valid JSON"},
    {"header cut short", "{\"t\": {\"dtype\": \"F32\"", 0, 0, NULL, 0, CLATTN_IO_ERR_FORMAT,
     "not valid JSON"},
    {"JSON array", "[1, 2, 3]", 0, 0, NULL, 0, CLATTN_IO_ERR_FORMAT, "not an object"},
    {"bytes after the JSON", "{} x", 0, 0, NULL, 0, CLATTN_IO_ERR_FORMAT, "after the JSON"},
    {"two objects", "{}{}", 0, 0, NULL, 0, CLATTN_IO_ERR_FORMAT, "after the JSON"},
    {"offsets past the end",
     "{\"in_proj_weight\": {\"dtype\": \"F32\", \"shape\": [32, 32], "
     "\"data_offsets\": [0, 4096]}}",
     1024, 0, NULL, 0, CLATTN_IO_ERR_FORMAT,
     "tensor 'in_proj_weight' data_offsets [0, 4096) end past the data section (1024 bytes)"},
    {"end before begin", ST_ONE("F32", "[1]", "[8, 4]"), 8, 0, NULL, 0, CLATTN_IO_ERR_FORMAT,
     "data_offsets [8, 4) end before they begin"},
    {"size mismatch", ST_ONE("F32", "[2, 3]", "[0, 20]"), 24, 0, NULL, 0, CLATTN_IO_ERR_FORMAT,
     "tensor 't' has shape (2, 3) of F32 (24 bytes) but data_offsets [0, 20) hold 20 bytes"},
    {"F16 size mismatch", ST_ONE("F16", "[4]", "[0, 16]"), 16, 0, NULL, 0, CLATTN_IO_ERR_FORMAT,
     "(8 bytes)"},
    {"I64 size mismatch", ST_ONE("I64", "[4]", "[0, 16]"), 16, 0, NULL, 0, CLATTN_IO_ERR_FORMAT,
     "of I64 (32 bytes)"},
    {"negative shape", ST_ONE("F32", "[-1, 3]", "[0, 0]"), 0, 0, NULL, 0, CLATTN_IO_ERR_FORMAT,
     "shape entry 0 (-1)"},
    {"fractional shape", ST_ONE("F32", "[2, 1.5]", "[0, 12]"), 12, 0, NULL, 0, CLATTN_IO_ERR_FORMAT,
     "shape entry 1 (1.5) is not an integer"},
    {"shape above 2^53", ST_ONE("F32", "[9007199254740994]", "[0, 0]"), 0, 0, NULL, 0,
     CLATTN_IO_ERR_FORMAT, "not an integer in [0, 2^53]"},
    {"shape of strings", ST_ONE("F32", "[\"2\"]", "[0, 8]"), 8, 0, NULL, 0, CLATTN_IO_ERR_FORMAT,
     "a string"},
    {"shape not an array", ST_ONE("F32", "4", "[0, 16]"), 16, 0, NULL, 0, CLATTN_IO_ERR_FORMAT,
     "no \"shape\" array"},
    {"shape product overflow", ST_ONE("F32", "[4294967296, 4294967296, 4294967296]", "[0, 0]"), 0,
     0, NULL, 0, CLATTN_IO_ERR_TOO_LARGE, "overflows"},
    {"byte size overflow", ST_ONE("F64", "[4294967296, 4294967296]", "[0, 0]"), 0, 0, NULL, 0,
     CLATTN_IO_ERR_TOO_LARGE, "overflows"},
    {"negative offset", ST_ONE("F32", "[1]", "[-4, 0]"), 4, 0, NULL, 0, CLATTN_IO_ERR_FORMAT,
     "data_offsets"},
    {"three offsets", ST_ONE("F32", "[1]", "[0, 4, 8]"), 8, 0, NULL, 0, CLATTN_IO_ERR_FORMAT,
     "two integers"},
    {"offsets not an array", ST_ONE("F32", "[1]", "{}"), 4, 0, NULL, 0, CLATTN_IO_ERR_FORMAT,
     "two integers"},
    {"missing dtype", "{\"t\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4, 0, NULL, 0,
     CLATTN_IO_ERR_FORMAT, "no \"dtype\""},
    {"dtype not a string", "{\"t\": {\"dtype\": 4, \"shape\": [1], \"data_offsets\": [0, 4]}}", 4,
     0, NULL, 0, CLATTN_IO_ERR_FORMAT, "no \"dtype\" string"},
    {"tensor not an object", "{\"t\": [1, 2]}", 0, 0, NULL, 0, CLATTN_IO_ERR_FORMAT,
     "tensor 't' is not a JSON object"},
    {"duplicate names",
     "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
     " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
     " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
     4, 0, NULL, 0, CLATTN_IO_ERR_FORMAT, "tensor name 'a' appears more than once"},
    {"control bytes in a name", "{\"a\\u0007b\": [1]}", 0, 0, NULL, 0, CLATTN_IO_ERR_FORMAT,
     "tensor 'a?b' is not a JSON object"},
    {"deep nesting", NULL, 0, 0, NULL, 0, CLATTN_IO_ERR_FORMAT, "not valid JSON"},
};

START_TEST(test_st_malformed)
{
    begin_test();
    const bad_st *bad = &bad_sts[_i];
    char path[300], msg[MSG_SIZE];
    temp_path(path, sizeof path, "bad.safetensors");
    bytes file = {0};
    if (strcmp(bad->name, "deep nesting") == 0) {
        /* 100000 nested arrays: cJSON's nesting limit must refuse them, not the stack */
        char *deep = malloc(200001);
        ck_assert(deep != NULL);
        for (int i = 0; i < 100000; ++i) {
            deep[i] = '[';
            deep[200000 - 1 - i] = ']';
        }
        deep[200000] = '\0';
        put_le(&file, 200000, 8);
        put_text(&file, deep);
        free(deep);
    } else if (bad->header == NULL) {
        put(&file, bad->raw, bad->raw_length);
    } else {
        put_le(&file, (uint64_t)((int64_t)strlen(bad->header) + bad->length_fix), 8);
        put_text(&file, bad->header);
        for (size_t i = 0; i < bad->data_length; ++i)
            put(&file, "\x3f", 1);
    }
    write_file(path, file.data, file.length);
    bytes_free(&file);
    static char sentinel;
    clattn_safetensors *st = (clattn_safetensors *)&sentinel; /* must be reset to NULL */
    clattn_io_status status = clattn_safetensors_open(path, &st, msg, MSG_SIZE);
    expect_status(bad->name, status, bad->want, msg, path, bad->needle);
    expect(st == NULL, "%s: out not NULL on error", bad->name);
    if (status == CLATTN_IO_OK)
        clattn_safetensors_close(st);
    remove(path);
    END_CHECKS();
}
END_TEST

START_TEST(test_st_limits)
{
    begin_test();
    char path[300], msg[MSG_SIZE];
    clattn_safetensors *file = NULL;
    temp_path(path, sizeof path, "missing.safetensors");
    clattn_io_status status = clattn_safetensors_open(path, &file, msg, MSG_SIZE);
    expect_status("missing file", status, CLATTN_IO_ERR_OPEN, msg, path, "cannot open");

    /* a header over 100 MiB that the file really holds (sparse): TOO_LARGE, before reading */
    temp_path(path, sizeof path, "huge_header.safetensors");
    uint64_t header_length = ((uint64_t)100 << 20) + 1;
    bytes head = {0};
    put_le(&head, header_length, 8);
    put_text(&head, "{");
    write_file(path, head.data, head.length);
    bytes_free(&head);
    ck_assert_msg(truncate(path, (off_t)(8 + header_length)) == 0, "truncate %s", path);
    status = clattn_safetensors_open(path, &file, msg, MSG_SIZE);
    expect_status("100 MiB header", status, CLATTN_IO_ERR_TOO_LARGE, msg, path, "100 MiB");
    remove(path);

    /* a file truncated after open: the read fails cleanly */
    temp_path(path, sizeof path, "shrinks.safetensors");
    write_mixed_safetensors(path);
    status = clattn_safetensors_open(path, &file, msg, MSG_SIZE);
    if (expect_status("open before truncation", status, CLATTN_IO_OK, msg, path, NULL)) {
        size_t length = 0;
        unsigned char *raw = read_file(path, &length);
        free(raw);
        ck_assert_msg(truncate(path, (off_t)(length - 60)) == 0, "truncate %s", path);
        clattn_array array;
        status = clattn_safetensors_read(file, "half", &array, msg, MSG_SIZE);
        expect_status("read after truncation", status, CLATTN_IO_ERR_FORMAT, msg, path,
                      "file ends inside the data");
        expect(array.data == NULL, "truncated read left data");
        clattn_safetensors_close(file);
    }
    remove(path);

    /* a file of many tensors: lookup stays right (sorted index), header order kept */
    temp_path(path, sizeof path, "many.safetensors");
    bytes header = {0}, data = {0};
    put_text(&header, "{");
    const int tensors = 2000;
    for (int i = 0; i < tensors; ++i) {
        char entry[160];
        int name = (i * 7919) % tensors; /* names out of order */
        snprintf(entry, sizeof entry,
                 "%s\"t%d\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [%d, %d]}",
                 i ? ", " : "", name, 4 * i, 4 * i + 4);
        put_text(&header, entry);
        put_f32(&data, (float)name);
    }
    put_text(&header, "}");
    put(&header, "", 1);
    write_safetensors(path, (const char *)header.data, data.data, data.length);
    bytes_free(&header);
    bytes_free(&data);
    status = clattn_safetensors_open(path, &file, msg, MSG_SIZE);
    if (expect_status("many tensors", status, CLATTN_IO_OK, msg, path, NULL)) {
        expect(clattn_safetensors_count(file) == (size_t)tensors, "many: count");
        const char *second = clattn_safetensors_name(file, 1);
        expect(second != NULL && strcmp(second, "t7919") != 0 && strcmp(second, "t1919") == 0,
               "many: header order, name 1 is %s", second ? second : "NULL");
        for (int name = 0; name < tensors; name += 97) {
            char key[16];
            snprintf(key, sizeof key, "t%d", name);
            clattn_array array;
            status = clattn_safetensors_read(file, key, &array, msg, MSG_SIZE);
            if (expect_status(key, status, CLATTN_IO_OK, msg, path, NULL))
                expect(array.count == 1 && array.data[0] == (float)name, "many: %s", key);
            clattn_array_free(&array);
        }
        clattn_safetensors_close(file);
    }
    remove(path);
    END_CHECKS();
}
END_TEST

/* --- fuzz-ish: truncations, byte flips, random bytes ------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static uint64_t next_random(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static int try_npy(const char *path, const unsigned char *raw, size_t length)
{
    char msg[MSG_SIZE];
    clattn_array array;
    write_file(path, raw, length);
    clattn_io_status status = clattn_npy_read(path, &array, msg, MSG_SIZE);
    if (status == CLATTN_IO_OK)
        expect_consistent("fuzzed .npy", &array);
    else
        expect(starts_with(msg, path) && array.data == NULL, "fuzzed .npy: %s", msg);
    clattn_array_free(&array);
    return status == CLATTN_IO_OK;
}

static int try_safetensors(const char *path, const unsigned char *raw, size_t length)
{
    char msg[MSG_SIZE];
    clattn_safetensors *file = NULL;
    write_file(path, raw, length);
    clattn_io_status status = clattn_safetensors_open(path, &file, msg, MSG_SIZE);
    if (status != CLATTN_IO_OK) {
        expect(starts_with(msg, path) && file == NULL, "fuzzed safetensors: %s", msg);
        return 0;
    }
    for (size_t i = 0; i < clattn_safetensors_count(file); ++i) {
        clattn_array array;
        const char *name = clattn_safetensors_name(file, i);
        expect(name != NULL && clattn_safetensors_has(file, name), "fuzzed: name %zu", i);
        status = clattn_safetensors_read(file, name, &array, msg, MSG_SIZE);
        if (status == CLATTN_IO_OK)
            expect_consistent("fuzzed safetensors tensor", &array);
        else
            expect(starts_with(msg, path), "fuzzed read: %s", msg);
        clattn_array_free(&array);
    }
    clattn_safetensors_close(file);
    return 1;
}

typedef int (*try_fn)(const char *path, const unsigned char *raw, size_t length);

/* Every truncation must fail; flips and random bytes in the first `header_end` bytes must give
 * a status (and a consistent array when OK). */
static void fuzz_file(const char *name, const char *path, unsigned char *raw, size_t length,
                      size_t header_end, try_fn attempt)
{
    expect(attempt(path, raw, length), "%s: the valid file does not read", name);
    for (size_t cut = 0; cut < length; ++cut)
        expect(!attempt(path, raw, cut), "%s: truncated to %zu bytes but read OK", name, cut);
    static const unsigned char masks[] = {0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0xff};
    for (size_t at = 0; at < header_end && at < length; ++at) {
        for (int m = 0; m < COUNT_OF(masks); ++m) {
            raw[at] ^= masks[m];
            attempt(path, raw, length);
            raw[at] ^= masks[m];
        }
    }
    unsigned char *copy = malloc(length);
    ck_assert(copy != NULL);
    for (int round = 0; round < 1500; ++round) {
        memcpy(copy, raw, length);
        int changes = 1 + (int)(next_random() % 4);
        for (int c = 0; c < changes; ++c) {
            size_t at = (size_t)(next_random() % header_end);
            const char *interesting = "0123456789-.,:[]{}()'\" eEx";
            size_t pick = (size_t)(next_random() % strlen(interesting));
            copy[at] =
                next_random() % 2 ? (unsigned char)next_random() : (unsigned char)interesting[pick];
        }
        attempt(path, copy, length);
    }
    free(copy);
}

START_TEST(test_fuzz_npy)
{
    begin_test();
    char path[300], header[256];
    temp_path(path, sizeof path, "fuzz.npy");
    for (int major = 1; major <= 2; ++major) {
        bytes file = {0};
        npy_dict(header, sizeof header, "<f4", "False", "(2, 3)", major);
        put_npy_header(&file, major, header);
        size_t header_end = file.length;
        for (int i = 0; i < 6; ++i)
            put_f32(&file, (float)i);
        fuzz_file(major == 1 ? "npy v1" : "npy v2", path, file.data, file.length, header_end,
                  try_npy);
        bytes_free(&file);
    }
    remove(path);
    END_CHECKS();
}
END_TEST

START_TEST(test_fuzz_safetensors)
{
    begin_test();
    char path[300];
    temp_path(path, sizeof path, "fuzz.safetensors");
    bytes data = {0}, file = {0};
    for (int i = 0; i < 6; ++i)
        put_f32(&data, (float)i);
    for (int i = 0; i < 4; ++i)
        put_le(&data, f16_bits[i], 2);
    for (int i = 0; i < 2; ++i)
        put_le(&data, bf16_bits[i], 2);
    const char *header = "{\"__metadata__\":{\"a\":\"b\"},"
                         "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                         "\"h\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                         "\"b\":{\"dtype\":\"BF16\",\"shape\":[1,2],\"data_offsets\":[32,36]}}";
    put_le(&file, strlen(header), 8);
    put_text(&file, header);
    size_t header_end = file.length;
    put(&file, data.data, data.length);
    fuzz_file("safetensors", path, file.data, file.length, header_end, try_safetensors);
    bytes_free(&data);
    bytes_free(&file);
    remove(path);
    END_CHECKS();
}
END_TEST

/* --- PNG heatmaps -------------------------------------------------------------------------- */

/* The layout documented in io_png.c, recomputed here independently. */
typedef struct png_layout {
    size_t width, height, cell, factor, map_w, map_h, gutter, block_w, block_h;
    size_t bar_x, bar_y, bar_h;
} png_layout;

static size_t text_width(size_t chars)
{
    return chars * 12 - 2;
}

static size_t digits(size_t value)
{
    size_t count = 1;
    for (; value >= 10; value /= 10)
        ++count;
    return count;
}

static size_t larger(size_t a, size_t b)
{
    return a > b ? a : b;
}

/* value_chars: the colour bar's label ("weight" for GLOBAL, "weight / row max" for ROW). */
static png_layout expected_layout_labelled(size_t heads, size_t rows, size_t cols,
                                           size_t value_chars)
{
    png_layout layout;
    size_t longest = larger(rows, cols);
    if (longest <= 512) {
        layout.factor = 1;
        layout.cell = longest < 128 ? (128 + longest - 1) / longest : 1;
        layout.map_w = cols * layout.cell;
        layout.map_h = rows * layout.cell;
    } else {
        layout.cell = 1;
        layout.factor = (longest + 511) / 512;
        layout.map_w = (cols + layout.factor - 1) / layout.factor;
        layout.map_h = (rows + layout.factor - 1) / layout.factor;
    }
    size_t area_h = larger(layout.map_h, text_width(5));
    layout.gutter = 18 + 6 + text_width(digits(rows - 1)) + 2 + 4 + 1;
    size_t content_w = larger(layout.map_w + 1 + text_width(digits(cols - 1)) / 2,
                              larger(text_width(5 + digits(heads - 1)), text_width(3)));
    layout.block_w = layout.gutter + content_w;
    layout.block_h = 18 + 8 + area_h + 1 + 4 + 2 + 18 + 6 + 18;
    size_t per_row = heads < 4 ? heads : 4;
    size_t grid_rows = (heads + 3) / 4;
    layout.bar_x = 16 + per_row * layout.block_w + (per_row - 1) * 24 + 24;
    layout.bar_y = 16 + 18 + 8;
    layout.bar_h = area_h;
    layout.width =
        layout.bar_x + larger(16 + 1 + 4 + 2 + text_width(8), text_width(value_chars)) + 16;
    layout.height = 32 + grid_rows * layout.block_h + (grid_rows - 1) * 24;
    if (layout.factor > 1) { /* the pooling, stated on a line of its own at the bottom */
        char footer[200];
        snprintf(footer, sizeof footer,
                 "max-pooled: %zu x %zu cells shown as %zu x %zu pixels, each the max of %zu x "
                 "%zu cells",
                 rows, cols, layout.map_h, layout.map_w, layout.factor, layout.factor);
        layout.width = larger(layout.width, 32 + text_width(strlen(footer)));
        layout.height += 18 + 12;
    }
    return layout;
}

/* The linear (GLOBAL) scale's layout: its bar says "weight". */
static png_layout expected_layout(size_t heads, size_t rows, size_t cols)
{
    return expected_layout_labelled(heads, rows, cols, 6);
}

static const clattn_heatmap_options global_scale = {.scale = CLATTN_HEATMAP_GLOBAL};

/* Top-left pixel of head h's map. */
static void map_origin(const png_layout *layout, size_t head, size_t *x, size_t *y)
{
    *x = 16 + (head % 4) * (layout->block_w + 24) + layout->gutter;
    *y = 16 + (head / 4) * (layout->block_h + 24) + 18 + 8;
}

/* A pixel showing cell (row, col) of head h. */
static void cell_pixel(const png_layout *layout, size_t head, size_t row, size_t col, size_t *x,
                       size_t *y)
{
    map_origin(layout, head, x, y);
    if (layout->factor == 1) {
        *x += col * layout->cell + layout->cell / 2;
        *y += row * layout->cell + layout->cell / 2;
    } else {
        *x += col / layout->factor;
        *y += row / layout->factor;
    }
}

typedef struct png_pixels {
    uint32_t width, height;
    int bit_depth, colour_type;
    unsigned char *rgb;
} png_pixels;

/* Reads the IHDR fields from the bytes, then the pixels as 8-bit RGB through libpng. */
static int load_png(const char *path, png_pixels *pixels)
{
    memset(pixels, 0, sizeof *pixels);
    size_t length = 0;
    unsigned char *raw = read_file(path, &length);
    if (!expect(raw != NULL && length > 33, "%s: no PNG written", path)) {
        free(raw);
        return 0;
    }
    int ok = expect(memcmp(raw, "\x89PNG\r\n\x1a\n", 8) == 0 && memcmp(raw + 12, "IHDR", 4) == 0,
                    "%s: not a PNG", path);
    pixels->width =
        (uint32_t)raw[16] << 24 | (uint32_t)raw[17] << 16 | (uint32_t)raw[18] << 8 | raw[19];
    pixels->height =
        (uint32_t)raw[20] << 24 | (uint32_t)raw[21] << 16 | (uint32_t)raw[22] << 8 | raw[23];
    pixels->bit_depth = raw[24];
    pixels->colour_type = raw[25];
    free(raw);
    png_image image;
    memset(&image, 0, sizeof image);
    image.version = PNG_IMAGE_VERSION;
    if (!ok ||
        !expect(png_image_begin_read_from_file(&image, path) != 0, "libpng: %s", image.message))
        return 0;
    image.format = PNG_FORMAT_RGB;
    pixels->rgb = malloc(PNG_IMAGE_SIZE(image));
    ck_assert(pixels->rgb != NULL);
    if (!expect(png_image_finish_read(&image, NULL, pixels->rgb, 0, NULL) != 0, "libpng: %s",
                image.message)) {
        png_image_free(&image);
        free(pixels->rgb);
        pixels->rgb = NULL;
        return 0;
    }
    return 1;
}

static uint32_t pixel_at(const png_pixels *pixels, size_t x, size_t y)
{
    const unsigned char *p = pixels->rgb + 3 * (y * pixels->width + x);
    return (uint32_t)p[0] << 16 | (uint32_t)p[1] << 8 | p[2];
}

typedef struct heatmap_case {
    size_t heads, rows, cols;
} heatmap_case;

static const heatmap_case heatmap_cases[] = {
    {1, 3, 3},      {2, 5, 7},    {16, 129, 65}, {1, 1, 1},     {5, 1, 9},    {3, 9, 1},
    {1, 1000, 700}, {2, 2, 1025}, {1, 513, 3},   {4, 128, 128}, {6, 40, 200},
};

START_TEST(test_png_heatmap)
{
    begin_test();
    const heatmap_case *hc = &heatmap_cases[_i];
    char path[300], msg[MSG_SIZE], what[80];
    snprintf(what, sizeof what, "heatmap (%zu, %zu, %zu)", hc->heads, hc->rows, hc->cols);
    temp_path(path, sizeof path, "heatmap.png");
    size_t per_head = hc->rows * hc->cols;
    float *weights = calloc(hc->heads * per_head, sizeof *weights);
    ck_assert(weights != NULL);
    /* cell (rows-1, 0) of every head is 1, everything else 0 (one-cell maps: head 0 is 1) */
    for (size_t h = 0; h < hc->heads; ++h) {
        if (per_head > 1 || h == 0)
            weights[h * per_head + (hc->rows - 1) * hc->cols] = 1.0f;
    }
    clattn_io_status status = clattn_png_write_heatmap_ex(path, weights, hc->heads, hc->rows,
                                                          hc->cols, &global_scale, msg, MSG_SIZE);
    png_pixels pixels;
    if (expect_status(what, status, CLATTN_IO_OK, msg, path, NULL) && load_png(path, &pixels)) {
        png_layout layout = expected_layout(hc->heads, hc->rows, hc->cols);
        expect(pixels.width == layout.width && pixels.height == layout.height,
               "%s: image %ux%u, layout says %zux%zu", what, pixels.width, pixels.height,
               layout.width, layout.height);
        expect(pixels.bit_depth == 8 && pixels.colour_type == 2,
               "%s: bit depth %d colour type %d, want 8-bit RGB (2)", what, pixels.bit_depth,
               pixels.colour_type);
        if (pixels.width == layout.width && pixels.height == layout.height) {
            uint32_t top = pixel_at(&pixels, layout.bar_x + 8, layout.bar_y);
            uint32_t bottom = pixel_at(&pixels, layout.bar_x + 8, layout.bar_y + layout.bar_h - 1);
            expect(top != bottom, "%s: colour bar ends have the same colour", what);
            expect(pixel_at(&pixels, 0, 0) == 0xffffff, "%s: margin not white", what);
            for (size_t h = 0; h < hc->heads; ++h) {
                size_t x, y;
                cell_pixel(&layout, h, hc->rows - 1, 0, &x, &y);
                uint32_t one = pixel_at(&pixels, x, y);
                if (per_head == 1) {
                    /* one-cell maps: head 0 holds 1, the others 0 */
                    expect(one == (h == 0 ? top : bottom), "%s: head %zu is %06x", what, h,
                           (unsigned)one);
                } else {
                    cell_pixel(&layout, h, 0, hc->cols - 1, &x, &y);
                    uint32_t zero = pixel_at(&pixels, x, y);
                    expect(one == top, "%s: head %zu cell of weight 1 is %06x, bar top %06x", what,
                           h, (unsigned)one, (unsigned)top);
                    expect(zero == bottom, "%s: head %zu cell of weight 0 is %06x, bar bottom %06x",
                           what, h, (unsigned)zero, (unsigned)bottom);
                    expect(zero != one, "%s: head %zu weights 0 and 1 look the same", what, h);
                }
                /* the title "head h" is drawn in dark ink above the map */
                size_t map_x, map_y, dark = 0;
                map_origin(&layout, h, &map_x, &map_y);
                for (size_t ty = map_y - 26; ty < map_y - 8; ++ty) {
                    for (size_t tx = map_x; tx < map_x + larger(layout.map_w, 84); ++tx)
                        dark += pixel_at(&pixels, tx, ty) == 0x202020;
                }
                expect(dark > 20, "%s: head %zu has no title ink (%zu pixels)", what, h, dark);
            }
        }
        free(pixels.rgb);
    }
    free(weights);
    remove(path);
    END_CHECKS();
}
END_TEST

/* Values off the [0, 1] range: NaN gets its own colour; the scale runs 0..max weight. */
START_TEST(test_png_values)
{
    begin_test();
    char path[300], msg[MSG_SIZE];
    temp_path(path, sizeof path, "values.png");
    const float weights[9] = {NAN, 0.25f, 0.5f, -1.0f, INFINITY, 0.0f, 0.125f, 0.0f, 0.0f};
    clattn_io_status status =
        clattn_png_write_heatmap_ex(path, weights, 1, 3, 3, &global_scale, msg, MSG_SIZE);
    png_pixels pixels;
    if (expect_status("values", status, CLATTN_IO_OK, msg, path, NULL) && load_png(path, &pixels)) {
        png_layout layout = expected_layout(1, 3, 3);
        uint32_t colour[9];
        for (size_t i = 0; i < 9; ++i) {
            size_t x, y;
            cell_pixel(&layout, 0, i / 3, i % 3, &x, &y);
            colour[i] = pixel_at(&pixels, x, y);
        }
        uint32_t top = pixel_at(&pixels, layout.bar_x + 8, layout.bar_y);
        uint32_t bottom = pixel_at(&pixels, layout.bar_x + 8, layout.bar_y + layout.bar_h - 1);
        expect(colour[2] == top, "largest finite weight (0.5) is not the top of the scale");
        expect(colour[4] == top, "+inf is not clamped to the top");
        expect(colour[3] == bottom && colour[5] == bottom, "-1 and 0 are not the bottom");
        expect(colour[0] != top && colour[0] != bottom && colour[0] != colour[1],
               "NaN has no colour of its own");
        expect(colour[1] != colour[6] && colour[1] != top && colour[6] != bottom,
               "0.25 and 0.125 are not distinct shades");
        free(pixels.rgb);
    }
    /* all zero: a scale of 0..1 is used, so the map is the bottom colour */
    const float zeros[4] = {0, 0, 0, 0};
    status = clattn_png_write_heatmap_ex(path, zeros, 1, 2, 2, &global_scale, msg, MSG_SIZE);
    if (expect_status("zeros", status, CLATTN_IO_OK, msg, path, NULL) && load_png(path, &pixels)) {
        png_layout layout = expected_layout(1, 2, 2);
        size_t x, y;
        cell_pixel(&layout, 0, 1, 1, &x, &y);
        uint32_t bottom = pixel_at(&pixels, layout.bar_x + 8, layout.bar_y + layout.bar_h - 1);
        expect(pixel_at(&pixels, x, y) == bottom, "zero map is not the bottom colour");
        free(pixels.rgb);
    }
    remove(path);
    END_CHECKS();
}
END_TEST

/* The default per-row scale, the log scale and masked cells, pixel by pixel: a row's largest
 * visible weight is the top of the bar whatever its size; masked cells are grey (176) and do
 * not count towards the row's largest; log10 weights run from 1e-4 (bottom) to 1 (top). */
START_TEST(test_png_row_log_masked)
{
    begin_test();
    char path[300], msg[MSG_SIZE];
    temp_path(path, sizeof path, "scales.png");
    const float weights[9] = {1.0f, 0.5f, 5.0f, 0.02f, 0.01f, 0.0f, 1e-4f, 0.01f, 1.0f};
    const unsigned char masked[9] = {0, 0, 1, 0, 0, 0, 0, 0, 0};
    const clattn_heatmap_options row = {.masked = masked};
    png_pixels pixels;
    clattn_io_status status = clattn_png_write_heatmap_ex(path, weights, 1, 3, 3, &row, msg, MSG_SIZE);
    if (expect_status("row scale", status, CLATTN_IO_OK, msg, path, NULL) &&
        load_png(path, &pixels)) {
        png_layout layout = expected_layout_labelled(1, 3, 3, strlen("weight / row max"));
        expect(pixels.width == layout.width && pixels.height == layout.height,
               "row scale: image %ux%u, layout says %zux%zu", pixels.width, pixels.height,
               layout.width, layout.height);
        uint32_t colour[9];
        for (size_t i = 0; i < 9; ++i) {
            size_t x, y;
            cell_pixel(&layout, 0, i / 3, i % 3, &x, &y);
            colour[i] = pixel_at(&pixels, x, y);
        }
        uint32_t top = pixel_at(&pixels, layout.bar_x + 8, layout.bar_y);
        uint32_t bottom = pixel_at(&pixels, layout.bar_x + 8, layout.bar_y + layout.bar_h - 1);
        expect(colour[2] == 0xb0b0b0, "the masked cell is %06x, not grey", (unsigned)colour[2]);
        expect(colour[0] == top && colour[3] == top && colour[8] == top,
               "each row's largest visible weight is not the top (%06x %06x %06x, top %06x)",
               (unsigned)colour[0], (unsigned)colour[3], (unsigned)colour[8], (unsigned)top);
        expect(colour[1] == colour[4] && colour[1] != top && colour[1] != bottom,
               "half of the row's largest differs between rows 0 and 1");
        expect(colour[5] == bottom, "a zero is not the bottom");
        free(pixels.rgb);
    }
    const clattn_heatmap_options log_scale = {.scale = CLATTN_HEATMAP_LOG};
    status = clattn_png_write_heatmap_ex(path, weights, 1, 3, 3, &log_scale, msg, MSG_SIZE);
    if (expect_status("log scale", status, CLATTN_IO_OK, msg, path, NULL) &&
        load_png(path, &pixels)) {
        png_layout layout = expected_layout_labelled(1, 3, 3, strlen("log10 weight"));
        size_t x, y;
        uint32_t top = pixel_at(&pixels, layout.bar_x + 8, layout.bar_y);
        uint32_t bottom = pixel_at(&pixels, layout.bar_x + 8, layout.bar_y + layout.bar_h - 1);
        uint32_t middle = pixel_at(&pixels, layout.bar_x + 8, layout.bar_y + (layout.bar_h - 1) / 2);
        cell_pixel(&layout, 0, 0, 0, &x, &y);
        expect(pixel_at(&pixels, x, y) == top, "log: 1 is not the top");
        cell_pixel(&layout, 0, 2, 0, &x, &y);
        expect(pixel_at(&pixels, x, y) == bottom, "log: 1e-4 is not the bottom");
        cell_pixel(&layout, 0, 1, 1, &x, &y);
        const uint32_t hundredth = pixel_at(&pixels, x, y);
        expect(hundredth != top && hundredth != bottom && (hundredth >> 16) <= (middle >> 16) + 8,
               "log: 0.01 is %06x, the bar's middle %06x", (unsigned)hundredth, (unsigned)middle);
        free(pixels.rgb);
    }
    remove(path);
    END_CHECKS();
}
END_TEST

START_TEST(test_png_limits)
{
    begin_test();
    char path[300], msg[MSG_SIZE];
    temp_path(path, sizeof path, "limit.png");
    float small[9] = {0};
    /* the largest number of 3x3 heads that fits 16384 rows, and one row of blocks more */
    png_layout one = expected_layout(1, 3, 3);
    size_t grid_rows = (16384 - 32 + 24) / (one.block_h + 24);
    size_t fit = grid_rows * 4, over = fit + 1;
    float *weights = calloc(over * 9, sizeof *weights);
    ck_assert(weights != NULL);
    clattn_io_status status = clattn_png_write_heatmap(path, weights, over, 3, 3, msg, MSG_SIZE);
    expect_status("one block row too many", status, CLATTN_IO_ERR_TOO_LARGE, msg, path,
                  "limit is 16384 x 16384");
    expect(!file_exists(path), "a refused image left a file");
    status = clattn_png_write_heatmap(path, weights, fit, 3, 3, msg, MSG_SIZE);
    png_pixels pixels;
    if (expect_status("as many heads as fit", status, CLATTN_IO_OK, msg, path, NULL) &&
        load_png(path, &pixels)) {
        png_layout layout = expected_layout(fit, 3, 3);
        expect(pixels.height == layout.height && pixels.height <= 16384,
               "tall image: height %u want %zu", pixels.height, layout.height);
        free(pixels.rgb);
    }
    free(weights);
    remove(path);

    /* sizes whose product overflows are refused without touching the (small) buffer */
    status = clattn_png_write_heatmap(path, small, SIZE_MAX / 2, 3, 3, msg, MSG_SIZE);
    expect_status("heads overflow", status, CLATTN_IO_ERR_TOO_LARGE, msg, path, "overflow");
    status = clattn_png_write_heatmap(path, small, 1, SIZE_MAX / 2, SIZE_MAX / 2, msg, MSG_SIZE);
    expect_status("rows x cols overflow", status, CLATTN_IO_ERR_TOO_LARGE, msg, path, NULL);
    status = clattn_png_write_heatmap(path, small, SIZE_MAX / 64, 2, 2, msg, MSG_SIZE);
    expect_status("many heads", status, CLATTN_IO_ERR_TOO_LARGE, msg, path, "limit");
    expect(!file_exists(path), "a refused image left a file");

    status = clattn_png_write_heatmap(path, small, 0, 3, 3, msg, MSG_SIZE);
    expect_status("zero heads", status, CLATTN_IO_ERR_ARGUMENT, msg, path, NULL);
    status = clattn_png_write_heatmap(path, small, 1, 0, 3, msg, MSG_SIZE);
    expect_status("zero rows", status, CLATTN_IO_ERR_ARGUMENT, msg, path, NULL);
    status = clattn_png_write_heatmap(path, NULL, 1, 3, 3, msg, MSG_SIZE);
    expect_status("NULL weights", status, CLATTN_IO_ERR_ARGUMENT, msg, path, NULL);
    status = clattn_png_write_heatmap(NULL, small, 1, 3, 3, msg, MSG_SIZE);
    expect(status == CLATTN_IO_ERR_ARGUMENT, "NULL path: %s", clattn_io_status_string(status));
    char missing_dir[300];
    temp_path(missing_dir, sizeof missing_dir, "no_such_dir/out.png");
    status = clattn_png_write_heatmap(missing_dir, small, 1, 3, 3, msg, MSG_SIZE);
    expect_status("missing directory", status, CLATTN_IO_ERR_OPEN, msg, missing_dir, "cannot");
    END_CHECKS();
}
END_TEST

START_TEST(test_status_strings)
{
    begin_test();
    const clattn_io_status statuses[] = {
        CLATTN_IO_OK,
        CLATTN_IO_ERR_OPEN,
        CLATTN_IO_ERR_FORMAT,
        CLATTN_IO_ERR_UNSUPPORTED,
        CLATTN_IO_ERR_TOO_LARGE,
        CLATTN_IO_ERR_MEMORY,
        CLATTN_IO_ERR_NOT_FOUND,
        CLATTN_IO_ERR_ARGUMENT,
    };
    const char *names[] = {"CLATTN_IO_OK",
                           "CLATTN_IO_ERR_OPEN",
                           "CLATTN_IO_ERR_FORMAT",
                           "CLATTN_IO_ERR_UNSUPPORTED",
                           "CLATTN_IO_ERR_TOO_LARGE",
                           "CLATTN_IO_ERR_MEMORY",
                           "CLATTN_IO_ERR_NOT_FOUND",
                           "CLATTN_IO_ERR_ARGUMENT"};
    for (int i = 0; i < COUNT_OF(statuses); ++i)
        expect(strcmp(clattn_io_status_string(statuses[i]), names[i]) == 0, "%s is named %s",
               names[i], clattn_io_status_string(statuses[i]));
    expect(strcmp(clattn_io_status_string((clattn_io_status)99), "CLATTN_IO_UNKNOWN_STATUS") == 0,
           "unknown status name");
    END_CHECKS();
}
END_TEST

static Suite *io_suite(void)
{
    Suite *suite = suite_create("io");
    TCase *npy = tcase_create("npy");
    tcase_add_loop_test(npy, test_npy_round_trip, 0, COUNT_OF(round_trip_shapes));
    tcase_add_test(npy, test_npy_dtypes);
    tcase_add_loop_test(npy, test_npy_header_variants, 0, COUNT_OF(header_cases));
    tcase_add_loop_test(npy, test_npy_malformed, 0, COUNT_OF(bad_npys));
    tcase_add_test(npy, test_npy_open_errors);
    tcase_add_test(npy, test_npy_write_errors);
    tcase_add_test(npy, test_npy_write_typed);
    tcase_add_test(npy, test_npy_numpy_files);
    suite_add_tcase(suite, npy);

    TCase *st = tcase_create("safetensors");
    tcase_add_test(st, test_st_read);
    tcase_add_test(st, test_st_fixture);
    tcase_add_loop_test(st, test_st_malformed, 0, COUNT_OF(bad_sts));
    tcase_add_test(st, test_st_limits);
    suite_add_tcase(suite, st);

    TCase *fuzz = tcase_create("fuzz");
    tcase_set_timeout(fuzz, 300);
    tcase_add_test(fuzz, test_fuzz_npy);
    tcase_add_test(fuzz, test_fuzz_safetensors);
    suite_add_tcase(suite, fuzz);

    TCase *png = tcase_create("png");
    tcase_set_timeout(png, 300);
    tcase_add_loop_test(png, test_png_heatmap, 0, COUNT_OF(heatmap_cases));
    tcase_add_test(png, test_png_values);
    tcase_add_test(png, test_png_row_log_masked);
    tcase_add_test(png, test_png_limits);
    tcase_add_test(png, test_status_strings);
    suite_add_tcase(suite, png);
    return suite;
}

/* Removes what failed tests may have left, then the directory. */
static void remove_temp_dir(void)
{
    DIR *dir = opendir(temp_dir);
    if (dir != NULL) {
        struct dirent *entry;
        while ((entry = readdir(dir)) != NULL) {
            if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0)
                continue;
            char path[600];
            snprintf(path, sizeof path, "%s/%s", temp_dir, entry->d_name);
            remove(path);
        }
        closedir(dir);
    }
    rmdir(temp_dir);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        fixture_dir = argv[1];
    const char *base = getenv("TMPDIR");
    snprintf(temp_dir, sizeof temp_dir, "%s/check_io_XXXXXX",
             base != NULL && base[0] != '\0' ? base : "/tmp");
    if (mkdtemp(temp_dir) == NULL) {
        fprintf(stderr, "check_io: cannot create a temporary directory under %s\n",
                base ? base : "/tmp");
        return 1;
    }
    printf("check_io: files in %s, numpy fixtures from %s\n", temp_dir, fixture_dir);
    SRunner *runner = srunner_create(io_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    remove_temp_dir();
    return failed == 0 ? 0 : 1;
}
