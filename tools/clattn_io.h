/*
 * clattn_io: the file formats of the clattn command, usable by C callers too (library
 * `clattn_io`, installed with clattn): .npy read/write, safetensors read, PNG heatmaps of
 * attention weights.
 *
 * Every reader checks each size it is told by a file against the file's real length before it
 * allocates, so a malformed, truncated or hostile file gives a status and a message (what was
 * expected, what was found), never a crash or an oversized allocation. Functions write their
 * message to `msg` (at most msg_size bytes, NUL-terminated, "" on success; msg may be NULL).
 * On error, outputs are zeroed (*out NULL for safetensors); an array's data is never NULL after
 * success, even when count is 0.
 * Thread safety: distinct objects may be used from distinct threads; one clattn_safetensors
 * shares one file handle, so read from it on one thread at a time.
 */
#ifndef CLATTN_IO_H
#define CLATTN_IO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && !defined(_WIN32)
#define CLATTN_IO_API __attribute__((visibility("default")))
#else
#define CLATTN_IO_API
#endif

typedef enum clattn_io_status {
    CLATTN_IO_OK = 0,
    CLATTN_IO_ERR_OPEN = 1,        /* cannot open / read / create the file */
    CLATTN_IO_ERR_FORMAT = 2,      /* malformed: bad magic, header, truncated, offsets past end */
    CLATTN_IO_ERR_UNSUPPORTED = 3, /* well-formed but not supported: dtype, Fortran order, ... */
    CLATTN_IO_ERR_TOO_LARGE = 4,   /* a size overflows, or exceeds a documented limit */
    CLATTN_IO_ERR_MEMORY = 5,      /* malloc failed */
    CLATTN_IO_ERR_NOT_FOUND = 6,   /* safetensors: no tensor of that name */
    CLATTN_IO_ERR_ARGUMENT = 7     /* NULL or inconsistent argument */
} clattn_io_status;

CLATTN_IO_API const char *clattn_io_status_string(clattn_io_status status);

#define CLATTN_IO_MAX_DIMS 8

/* Where an array's values came from. */
typedef enum clattn_io_dtype {
    CLATTN_IO_F32 = 0,  /* float32, float64 (converted); safetensors' F16, BF16 and F64 too */
    CLATTN_IO_BOOL = 1, /* bool or uint8 (values are 0.0f / 1.0f, or the byte value for uint8) */
    CLATTN_IO_F16 = 2,  /* .npy float16 ('<f2'), converted exactly */
    CLATTN_IO_BF16 = 3, /* .npy bfloat16 (ml_dtypes saves it as 2-byte void, '<V2'), exactly */
    CLATTN_IO_INT = 4   /* .npy int64 / int32 ('<i8', '<i4'): exact up to 2^24 in magnitude,
                         * rounded to float beyond */
} clattn_io_dtype;

/* A dense C-order array of float32 values. */
typedef struct clattn_array {
    int ndim;                       /* 0 (scalar) .. CLATTN_IO_MAX_DIMS */
    size_t shape[CLATTN_IO_MAX_DIMS];
    size_t count;                   /* product of shape (1 for a scalar) */
    clattn_io_dtype source;         /* the dtype in the file */
    float *data;                    /* malloc'd, count floats; free with clattn_array_free */
} clattn_array;

/* Frees data and zeroes the struct. NULL is a no-op. */
CLATTN_IO_API void clattn_array_free(clattn_array *array);

/* float32 values as IEEE half (dtype CLATTN_IO_F16) or bfloat16 (CLATTN_IO_BF16) bits,
 * rounded to nearest even, as the .npy writer stores them (NaN stays a quiet NaN, overflow
 * gives inf); and those bits back to float32, exactly. Other dtypes: nothing is written. */
CLATTN_IO_API void clattn_io_round16(const float *src, size_t count, clattn_io_dtype dtype,
                                     uint16_t *dst);
CLATTN_IO_API void clattn_io_widen16(const uint16_t *src, size_t count, clattn_io_dtype dtype,
                                     float *dst);

/* --- .npy (format versions 1.0, 2.0, 3.0) ------------------------------------------------ */

/* Reads little-endian, C-order float32 ('<f4'), float64 ('<f8', converted), float16 ('<f2',
 * converted exactly), bfloat16 ('<V2' or '|V2': how numpy saves ml_dtypes.bfloat16; exactly),
 * int64 / int32 ('<i8', '<i4'), bool ('|b1') or uint8 ('|u1') arrays. Fortran order, big-endian,
 * other dtypes, object arrays: UNSUPPORTED, with a message saying what was found. Limit: the data
 * must match the file's remaining length exactly (FORMAT otherwise); header at most 1 MiB. */
CLATTN_IO_API clattn_io_status clattn_npy_read(const char *path, clattn_array *out, char *msg,
                                               size_t msg_size);

/* Writes count = product(shape) float32 values as a version 1.0 '<f4' C-order .npy. */
CLATTN_IO_API clattn_io_status clattn_npy_write(const char *path, const float *data, int ndim,
                                                const size_t *shape, char *msg, size_t msg_size);

