/*
 * Shared by the libFuzzer targets in this directory (each is one translation unit):
 *   - a private scratch directory per process (mkdtemp in $TMPDIR, else /dev/shm, else /tmp),
 *     removed at exit, because the readers under test take paths, not memory buffers;
 *   - fuzz_fail: a broken contract becomes a crash (abort), so libFuzzer saves the input;
 *   - the checks every reader result must pass (clattn_io.h: on success a consistent array
 *     whose data covers count floats, on failure a message and a zeroed array).
 * Needs _POSIX_C_SOURCE >= 200809L (mkdtemp), defined by the including file.
 */
#ifndef CLATTN_FUZZ_COMMON_H
#define CLATTN_FUZZ_COMMON_H

#include "clattn_io.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FUZZ_PATH_MAX 4096
#define FUZZ_MAX_FILES 32 /* fuzz_cli_args: a scratch .npy per token position */
#define FUZZ_MSG_SIZE 1024 /* the message buffer given to the readers */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Where fuzz_fail writes. The CLI target points it at a copy of the real stderr, since it asks
 * libFuzzer to close fd 2 (cli_fail's messages) for the code under test. */
static FILE *fuzz_log;

static inline void fuzz_fail(const char *format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2), noreturn))
#endif
    ;

static inline void fuzz_fail(const char *format, ...)
{
    FILE *log = fuzz_log != NULL ? fuzz_log : stderr;
    va_list args;
    va_start(args, format);
    fputs("clattn fuzz: contract broken: ", log);
    vfprintf(log, format, args);
    fputc('\n', log);
    fflush(log);
    va_end(args);
    abort();
}

/* --- scratch directory ---------------------------------------------------------------------- */

static char fuzz_dir[FUZZ_PATH_MAX];
static char fuzz_files[FUZZ_MAX_FILES][FUZZ_PATH_MAX];
static int fuzz_file_count;

static inline void fuzz_remove_scratch(void)
{
    for (int i = 0; i < fuzz_file_count; ++i)
        remove(fuzz_files[i]);
    if (fuzz_dir[0] != '\0')
        rmdir(fuzz_dir);
}

/* Returns the path of `name` in this process's scratch directory (created on first use). The
 * file is removed at exit; a crash leaves the directory behind (a few small files). */
static inline const char *fuzz_scratch_file(const char *name)
{
    if (fuzz_dir[0] == '\0') {
        /* $TMPDIR, else /dev/shm: in memory, 5x the executions of /tmp on a disk here. */
        const char *tmp = getenv("TMPDIR");
        const char *bases[] = {tmp != NULL && tmp[0] != '\0' ? tmp : "/dev/shm", "/tmp"};
        for (size_t i = 0; i < sizeof bases / sizeof bases[0]; ++i) {
            snprintf(fuzz_dir, sizeof fuzz_dir, "%s/clattn-fuzz-XXXXXX", bases[i]);
            if (mkdtemp(fuzz_dir) != NULL)
                break;
            fuzz_dir[0] = '\0';
        }
        if (fuzz_dir[0] == '\0') {
            fprintf(stderr, "clattn fuzz: no scratch directory in %s or /tmp: %s\n", bases[0],
                    strerror(errno));
            exit(1);
        }
        atexit(fuzz_remove_scratch);
    }
    if (fuzz_file_count == FUZZ_MAX_FILES) {
        fprintf(stderr, "clattn fuzz: more than %d scratch files\n", FUZZ_MAX_FILES);
        exit(1);
    }
    char *path = fuzz_files[fuzz_file_count++];
    snprintf(path, FUZZ_PATH_MAX, "%s/%s", fuzz_dir, name);
    return path;
}

/* Replaces the file's contents with the input. A failure here is the machine's (disk full), not
 * the code's, but there is no way to go on. */
