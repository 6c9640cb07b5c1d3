/*
 * libFuzzer target: the safetensors reader on arbitrary bytes.
 *
 * Each input is written to a scratch file and opened with clattn_safetensors_open; then every
 * tensor the header lists is read. Beyond "no crash, no leak, no sanitizer report", the
 * contract of clattn_io.h is checked:
 *   - open fails with a message and *out NULL, the same way again with a short message
 *     buffer and with none;
 *   - after a successful open, names 0..count-1 exist and are found by name, name(count) is
 *     NULL, and each read either succeeds with a consistent array (count == product(shape),
 *     data count floats long) or is UNSUPPORTED (dtype, rank): every offset and size was
 *     validated at open, so nothing else may fail;
 *   - reads share one file position: the first tensor read again at the end gives the same
 *     bits; a name not in the file is NOT_FOUND, also with a short message buffer.
 *
 *     fuzz_safetensors [libFuzzer options] CORPUS_DIR...      (see tests/fuzz/run.sh)
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */

#include "fuzz_common.h"

static const char *input_path;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    input_path = fuzz_scratch_file("input.safetensors");
    return 0;
}

static void check_open_error_repeatable(clattn_io_status status, size_t input_size)
{
    const size_t small_size = 1 + input_size % 24;
    char *small = fuzz_message_buffer(small_size);
    clattn_safetensors *file = NULL;
    clattn_io_status again = clattn_safetensors_open(input_path, &file, small, small_size);
    fuzz_check_terminated("safetensors open, short message buffer", small, small_size);
    if (again != status || file != NULL)
        fuzz_fail("safetensors open: %s, then %s with a %zu-byte message buffer",
                  clattn_io_status_string(status), clattn_io_status_string(again), small_size);
    free(small);
    again = clattn_safetensors_open(input_path, &file, NULL, 0);
    if (again != status || file != NULL)
        fuzz_fail("safetensors open: %s, then %s without a message buffer",
                  clattn_io_status_string(status), clattn_io_status_string(again));
}

/* Reads tensor `name`; returns its status after checking the result. */
static clattn_io_status read_tensor(const clattn_safetensors *file, const char *name,
                                    clattn_array *array, char *msg)
{
    clattn_io_status status = clattn_safetensors_read(file, name, array, msg, FUZZ_MSG_SIZE);
    fuzz_check_terminated("safetensors read", msg, FUZZ_MSG_SIZE);
    fuzz_check_array("safetensors read", status, array, msg);
    if (status != CLATTN_IO_OK && status != CLATTN_IO_ERR_UNSUPPORTED)
        fuzz_fail("safetensors read of a listed tensor: %s: %s", clattn_io_status_string(status),
                  msg);
    if (status == CLATTN_IO_OK && array->source != CLATTN_IO_F32)
        fuzz_fail("safetensors read: source dtype %d, not F32", (int)array->source);
    return status;
}

/* A name the file does not have is NOT_FOUND; the message lists names, cut to fit. */
static void check_missing_name(const clattn_safetensors *file, size_t input_size)
{
    static const char missing[] = "clattn-fuzz: no such tensor";
    if (clattn_safetensors_has(file, missing))
        return;
    const size_t small_size = 1 + input_size % 40;
    char *small = fuzz_message_buffer(small_size);
    clattn_array array;
    clattn_io_status status = clattn_safetensors_read(file, missing, &array, small, small_size);
    fuzz_check_terminated("safetensors read of a missing name", small, small_size);
    if (status != CLATTN_IO_ERR_NOT_FOUND || array.data != NULL)
        fuzz_fail("safetensors read of a missing name: %s, not NOT_FOUND",
                  clattn_io_status_string(status));
    free(small);
}

static void check_tensors(const clattn_safetensors *file, char *msg, size_t input_size)
{
    const size_t count = clattn_safetensors_count(file);
    if (clattn_safetensors_name(file, count) != NULL)
        fuzz_fail("safetensors: name(%zu) is not NULL with %zu tensors", count, count);
    clattn_array first;
    memset(&first, 0, sizeof first);
    const char *first_name = NULL;
    for (size_t i = 0; i < count; ++i) {
        const char *name = clattn_safetensors_name(file, i);
        if (name == NULL)
            fuzz_fail("safetensors: name(%zu) is NULL with %zu tensors", i, count);
        if (!clattn_safetensors_has(file, name))
            fuzz_fail("safetensors: tensor %zu is listed but not found by name", i);
        clattn_array array;
        if (read_tensor(file, name, &array, msg) == CLATTN_IO_OK && first_name == NULL) {
            first = array; /* kept for the re-read below */
            first_name = name;
            continue;
        }
        clattn_array_free(&array);
    }
    if (first_name != NULL) {
        clattn_array again;
        if (read_tensor(file, first_name, &again, msg) != CLATTN_IO_OK)
            fuzz_fail("safetensors: a tensor read once fails the second time: %s", msg);
        if (again.ndim != first.ndim || again.count != first.count ||
            (first.count > 0 && memcmp(again.data, first.data, first.count * sizeof(float)) != 0))
            fuzz_fail("safetensors: a tensor read twice gives different results");
        clattn_array_free(&again);
        clattn_array_free(&first);
    }
    check_missing_name(file, input_size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_write_file(input_path, data, size);
    char *msg = fuzz_message_buffer(FUZZ_MSG_SIZE);
    clattn_safetensors *file = NULL;
    clattn_io_status status = clattn_safetensors_open(input_path, &file, msg, FUZZ_MSG_SIZE);
    fuzz_check_terminated("safetensors open", msg, FUZZ_MSG_SIZE);
    if (!fuzz_status_known(status))
        fuzz_fail("safetensors open: unknown status %d", (int)status);
    if (status != CLATTN_IO_OK) {
        if (file != NULL || msg[0] == '\0')
            fuzz_fail("safetensors open: %s with %s and %s", clattn_io_status_string(status),
                      file != NULL ? "a handle" : "no handle",
                      msg[0] == '\0' ? "no message" : "a message");
        check_open_error_repeatable(status, size);
    } else {
        if (file == NULL || msg[0] != '\0')
            fuzz_fail("safetensors open: success with %s and message '%s'",
                      file == NULL ? "no handle" : "a handle", msg);
        check_tensors(file, msg, size);
    }
    clattn_safetensors_close(file);
    free(msg);
    return 0;
}
