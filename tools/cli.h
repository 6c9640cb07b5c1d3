/* Shared pieces of the clattn command: exit codes, messages, option parsing, the context. */
#ifndef CLATTN_CLI_H
#define CLATTN_CLI_H

#include "clattn.h"
#include "clattn_io.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Exit codes: 0 success, 1 the device or the library failed, 2 bad input (options, files). */
enum { CLI_OK = 0, CLI_FAILED = 1, CLI_BAD_INPUT = 2 };

/* Prints "clattn <command>: <message>" as one line on stderr; returns code. */
int cli_fail(const char *command, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Walks argv of a sub-command. Options are `--name value` or `--name=value`. */
typedef struct cli_args {
    int argc;
    char **argv;
    int index;          /* next argument to read */
    const char *name;   /* the current option, without its value */
    const char *inline_value; /* the part after '=' when given as --name=value */
    const char *command;
} cli_args;

/* Moves to the next argument; false at the end. Sets args->name. */
bool cli_next(cli_args *args);
/* True when the current option is `option` (e.g. "--query"). */
bool cli_is(const cli_args *args, const char *option);
/* For an option that takes no value: 1 when the current option is `option`, 0 when it is not,
 * -1 (after printing why) when it is but was given one (--causal=no must not mean causal). */
int cli_flag(const cli_args *args, const char *option);
/* The current option's value; NULL (after printing the error) when it has none. */
const char *cli_value(cli_args *args);

/* A table of a command's options (each command's parse function walks its table, then the
 * options that need code of their own):
 *   PATH    target const char **: the value as given
 *   FLAG    target bool *: true (a value, --flag=x, is refused)
 *   SIZE    target size_t *: a whole number >= min
 *   FLOAT   target float *: a finite number, > 0 when min is 1
 *   CHOICE  target int *: choices[i].value for the value named choices[i].name (NULL-ended)
 * `given` (NULL: none) becomes true when the option appears. */
typedef enum { CLI_PATH, CLI_FLAG, CLI_SIZE, CLI_FLOAT, CLI_CHOICE } cli_kind;
typedef struct cli_choice {
    const char *name;
    int value;
} cli_choice;
typedef struct cli_option {
    const char *name;
    cli_kind kind;
    void *target;
    size_t min;
    const cli_choice *choices;
    bool *given;
} cli_option;
/* When the current option is in the table: parses it into its target and returns 1, or -1
 * after printing the error ("--name: 'value' is not a, b or c"); 0 when it is not there. */
int cli_parse_table(cli_args *args, const cli_option *table, size_t count);
#define CLI_COUNT(table) (sizeof(table) / sizeof((table)[0]))
/* The choices every command shares. */
extern const cli_choice cli_path_choices[];       /* auto, fused, unfused */
extern const cli_choice cli_norm_choices[];       /* softmax, relu */
extern const cli_choice cli_causal_align_choices[]; /* onnx, top-left, bottom-right */

/* Strict number parsing: the whole text must be a number in range; prints an error naming the
 * option and returns false otherwise. */
bool cli_parse_size(const char *command, const char *option, const char *text, size_t min,
                    size_t *out);
bool cli_parse_float(const char *command, const char *option, const char *text, float *out);
/* A probability: the whole text a finite number in [0, 1] (--dropout). */
bool cli_parse_probability(const char *command, const char *option, const char *text, double *out);
/* An unsigned 64-bit integer in decimal, digits only: 0 .. 18446744073709551615 (no sign, no
 * spaces; a larger value is refused, not wrapped) (--seed, --dropout-offset). */
bool cli_parse_u64(const char *command, const char *option, const char *text,
                   unsigned long long *out);
/* --window's LEFT,RIGHT: sizes >= 0, or -1 for an unbounded side. */
bool cli_parse_window(const char *command, const char *text, long long *left, long long *right);
/* A comma-separated list of sizes (at most max_count), e.g. "512,1024". */
bool cli_parse_size_list(const char *command, const char *option, const char *text, size_t *out,
                         size_t max_count, size_t *count);

/* The rotary options of `run` and `sdpa`: --rope [--rope-style halves|pairs] [--rope-dims N]
 * [--rope-base B] [--rope-start P], for clattn_mha_desc's and clattn_sdpa_desc's rope fields. */
typedef struct cli_rope {
    bool on, option; /* --rope; any --rope-* option */
    clattn_rope_style style;
    size_t dims, start; /* dims 0: the head size */
    float base;         /* 0: the library's default, 10000 */
} cli_rope;
/* When the current option is one of them: parses it into rope and returns 1, or -1 after
 * printing the error; 0 for any other option. */
int cli_parse_rope(cli_args *args, cli_rope *rope);
/* After the options: false (after printing why) when a --rope-* option came without --rope. */
bool cli_check_rope(const char *command, const cli_rope *rope);

/* A context on `device` (NULL: CLATTN_DEVICE or the default); prints the error on failure,
 * after which cli_context_exit() is the exit code: 2 for a malformed device spec or one naming
 * an index that does not exist, a bad CLATTN_TUNING file or CLATTN_PARAMS value; else 1.
 * On a device that no row of the tuning cache tunes, it says once (per device, noted in the
 * cache folder's tune-hinted file; CLATTN_NO_TUNE_HINT=1 silences it) that `clattn tune`
 * measures better parameters. */
clattn_ctx *cli_context(const char *command, const char *device);
int cli_context_exit(void);
/* $XDG_CACHE_HOME/clattn/NAME, else $HOME/.cache/clattn/NAME (a relative XDG_CACHE_HOME is
 * ignored, as the library's tuning cache path does); false if neither fits. */
bool cli_cache_file(const char *name, char *path, size_t size);
/* Creates the folders above `path` (mkdir -p of its dirname); 0, or -1 with errno. */
int cli_make_dirs(const char *path);
/* Prints the one line for a failed clattn_ctx_create and returns (and keeps) its exit code. */
int cli_context_failure(const char *command, const char *device, clattn_status status,
                        const char *message);

/* Whether `path` (an output option's value; NULL: not given) can be written: an existing file
 * that is writable, or a new one in an existing writable folder. Checked before any work;
 * prints "clattn <command>: <option>: cannot write ..." (exit 2) otherwise. Creates nothing. */
bool cli_check_output(const char *command, const char *option, const char *path);
/* The same for a command that creates the missing folders (tune --out): the nearest existing
 * ancestor must be a writable folder. */
bool cli_check_output_ex(const char *command, const char *option, const char *path,
                         bool makes_folders);

/* --mask-true attend|masked: what True means in a bool mask file. Returns CLI_OK, or
 * CLI_BAD_INPUT after printing why. */
int cli_parse_mask_true(const char *command, const char *text, bool *true_is_masked);
/* The one-line note on stderr when a bool mask was read without --mask-true (given false). */
void cli_note_mask_convention(const char *command, const char *option, bool true_is_masked,
                              bool given);

/* `clattn sdpa --ring` (tools/cli_ring.c, built with -DCLATTN_MPI=ON, which defines
 * CLATTN_CLI_MPI): the whole inputs as strided (B, H, L, d) host views, the rules, and where
 * the output rows go on rank 0 (out's strides over a (B, H, L, dv) logical view). */
typedef struct cli_ring_job {
    const float *q, *k, *v;
    size_t q_dims[4], k_dims[4], v_dims[4]; /* k and v: Lk keys (cross-attention: Lk != Lq) */
    size_t q_strides[4], k_strides[4], v_strides[4], out_strides[4];
    const int32_t *counts; /* --nonpad-kv-seqlen: batch b's keys 0 .. counts[b] - 1, or NULL */
    const float *sinks;    /* --sinks: (heads) logits, or NULL */
    clattn_io_dtype storage; /* the files' 16-bit type (F16, BF16: the ring runs in it), or F32 */
    bool causal, window, zigzag, timing;
    bool bottom_right; /* causal and window at Lk - Lq (--causal-align bottom-right) */
    long long window_left, window_right;
    float scale, softcap;
    const char *device;
} cli_ring_job;
#ifdef CLATTN_CLI_MPI
/* MPI_Init (unless initialised); then cli_ring_finalize at the end, on every rank. */
int cli_ring_init(void);
/* Collective. On success *root says whether this rank is 0, which then holds the whole output
 * in out. */
int cli_ring_sdpa(const cli_ring_job *job, float *out, bool *root);
/* Collective: releases ranks waiting for this one when it failed before cli_ring_sdpa. */
void cli_ring_finalize(void);
/* `clattn bench --op ring` (cmd_bench hands over when --op is ring). */
int cli_ring_bench(int argc, char **argv);
#endif

/* --png-scale row|log|global (clattn_heatmap_scale); CLI_OK or CLI_BAD_INPUT after the line. */
int cli_parse_png_scale(const char *command, const char *text, clattn_heatmap_scale *scale);

/* What masked the weights of batch 0, so that the heatmap paints those cells as masked:
 * causal (top-left), a top-left window (-1 sides unbounded), key padding (cols bytes, nonzero =
 * ignored), an additive mask whose -inf cells are masked ((rows, cols), or (heads, rows, cols)
 * with per_head_mask). */
typedef struct cli_png_masks {
    size_t heads, rows, cols;
    bool causal, window, per_head_mask;
    long long window_left, window_right;
    const uint8_t *padding;
    const float *additive;
} cli_png_masks;
/* Writes the weights (heads, rows, cols) of batch 0 as a heatmap with their masked cells
 * marked; CLI_OK, or CLI_FAILED after the line. */
int cli_write_attention_png(const char *command, const char *path, const float *weights,
                            const cli_png_masks *masks, clattn_heatmap_scale scale);

/* Prints the device's name and type on one line. */
void cli_print_device(FILE *out, cl_device_id device);

/* Prints a rows x cols matrix with a title, aligned. */
void cli_print_matrix(const char *title, const float *values, size_t rows, size_t cols);

/* The sub-commands. argv[0] is the sub-command's name. */
int cmd_devices(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_sdpa(int argc, char **argv);
int cmd_rope(int argc, char **argv);
int cmd_additive(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tune(int argc, char **argv);
int cmd_info(int argc, char **argv);

/* `clattn run` up to the device: parses the options, reads every file and checks every shape,
 * printing the one-line error on failure; returns the exit code. The argument-validation fuzz
 * target calls it. */
int cmd_run_check(int argc, char **argv);
/* `clattn sdpa` up to the end of its checks (options, files, shapes, a paged cache's block table
 * and counts), without the ring or any device work: 0 or 2 (the CLI fuzzer's entry). */
int cmd_sdpa_check(int argc, char **argv);

#endif
