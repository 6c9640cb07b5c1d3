/* What the clattn_io readers and writers share (tools/io_common.c): messages, shapes, file
 * reading, little-endian decoding and conversion to float32. Each format has its own file:
 * io_npy.c, io_safetensors.c, io_png.c. Never installed; the public header is clattn_io.h. */
#ifndef CLATTN_IO_INTERNAL_H
#define CLATTN_IO_INTERNAL_H

#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* fileno, fstat, fseeko */
#endif
#ifndef _FILE_OFFSET_BITS
#define _FILE_OFFSET_BITS 64 /* files over 2 GiB on 32-bit hosts */
#endif

#include "clattn_io.h"

#include <stdint.h>
#include <stdio.h>

#define NPY_MAX_HEADER ((uint64_t)1 << 20)           /* 1 MiB */
#define ST_MAX_HEADER ((uint64_t)100 << 20)          /* 100 MiB */
#define JSON_MAX_EXACT_INT 9007199254740992.0        /* 2^53: JSON numbers are doubles */
#define CHUNK_BYTES 16384                            /* conversion buffer, a multiple of 8 */
#define NAME_SHOWN_MAX 80                            /* longest tensor name quoted in a message */
#define SHAPE_TEXT_MAX (CLATTN_IO_MAX_DIMS * 22 + 4) /* "(a, b, ...)" with 20-digit entries */

typedef void (*convert_fn)(const unsigned char *src, size_t count, float *dst);

void io_clear_message(char *msg, size_t msg_size);
clattn_io_status io_fail(char *msg, size_t msg_size, clattn_io_status status, const char *path,
                         const char *format, ...);
void io_quote_name(char *dst, size_t dst_size, const char *name);
void io_format_shape(char *dst, size_t dst_size, int ndim, const size_t *shape);
int io_mul_overflows(size_t a, size_t b, size_t *product);
int io_shape_count(int ndim, const size_t *shape, size_t *count);
clattn_io_status io_open_input(const char *path, FILE **out, uint64_t *size, char *msg,
                               size_t msg_size);
int io_seek_to(FILE *file, uint64_t offset);
clattn_io_status io_read_exact(FILE *file, void *dst, size_t size, const char *what,
                               const char *path, char *msg, size_t msg_size);
/* What a file's first bytes (got of them; the file is file_size bytes) show it to be, for a
 * reader refusing it: "a .npy file", "a safetensors file", "a PNG image", "a ZIP archive (numpy's
 * .npz?)", or NULL when none of these. */
const char *io_sniff_format(const unsigned char *head, size_t got, uint64_t file_size);
uint16_t io_load_u16(const unsigned char *bytes);
uint32_t io_load_u32(const unsigned char *bytes);
uint64_t io_load_u64(const unsigned char *bytes);
void io_store_u32(unsigned char *bytes, uint32_t value);
void io_convert_f32(const unsigned char *src, size_t count, float *dst);
void io_convert_f64(const unsigned char *src, size_t count, float *dst);
void io_convert_bool(const unsigned char *src, size_t count, float *dst);
void io_convert_u8(const unsigned char *src, size_t count, float *dst);
void io_convert_f16(const unsigned char *src, size_t count, float *dst);
void io_convert_bf16(const unsigned char *src, size_t count, float *dst);
void io_convert_i64(const unsigned char *src, size_t count, float *dst);
void io_convert_i32(const unsigned char *src, size_t count, float *dst);
clattn_io_status io_read_converted(FILE *file, size_t count, size_t elem_size, convert_fn convert,
                                   float *dst, const char *path, char *msg, size_t msg_size);
clattn_io_status io_alloc_floats(size_t count, float **out, const char *path, char *msg,
                                 size_t msg_size);

#endif