static inline void fuzz_write_file(const char *path, const uint8_t *data, size_t size)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        fuzz_fail("cannot create scratch file %s: %s", path, strerror(errno));
    for (size_t done = 0; done < size;) {
        ssize_t written = write(fd, data + done, size - done);
        if (written < 0 && errno == EINTR)
            continue;
        if (written <= 0)
            fuzz_fail("cannot write scratch file %s: %s", path, strerror(errno));
        done += (size_t)written;
    }
    if (close(fd) != 0)
        fuzz_fail("cannot close scratch file %s: %s", path, strerror(errno));
}

/* --- checks of reader results --------------------------------------------------------------- */

static inline int fuzz_status_known(clattn_io_status status)
{
    return status >= CLATTN_IO_OK && status <= CLATTN_IO_ERR_ARGUMENT;
}

/* What every reader promises about (status, array, message). On success the values are read
 * once, so that ASan checks the allocation covers count floats. */
static inline void fuzz_check_array(const char *what, clattn_io_status status,
                                    const clattn_array *array, const char *msg)
{
    if (!fuzz_status_known(status))
        fuzz_fail("%s: unknown status %d", what, (int)status);
    if (status != CLATTN_IO_OK) {
        if (msg[0] == '\0')
            fuzz_fail("%s: %s without a message", what, clattn_io_status_string(status));
        if (array->data != NULL || array->ndim != 0 || array->count != 0)
            fuzz_fail("%s: %s but the array is not zeroed", what, clattn_io_status_string(status));
        return;
    }
    if (msg[0] != '\0')
        fuzz_fail("%s: success with a message: %s", what, msg);
    if (array->data == NULL)
        fuzz_fail("%s: success with NULL data", what);
    if (array->ndim < 0 || array->ndim > CLATTN_IO_MAX_DIMS)
        fuzz_fail("%s: ndim %d", what, array->ndim);
    size_t product = 1;
    for (int d = 0; d < array->ndim; ++d) {
        if (array->shape[d] != 0 && product > SIZE_MAX / array->shape[d])
            fuzz_fail("%s: the shape's product overflows but the read succeeded", what);
        product *= array->shape[d];
    }
    if (product != array->count)
        fuzz_fail("%s: count %zu but the shape's product is %zu", what, array->count, product);
    if (array->source != CLATTN_IO_F32 && array->source != CLATTN_IO_BOOL &&
        array->source != CLATTN_IO_F16 && array->source != CLATTN_IO_BF16 &&
        array->source != CLATTN_IO_INT)
        fuzz_fail("%s: unknown source dtype %d", what, (int)array->source);
    for (size_t i = 0; i < array->count; ++i) {
        float value = array->data[i];
        /* bool and uint8 arrays hold small whole numbers */
        if (array->source == CLATTN_IO_BOOL &&
            !(value >= 0.0f && value <= 255.0f && value == (float)(int)value))
            fuzz_fail("%s: a bool/uint8 array holds %g at %zu", what, (double)value, i);
        /* integers convert to whole floats (|x| < 2^63 fits a float's range) */
        if (array->source == CLATTN_IO_INT && !(value == floorf(value)))
            fuzz_fail("%s: an integer array holds %g at %zu", what, (double)value, i);
    }
}

/* Heap copy of a message buffer of exactly `size` bytes, so ASan sees a write past its end;
 * filled with a non-NUL byte so an unterminated message is noticed. */
static inline char *fuzz_message_buffer(size_t size)
{
    char *buffer = malloc(size);
    if (buffer == NULL)
        fuzz_fail("out of memory for a %zu-byte message buffer", size);
    memset(buffer, 'x', size);
    return buffer;
}

/* A message written into a buffer of msg_size bytes must be NUL-terminated inside it. */
static inline void fuzz_check_terminated(const char *what, const char *msg, size_t msg_size)
{
    if (memchr(msg, '\0', msg_size) == NULL)
        fuzz_fail("%s: message not NUL-terminated within its %zu-byte buffer", what, msg_size);
}

#endif /* CLATTN_FUZZ_COMMON_H */
