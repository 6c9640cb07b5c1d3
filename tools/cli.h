/* Shared pieces of the clattn command: exit codes, messages, option parsing, the context. */
#ifndef CLATTN_CLI_H
#define CLATTN_CLI_H

#include "clattn.h"
#include "clattn_io.h"

#include <stdbool.h>
#include <stddef.h> /* offsetof */
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

/* A command's options are ONE table of cli_option (tools/cmd_*.c), from which the parser, the
 * usage line and the option list of --help are made (cli_parse_command, cli_print_help), so
 * that the usage line names every option the parser takes. Kinds:
 *   PATH    target const char **: the value as given
 *   FLAG    target bool *: true (a value, --flag=x, is refused)
 *   SIZE    target size_t *: a whole number >= min
 *   FLOAT   target float *: a finite float32, > 0 when min is 1
 *   CHOICE  target int *: choices[i].value for the value named choices[i].name (NULL-ended)
 *   CUSTOM  handle(args, value, target) parses it (value NULL when arg is NULL: a flag)
 *   GROUP   the options of one concern, declared once in tools/cli_options.c over one struct
 *           (cli_score_group: --causal, --softcap, --scale, --path...; cli_rope_group,
 *           cli_masks_group, cli_heatmap_group, cli_exec_group: --device; cli_bench_group):
 *           the entry puts that struct at target and picks its members (pick: a mask of
 *           their CLI_<GROUP>_<MEMBER> bits, 0: all), which stand in the table in the
 *           group's order (CLI_USE).
 * target and given are offsets into the command's options struct (CLI_AT, CLI_GIVEN); given
 * (0: none) names a bool set when the option appears. An option may appear once, unless
 * flagged CLI_REPEATABLE: "--scale given twice" otherwise. CLI_REQUIRED marks one the usage
 * line shows without brackets (the command still checks it after parsing). */
typedef enum {
    CLI_PATH,
    CLI_FLAG,
    CLI_SIZE,
    CLI_FLOAT,
    CLI_CHOICE,
    CLI_CUSTOM,
    CLI_GROUP
} cli_kind;
enum { CLI_REQUIRED = 1, CLI_REPEATABLE = 2 };
typedef struct cli_choice {
    const char *name;
    int value;
} cli_choice;
/* Parses value (NULL for a flag) into target; 1, or -1 after printing the error. */
typedef int (*cli_handler)(const cli_args *args, const char *value, void *target);
typedef struct cli_group cli_group;
typedef struct cli_option {
    const char *name;
    cli_kind kind;
    size_t target;    /* CLI_AT(type, field) */
    const char *arg;  /* the value's placeholder in the usage line ("Q.npy"); NULL: a flag, or
                       * a CHOICE's names joined by '|' */
    const char *help; /* one line for --help's option list */
    size_t min;
    const cli_choice *choices;
    cli_handler handle;
    unsigned flags; /* CLI_REQUIRED, CLI_REPEATABLE */
    size_t given;   /* CLI_GIVEN(type, field), 0: none */
    const cli_group *group; /* GROUP: the concern's table */
    unsigned pick;          /* GROUP: its members taken (bit i: member i), 0: all */
} cli_option;
/* One concern's options, their targets offsets into its struct. */
struct cli_group {
    const cli_option *options;
    size_t count;
};
/* clang-format off */
#define CLI_AT(type, field) offsetof(type, field)
#define CLI_GIVEN(type, field) (offsetof(type, field) + 1)
#define CLI_COUNT(table) (sizeof(table) / sizeof((table)[0]))
/* A row's first fields: {CLI_OPT("--out", CLI_PATH, CLI_AT(t, out), "O.npy", "help"), .min...} */
#define CLI_OPT(option, option_kind, option_target, placeholder, text)                             \
    .name = (option), .kind = (option_kind), .target = (option_target), .arg = (placeholder),      \
    .help = (text)
/* A concern's options (members: a mask of its CLI_<GROUP>_* bits, 0: all) at a field of the
 * command's options struct. */
