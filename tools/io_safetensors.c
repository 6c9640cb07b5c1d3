/* clattn_io: safetensors read. */
#include "io_internal.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

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
        return io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                       "tensor '%s' has no \"shape\" array", shown);
    int index = 0;
    size_t count = 1;
    int overflow = 0;
    for (const cJSON *entry = shape->child; entry != NULL; entry = entry->next, ++index) {
        uint64_t value;
        if (!json_size(entry, &value)) {
            char found[40];
            json_describe(entry, found, sizeof found);
            return io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                           "tensor '%s' shape entry %d (%s) is not an integer in [0, 2^53]", shown,
                           index, found);
        }
        if (value > SIZE_MAX || io_mul_overflows(count, (size_t)value, &count))
            overflow = 1;
        if (index < CLATTN_IO_MAX_DIMS)
            tensor->shape[index] = (size_t)value;
    }
    if (overflow)
        return io_fail(msg, msg_size, CLATTN_IO_ERR_TOO_LARGE, path,
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
        return io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                       "tensor '%s' \"data_offsets\" is not two integers [begin, end]", shown);
    if (tensor->end < tensor->begin)
        return io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                       "tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64 ") end before they begin",
                       shown, tensor->begin, tensor->end);
    if (tensor->end > data_length)
        return io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
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
    io_quote_name(shown, sizeof shown, item->string);
    if (!cJSON_IsObject(item))
        return io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                       "tensor '%s' is not a JSON object", shown);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    if (!cJSON_IsString(dtype) || dtype->valuestring == NULL)
        return io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                       "tensor '%s' has no \"dtype\" string", shown);
    io_quote_name(tensor->dtype, sizeof tensor->dtype, dtype->valuestring);
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
    if (io_mul_overflows(tensor->count, elem_size, &bytes))
        return io_fail(msg, msg_size, CLATTN_IO_ERR_TOO_LARGE, path,
                       "tensor '%s' byte size overflows", shown);
    if ((uint64_t)bytes != tensor->end - tensor->begin) {
        char shape_text[SHAPE_TEXT_MAX];
        io_format_shape(shape_text, sizeof shape_text,
                        tensor->ndim < CLATTN_IO_MAX_DIMS ? tensor->ndim : CLATTN_IO_MAX_DIMS,
                        tensor->shape);
        return io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                       "tensor '%s' has shape %s%s of %s (%zu bytes) but data_offsets [%" PRIu64
                       ", %" PRIu64 ") hold %" PRIu64 " bytes",
                       shown, shape_text, tensor->ndim > CLATTN_IO_MAX_DIMS ? "..." : "",
                       tensor->dtype, bytes, tensor->begin, tensor->end,
                       tensor->end - tensor->begin);
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
        return io_fail(msg, msg_size, CLATTN_IO_ERR_MEMORY, path, "out of memory for %zu tensors",
                       count);
    for (const cJSON *item = root->child; item != NULL; item = item->next) {
        if (st_is_metadata(item))
            continue;
        if (item->string == NULL)
            return io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                           "header entry without a name");
        st_tensor *tensor = &file->tensors[file->count];
        tensor->name = copy_string(item->string);
        if (tensor->name == NULL)
            return io_fail(msg, msg_size, CLATTN_IO_ERR_MEMORY, path, "out of memory");
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
            io_quote_name(shown, sizeof shown, file->by_name[i]->name);
            return io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
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
        status = io_fail(msg, msg_size, CLATTN_IO_ERR_MEMORY, path,
                         "out of memory for a %" PRIu64 "-byte header", header_length);
        goto done;
    }
    status =
        io_read_exact(file->file, text, (size_t)header_length, "the header", path, msg, msg_size);
    if (status != CLATTN_IO_OK)
        goto done;
    const char *end = NULL;
    root = cJSON_ParseWithLengthOpts(text, (size_t)header_length, &end, 0);
    if (root == NULL) {
        size_t at = end != NULL && end >= text ? (size_t)(end - text) : 0;
        status = io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                         "header is not valid JSON (error near byte %zu of %" PRIu64 ")", at,
                         header_length);
        goto done;
    }
    for (const char *at = end; at < text + header_length; ++at) {
        if (*at != ' ' && *at != '\t' && *at != '\n' && *at != '\r') {
            status = io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                             "unexpected bytes after the JSON header (at byte %zu)",
                             (size_t)(at - text));
            goto done;
        }
    }
    if (!cJSON_IsObject(root)) {
        status =
            io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path, "header is JSON but not an object");
        goto done;
    }
    status = st_load_tensors(file, root, msg, msg_size);
done:
    cJSON_Delete(root);
    free(text);
    return status;
}

/* Refuses, as "not a safetensors file", a file whose first bytes show another format (a .npy,
 * a PNG, ...) or whose header length cannot be one (past the end of the file: the first 8
 * bytes of some other file read as a number). */
