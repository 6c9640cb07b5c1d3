/*
 * libFuzzer target: the .npy reader on arbitrary bytes, and the writer on what it accepts.
 *
 * Each input is written to a scratch file and read with clattn_npy_read. Beyond "no crash, no
 * leak, no sanitizer report", the contract of clattn_io.h is checked:
 *   - success: count == product(shape), data non-NULL and count floats long, bool/uint8
 *     arrays hold whole numbers in [0, 255]; the array written back with clattn_npy_write
 *     reads back with the same shape and bit-identical values (NaN payloads included);
 *   - failure: a message and a zeroed array; the same status again with a short message
 *     buffer (the message is cut and terminated, never written past) and with none.
 *
 *     fuzz_npy [libFuzzer options] CORPUS_DIR...      (see tests/fuzz/run.sh)
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */

#include "fuzz_common.h"

static const char *input_path;
static const char *output_path;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    input_path = fuzz_scratch_file("input.npy");
    output_path = fuzz_scratch_file("output.npy");
    return 0;
}

/* A failed read must fail the same way with a short message buffer and with none. */
static void check_error_repeatable(clattn_io_status status, size_t input_size)
{
    const size_t small_size = 1 + input_size % 24;
    char *small = fuzz_message_buffer(small_size);
    clattn_array array;
    clattn_io_status again = clattn_npy_read(input_path, &array, small, small_size);
    fuzz_check_terminated("npy read, short message buffer", small, small_size);
    if (again != status)
        fuzz_fail("npy read: %s, then %s with a %zu-byte message buffer",
                  clattn_io_status_string(status), clattn_io_status_string(again), small_size);
    clattn_array_free(&array);
    free(small);
    again = clattn_npy_read(input_path, &array, NULL, 0);
    if (again != status)
        fuzz_fail("npy read: %s, then %s without a message buffer", clattn_io_status_string(status),
                  clattn_io_status_string(again));
    clattn_array_free(&array);
}

/* Writes `array` as .npy and reads it back: same shape, bit-identical values. */
static void check_round_trip(const clattn_array *array, char *msg)
{
    clattn_io_status status =
        clattn_npy_write(output_path, array->data, array->ndim, array->shape, msg, FUZZ_MSG_SIZE);
    if (status != CLATTN_IO_OK)
        fuzz_fail("npy write of an array just read: %s: %s", clattn_io_status_string(status), msg);
    clattn_array back;
    status = clattn_npy_read(output_path, &back, msg, FUZZ_MSG_SIZE);
    fuzz_check_array("npy read of a file just written", status, &back, msg);
    if (status != CLATTN_IO_OK)
        fuzz_fail("npy read of a file just written: %s: %s", clattn_io_status_string(status), msg);
    if (back.ndim != array->ndim || back.count != array->count || back.source != CLATTN_IO_F32)
        fuzz_fail("npy round trip: ndim %d -> %d, count %zu -> %zu, source %d", array->ndim,
                  back.ndim, array->count, back.count, (int)back.source);
    for (int d = 0; d < array->ndim; ++d) {
        if (back.shape[d] != array->shape[d])
            fuzz_fail("npy round trip: shape[%d] %zu -> %zu", d, array->shape[d], back.shape[d]);
    }
    if (array->count > 0 && memcmp(back.data, array->data, array->count * sizeof(float)) != 0)
        fuzz_fail("npy round trip: the values differ");
    clattn_array_free(&back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_write_file(input_path, data, size);
    char *msg = fuzz_message_buffer(FUZZ_MSG_SIZE);
    clattn_array array;
    clattn_io_status status = clattn_npy_read(input_path, &array, msg, FUZZ_MSG_SIZE);
    fuzz_check_terminated("npy read", msg, FUZZ_MSG_SIZE);
    fuzz_check_array("npy read", status, &array, msg);
    if (status == CLATTN_IO_OK)
        check_round_trip(&array, msg);
    else
        check_error_repeatable(status, size);
    clattn_array_free(&array);
    free(msg);
    return 0;
}