#define CLI_USE(concern, type, field, members)                                                     \
    {.name = #concern, .kind = CLI_GROUP, .target = offsetof(type, field), .group = &(concern),  \
     .pick = (members)}
/* clang-format on */

/* The concerns. Each struct's defaults are zero unless said otherwise (the command sets them
 * before parsing). */
/* --window's destination: LEFT,RIGHT, on when given. */
typedef struct cli_window {
    bool on;
    long long left, right;
} cli_window;
/* How the scores are formed and masked: --causal --causal-align --window --softcap --scale
 * --norm --alibi --alibi-slopes, and whether they are formed whole: --path. */
typedef struct cli_score {
    bool causal, align_given;
    clattn_causal align; /* --causal-align */
    cli_window window;
    float softcap; /* 0: off */
    float scale;   /* NAN (set by the command): the default, 1/sqrt(head size) */
    clattn_norm norm;
    bool alibi;               /* the paper's slopes */
    const char *alibi_slopes; /* --alibi-slopes S.npy */
    clattn_path path;         /* auto, fused or unfused */
} cli_score;
enum {
    CLI_SCORE_CAUSAL = 1u << 0,
    CLI_SCORE_ALIGN = 1u << 1,
    CLI_SCORE_WINDOW = 1u << 2,
    CLI_SCORE_SOFTCAP = 1u << 3,
    CLI_SCORE_SCALE = 1u << 4,
    CLI_SCORE_NORM = 1u << 5,
    CLI_SCORE_ALIBI = 1u << 6,
    CLI_SCORE_ALIBI_SLOPES = 1u << 7,
    CLI_SCORE_PATH = 1u << 8
};
extern const cli_group cli_score_group;
/* The rotary options: --rope [--rope-style halves|pairs] [--rope-dims N] [--rope-base B]
 * [--rope-start P], for clattn_mha_desc's and clattn_sdpa_desc's rope fields. */
typedef struct cli_rope {
    bool on, option; /* --rope; any --rope-* option */
    clattn_rope_style style;
    size_t dims, start; /* dims 0: the head size */
    float base;         /* 0: the library's default, 10000 */
} cli_rope;
extern const cli_group cli_rope_group;
/* What a mask file means: --mask-true attend|masked, --key-padding-mask P.npy. */
typedef struct cli_masks {
    bool true_masked, true_given; /* --mask-true (the default is the command's) */
    const char *key_padding;
} cli_masks;
enum { CLI_MASKS_TRUE = 1u << 0, CLI_MASKS_KEY_PADDING = 1u << 1 };
extern const cli_group cli_masks_group;
/* The weights as a picture: --attn-png A.png, --png-scale row|log|global. */
typedef struct cli_heatmap {
    const char *png;
    clattn_heatmap_scale scale; /* default row */
} cli_heatmap;
extern const cli_group cli_heatmap_group;
/* Where it runs: --device SPEC. */
typedef struct cli_exec {
    const char *device;
} cli_exec;
extern const cli_group cli_exec_group;
/* A benchmark's problem and its measurement: --batch --heads --kv-heads --head-dim --runs
 * --warmup --json (the command sets the defaults). */
typedef struct cli_bench {
    size_t batch, heads, kv_heads, head_dim; /* kv_heads 0: heads */
    size_t runs, warmup;
    bool json;
} cli_bench;
extern const cli_group cli_bench_group;

/* A command: its name ("run"), its table, and the prose of --help after the option list
 * (strings printed in turn, NULL-ended; the last ends with the "Exit status" line); and, for
 * a command that takes operands (`demo posenc`), their usage text and their parser (called
 * with each argument that does not start with '-'; NULL: none taken). */
typedef struct cli_command {
    const char *name;
    const cli_option *options;
    size_t count;
    const char *const *help;
    const char *operands;
    cli_handler operand;
} cli_command;
/* clang-format off */
#define CLI_COMMAND(command_name, table, prose)                                                    \
    {.name = (command_name), .options = (table), .count = CLI_COUNT(table), .help = (prose)}