static clattn_io_status st_check_kind(const unsigned char length_bytes[8], uint64_t file_size,
                                      const char *path, char *msg, size_t msg_size)
{
    const char *what = io_sniff_format(length_bytes, 8, file_size);
    if (what && strcmp(what, "a safetensors file") != 0)
        return io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                       "not a safetensors file (it is %s)", what);
    const uint64_t header_length = io_load_u64(length_bytes);
    if (header_length > file_size - 8)
        return io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                       "not a safetensors file: header length %" PRIu64
                       " runs past the end of the file (%" PRIu64 " bytes)",
                       header_length, file_size);
    return CLATTN_IO_OK;
}

clattn_io_status clattn_safetensors_open(const char *path, clattn_safetensors **out, char *msg,
                                         size_t msg_size)
{
    clattn_io_status status = CLATTN_IO_OK;
    clattn_safetensors *file = NULL;
    io_clear_message(msg, msg_size);
    if (out != NULL)
        *out = NULL;
    if (path == NULL || out == NULL) {
        status = io_fail(msg, msg_size, CLATTN_IO_ERR_ARGUMENT, path,
                         "clattn_safetensors_open: %s is NULL", path == NULL ? "path" : "out");
        goto done;
    }
    file = calloc(1, sizeof *file);
    if (file == NULL || (file->path = copy_string(path)) == NULL) {
        status = io_fail(msg, msg_size, CLATTN_IO_ERR_MEMORY, path, "out of memory");
        goto done;
    }
    uint64_t file_size = 0;
    status = io_open_input(path, &file->file, &file_size, msg, msg_size);
    if (status != CLATTN_IO_OK)
        goto done;
    unsigned char length_bytes[8];
    if (file_size < sizeof length_bytes) {
        status =
            io_fail(msg, msg_size, CLATTN_IO_ERR_FORMAT, path,
                    "file is %" PRIu64 " bytes, too short for the 8-byte header length", file_size);
        goto done;
    }
    status = io_read_exact(file->file, length_bytes, sizeof length_bytes, "the header length", path,
                           msg, msg_size);
    if (status != CLATTN_IO_OK)
        goto done;
    if ((status = st_check_kind(length_bytes, file_size, path, msg, msg_size)))
        goto done;
    uint64_t header_length = io_load_u64(length_bytes);
    if (header_length > ST_MAX_HEADER) {
        status = io_fail(msg, msg_size, CLATTN_IO_ERR_TOO_LARGE, path,
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
        io_quote_name(shown, sizeof shown, file->tensors[i].name);
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
    io_clear_message(msg, msg_size);
    if (out != NULL)
        memset(out, 0, sizeof *out);
    const char *path = file != NULL ? file->path : NULL;
    if (file == NULL || name == NULL || out == NULL) {
        status = io_fail(msg, msg_size, CLATTN_IO_ERR_ARGUMENT, path,
                         "clattn_safetensors_read: %s is NULL",
                         file == NULL   ? "file"
                         : name == NULL ? "name"
                                        : "out");
        goto done;
    }
    char shown[NAME_SHOWN_MAX + 1];
    io_quote_name(shown, sizeof shown, name);
    const st_tensor *tensor = st_find(file, name);
    if (tensor == NULL) {
        char names[512];
        st_list_names(file, names, sizeof names);
        status = io_fail(msg, msg_size, CLATTN_IO_ERR_NOT_FOUND, path, "no tensor '%s' (%s)", shown,
                         names);
        goto done;
    }
    convert_fn convert = tensor->kind == ST_F32    ? io_convert_f32
                         : tensor->kind == ST_F16  ? io_convert_f16
                         : tensor->kind == ST_BF16 ? io_convert_bf16
                         : tensor->kind == ST_F64  ? io_convert_f64 /* as float64 .npy: rounded */
                                                   : NULL;
    if (convert == NULL) {
        status = io_fail(msg, msg_size, CLATTN_IO_ERR_UNSUPPORTED, path,
                         "tensor '%s' has dtype %s: only F32, F16, BF16 and F64 can be read", shown,
                         tensor->dtype);
        goto done;
    }
    if (tensor->ndim > CLATTN_IO_MAX_DIMS) {
        status = io_fail(msg, msg_size, CLATTN_IO_ERR_UNSUPPORTED, path,
                         "tensor '%s' has %d dimensions; at most %d are supported", shown,
                         tensor->ndim, CLATTN_IO_MAX_DIMS);
        goto done;
    }
    status = io_alloc_floats(tensor->count, &array.data, path, msg, msg_size);
    if (status != CLATTN_IO_OK)
        goto done;
    if (io_seek_to(file->file, file->data_start + tensor->begin) != 0) {
        status = io_fail(msg, msg_size, CLATTN_IO_ERR_OPEN, path, "cannot seek to tensor '%s': %s",
                         shown, strerror(errno));
        goto done;
    }
    status = io_read_converted(file->file, tensor->count,
                               tensor->kind == ST_F64   ? 8
                               : tensor->kind == ST_F32 ? 4
                                                        : 2,
                               convert, array.data, path, msg, msg_size);
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