/* Writes count = product(shape) float32 values as a version 1.0 C-order .npy of `dtype`:
 * CLATTN_IO_F32 ('<f4', as clattn_npy_write), CLATTN_IO_F16 ('<f2', IEEE half: round to nearest
 * even, overflow to +-inf (from 65520 on), subnormals kept, NaN stays NaN) or CLATTN_IO_BF16
 * ('<V2', as numpy saves ml_dtypes.bfloat16: round to nearest even, NaN stays NaN). Other
 * dtypes: ARGUMENT. Together with clattn_array.source, writes an output in an input's dtype. */
CLATTN_IO_API clattn_io_status clattn_npy_write_typed(const char *path, const float *data, int ndim,
                                                      const size_t *shape, clattn_io_dtype dtype,
                                                      char *msg, size_t msg_size);

/* --- safetensors ------------------------------------------------------------------------- */

typedef struct clattn_safetensors clattn_safetensors;

/* Opens a .safetensors file and parses its JSON header (with libcjson). Every tensor's dtype,
 * shape and data_offsets are validated against each other and the file length at open:
 * offsets inside the data section, end - begin == product(shape) * dtype size, no overflow.
 * Header length at most 100 MiB. Tensors of dtypes other than F32/F16/BF16/F64 are allowed in
 * the file but cannot be read (UNSUPPORTED from clattn_safetensors_read). */
CLATTN_IO_API clattn_io_status clattn_safetensors_open(const char *path,
                                                       clattn_safetensors **out, char *msg,
                                                       size_t msg_size);
CLATTN_IO_API void clattn_safetensors_close(clattn_safetensors *file); /* NULL: no-op */

CLATTN_IO_API size_t clattn_safetensors_count(const clattn_safetensors *file);
/* Name of tensor i (0 <= i < count), in header order; NULL when out of range. */
CLATTN_IO_API const char *clattn_safetensors_name(const clattn_safetensors *file, size_t i);
/* 1 when a tensor of that name exists. */
CLATTN_IO_API int clattn_safetensors_has(const clattn_safetensors *file, const char *name);

/* Reads tensor `name` converted to float32 (F32, F16, BF16, F64; F64 rounded to nearest, values
 * beyond float32's range becoming +-inf, as float64 .npy). NOT_FOUND when absent. */
CLATTN_IO_API clattn_io_status clattn_safetensors_read(const clattn_safetensors *file,
                                                       const char *name, clattn_array *out,
                                                       char *msg, size_t msg_size);

/* --- PNG heatmaps ------------------------------------------------------------------------ */

/* Writes attention weights (heads, rows, cols) (row = query position, col = key position,
 * values normally in [0, 1]) as one RGB PNG: one panel per head side by side (wrapping into
 * a grid when many), each titled "head N", with labelled axes ("query" down, "key" across)
 * and tick numbers, a colour scale per row (see clattn_heatmap_scale), and a colour bar. Each cell is
 * drawn as a square of several pixels for small maps; large maps are downsampled (the maximum
 * over the cells each pixel covers). Image size is limited (TOO_LARGE past 16384 x 16384). */
CLATTN_IO_API clattn_io_status clattn_png_write_heatmap(const char *path, const float *weights,
                                                        size_t heads, size_t rows, size_t cols,
                                                        char *msg, size_t msg_size);

/* How a heatmap maps weights to colours. ROW (the default): each row divided by its own
 * largest visible weight, so every query's pattern shows however peaked row 0 is (causal
 * attention: row 0 is 1 on key 0 and would darken a global scale); LOG: log10 of the weight
 * from -4 (and below) to 0; GLOBAL: linear from 0 to the largest weight of all panels. The
 * colour bar says which. */
typedef enum clattn_heatmap_scale {
    CLATTN_HEATMAP_ROW = 0,
    CLATTN_HEATMAP_LOG = 1,
    CLATTN_HEATMAP_GLOBAL = 2
} clattn_heatmap_scale;

/* Options of clattn_png_write_heatmap_ex; zero-initialised means the defaults. */
typedef struct clattn_heatmap_options {
    clattn_heatmap_scale scale;
    /* NULL, or nonzero = masked: (rows, cols) for every panel, or (heads, rows, cols) with
     * masked_per_panel. Masked cells are drawn in their own grey (in the legend), never on the
     * ramp; a pooled pixel is grey only when every cell it covers is masked. */
    const unsigned char *masked;
    int masked_per_panel;
    /* Texts (NULL: "head", "query", "key"): panels are titled "<panel> N"; a single panel
     * with panel_title set is titled with it alone. */
    const char *panel_title, *row_label, *col_label;
    const char *value_label; /* over the colour bar (NULL: what the scale shows) */
    size_t min_panel;        /* the smallest panel side in pixels (0: 128) */
} clattn_heatmap_options;

/* clattn_png_write_heatmap with options (NULL: the defaults; clattn_png_write_heatmap is this
 * with NULL). Maps larger than 512 cells a side are max-pooled to fit, and the picture says
 * so ("max-pooled: ... cells per pixel"). */
CLATTN_IO_API clattn_io_status clattn_png_write_heatmap_ex(const char *path, const float *weights,
                                                           size_t heads, size_t rows, size_t cols,
                                                           const clattn_heatmap_options *options,
                                                           char *msg, size_t msg_size);

#ifdef __cplusplus
}
#endif

#endif /* CLATTN_IO_H */