/* clang-format on */
/* Parses argv (argv[0] the command's name) into the options struct `base` (its defaults set
 * by the caller): CLI_OK; -1 after printing --help (-h); CLI_BAD_INPUT after the one-line
 * error (an unknown option, a bad value, a value missing, an option given twice). */
int cli_parse_command(const cli_command *command, int argc, char **argv, void *base);
/* The usage line(s), the option list and the prose. */
void cli_print_help(const cli_command *command, FILE *out);
/* The usage line(s) alone: "usage: clattn run --query Q.npy [--key K.npy] ..." wrapped to
 * 100 columns; the number of characters it needs (as snprintf). */
size_t cli_usage(const cli_command *command, char *text, size_t size);
/* The choices every command shares. */
extern const cli_choice cli_path_choices[];       /* auto, fused, unfused */
extern const cli_choice cli_norm_choices[];       /* softmax, relu */
extern const cli_choice cli_causal_align_choices[]; /* onnx, top-left, bottom-right */

/* Reads an input array by its format (the file's first bytes, not its name): a .npy, or a
 * safetensors file holding one tensor; FILE:NAME reads tensor NAME of a safetensors file that
 * holds several (when FILE:NAME is not itself a file). Safetensors tensors are read as float32
 * (F32, F16, BF16, F64): an output follows them as float32. Prints the one-line error naming
 * the file and what it holds otherwise; CLI_OK or CLI_BAD_INPUT. */
int cli_read_array(const char *command, const char *path, clattn_array *out);

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
/* Releases ctx (NULL: nothing), first printing one line on stderr when self-validation
 * turned a kernel variant down on this device (docs/validation.md): the results came from
 * another variant. */
void cli_release_context(clattn_ctx *ctx);
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

/* Releases the buffers that are set among mems[0 .. count - 1] and clears them. */
void cli_release_buffers(cl_mem *mems, size_t count);
/* Frees the arrays (clattn_array_free) and the blocks (free) a command read and made. */
void cli_free_all(clattn_array *const arrays[], size_t num_arrays, void *const blocks[],
                  size_t num_blocks);
/* After a library call: CLI_OK when status and err are both success; else the one line,
 * "STATUS: the library's last error", exit 2 when the status refused the input (an invalid
 * argument or shape; with sizes_are_input an overflow or a size too large too), else 1; or
 * "OpenCL error N" (exit 1). */
int cli_call_failure(const char *command, clattn_ctx *ctx, clattn_status status,
                     bool sizes_are_input, cl_int err);

/* Prints the device's name and type on one line. */
void cli_print_device(FILE *out, cl_device_id device);

/* Prints a rows x cols matrix with a title, aligned. */
void cli_print_matrix(const char *title, const float *values, size_t rows, size_t cols);

/* The sub-commands, cmd_NAME(argc, argv) with argv[0] the sub-command's name; clattn.c's
 * dispatch table is made from this list. */
#define CLI_COMMANDS(X)                                                                            \
    X(devices) X(info) X(demo) X(run) X(sdpa) X(rope) X(additive) X(bench) X(tune) X(doctor) X(serve) \
    X(merge)
#define CLI_DECLARE_COMMAND(name) int cmd_##name(int argc, char **argv);
CLI_COMMANDS(CLI_DECLARE_COMMAND)
#undef CLI_DECLARE_COMMAND

/* `clattn run` up to the device: parses the options, reads every file and checks every shape,
 * printing the one-line error on failure; returns the exit code. The argument-validation fuzz
 * target calls it. */
int cmd_run_check(int argc, char **argv);
/* `clattn sdpa` up to the end of its checks (options, files, shapes, a paged cache's block table
 * and counts), without the ring or any device work: 0 or 2 (the CLI fuzzer's entry). */
int cmd_sdpa_check(int argc, char **argv);

#endif
