/* The options several commands share, each declared once in the table of its concern (score,
 * rope, masks, heatmap, device, a benchmark's problem), and the parser, the usage line and
 * --help, all made from one cli_option table per command, which names the concerns it takes
 * (cli.h). */
#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const cli_choice cli_path_choices[] = {{"auto", CLATTN_PATH_AUTO},
                                       {"fused", CLATTN_PATH_FUSED},
                                       {"unfused", CLATTN_PATH_UNFUSED},
                                       {NULL, 0}};
const cli_choice cli_norm_choices[] = {
    {"softmax", CLATTN_NORM_SOFTMAX}, {"relu", CLATTN_NORM_RELU}, {NULL, 0}};
const cli_choice cli_causal_align_choices[] = {{"onnx", CLATTN_CAUSAL_ONNX},
                                               {"top-left", CLATTN_CAUSAL_TOP_LEFT},
                                               {"bottom-right", CLATTN_CAUSAL_BOTTOM_RIGHT},
                                               {NULL, 0}};
static const cli_choice png_scale_choices[] = {{"row", CLATTN_HEATMAP_ROW},
                                               {"log", CLATTN_HEATMAP_LOG},
                                               {"global", CLATTN_HEATMAP_GLOBAL},
                                               {NULL, 0}};
static const cli_choice mask_true_choices[] = {{"attend", 0}, {"masked", 1}, {NULL, 0}};
static const cli_choice rope_style_choices[] = {
    {"halves", CLATTN_ROPE_HALVES}, {"pairs", CLATTN_ROPE_PAIRS}, {NULL, 0}};

static int parse_window(const cli_args *args, const char *value, void *target)
{
    cli_window *window = target;
    if (!cli_parse_window(args->command, value, &window->left, &window->right))
        return -1;
    window->on = true;
    return 1;
}

static int parse_mask_true(const cli_args *args, const char *value, void *target)
{
    return cli_parse_mask_true(args->command, value, target) == CLI_OK ? 1 : -1;
}

/* The rotary options, each into the command's cli_rope. */
static int parse_rope(const cli_args *args, const char *value, void *target)
{
    cli_rope *rope = target;
    const char *command = args->command;
    if (value == NULL) { /* --rope */
        rope->on = true;
        return 1;
    }
    rope->option = true;
    if (cli_is(args, "--rope-style")) {
        for (const cli_choice *c = rope_style_choices; c->name; ++c)
            if (strcmp(value, c->name) == 0) {
                rope->style = (clattn_rope_style)c->value;
                return 1;
            }
        return cli_fail(command, -1, "--rope-style: '%s' is not pairs or halves", value);
    }
    if (cli_is(args, "--rope-dims"))
        return cli_parse_size(command, "--rope-dims", value, 2, &rope->dims) ? 1 : -1;
    if (cli_is(args, "--rope-start"))
        return cli_parse_size(command, "--rope-start", value, 0, &rope->start) ? 1 : -1;
    if (!cli_parse_float(command, "--rope-base", value, &rope->base))
        return -1;
    if (!(rope->base > 0.0f))
        return cli_fail(command, -1, "--rope-base: %s is not a positive base", value);
    return 1;
}

/* The concerns' tables: each option declared here once, its target an offset into the
 * concern's struct (cli.h); the order is the one the CLI_<GROUP>_* bits name. */
#define AT(field) CLI_AT(cli_score, field)
static const cli_option score_options[] = {
    {CLI_OPT("--causal", CLI_FLAG, AT(causal), NULL, "causal mask: query i sees keys j <= i")},
    {CLI_OPT("--causal-align", CLI_CHOICE, AT(align), NULL,
             "where the causal diagonal and window sit"),
     .choices = cli_causal_align_choices, .given = CLI_GIVEN(cli_score, align_given)},
    {CLI_OPT("--window", CLI_CUSTOM, AT(window), "LEFT,RIGHT",
             "sliding window: keys i - LEFT .. i + RIGHT (-1: unbounded side)"),
     .handle = parse_window},
    {CLI_OPT("--softcap", CLI_FLOAT, AT(softcap), "C",
             "soft-capping: each scaled score s becomes C tanh(s / C) (C > 0)"),
     .min = 1},
    {CLI_OPT("--scale", CLI_FLOAT, AT(scale), "S",
             "the scores' scale (default 1/sqrt(head size))")},
    {CLI_OPT("--norm", CLI_CHOICE, AT(norm), NULL,
             "normalisation: softmax (default) or relu (relu(s) / sum)"),
     .choices = cli_norm_choices},
    {CLI_OPT("--alibi", CLI_FLAG, AT(alibi), NULL, "ALiBi biases with the paper's slopes")},
    {CLI_OPT("--alibi-slopes", CLI_PATH, AT(alibi_slopes), "S.npy",
             "ALiBi with your own slopes, one per head")},
    {CLI_OPT("--path", CLI_CHOICE, AT(path), NULL,
             "auto (default), fused (never forms the scores) or unfused"),
     .choices = cli_path_choices},
};
#undef AT
const cli_group cli_score_group = {score_options, CLI_COUNT(score_options)};
_Static_assert(CLI_COUNT(score_options) == 9 && CLI_SCORE_PATH == 1u << 8,
               "the CLI_SCORE_* bits name score_options' rows in order");

static const cli_option rope_options[] = {
    {CLI_OPT("--rope", CLI_CUSTOM, 0, NULL, "rotary position embeddings on q and k"),
     .handle = parse_rope},
    {CLI_OPT("--rope-style", CLI_CUSTOM, 0, NULL,
             "with --rope: halves (GPT-NeoX, Llama; default) or pairs"),
     .choices = rope_style_choices, .handle = parse_rope},
    {CLI_OPT("--rope-dims", CLI_CUSTOM, 0, "N",
             "with --rope: the first N columns of each head turn (default all)"),
     .handle = parse_rope},
    {CLI_OPT("--rope-base", CLI_CUSTOM, 0, "B",
             "with --rope: the base of the angles (default 10000)"),
     .handle = parse_rope},
    {CLI_OPT("--rope-start", CLI_CUSTOM, 0, "P", "with --rope: the position of row 0 (default 0)"),
     .handle = parse_rope},
};
const cli_group cli_rope_group = {rope_options, CLI_COUNT(rope_options)};

static const cli_option masks_options[] = {
    {CLI_OPT("--mask-true", CLI_CUSTOM, CLI_AT(cli_masks, true_masked), NULL,
             "what True means in a bool --attn-mask"),
     .choices = mask_true_choices, .handle = parse_mask_true,
     .given = CLI_GIVEN(cli_masks, true_given)},
    {CLI_OPT("--key-padding-mask", CLI_PATH, CLI_AT(cli_masks, key_padding), "P.npy",
             "(B, S) or (S): true = ignore that key")},
};
const cli_group cli_masks_group = {masks_options, CLI_COUNT(masks_options)};
_Static_assert(CLI_COUNT(masks_options) == 2 && CLI_MASKS_KEY_PADDING == 1u << 1,
               "the CLI_MASKS_* bits name masks_options' rows in order");

static const cli_option heatmap_options[] = {
    {CLI_OPT("--attn-png", CLI_PATH, CLI_AT(cli_heatmap, png), "A.png",
             "the weights of batch 0 as a heatmap, one panel per head (unfused)")},
    {CLI_OPT("--png-scale", CLI_CHOICE, CLI_AT(cli_heatmap, scale), NULL,
             "the heatmap's colour scale: row (default), log or global"),
     .choices = png_scale_choices},
};
const cli_group cli_heatmap_group = {heatmap_options, CLI_COUNT(heatmap_options)};

static const cli_option exec_options[] = {
    {CLI_OPT("--device", CLI_PATH, CLI_AT(cli_exec, device), "SPEC",
             "gpu, cpu or P:D (see `clattn devices`; default: CLATTN_DEVICE)")},
};
const cli_group cli_exec_group = {exec_options, CLI_COUNT(exec_options)};

#define AT(field) CLI_AT(cli_bench, field)
static const cli_option bench_options[] = {
    {CLI_OPT("--batch", CLI_SIZE, AT(batch), "B", "batch (default 1)"), .min = 1},
    {CLI_OPT("--heads", CLI_SIZE, AT(heads), "H", "heads (default 8)"), .min = 1},
    {CLI_OPT("--kv-heads", CLI_SIZE, AT(kv_heads), "H", "grouped K/V heads (default: --heads)"),
     .min = 1},
    {CLI_OPT("--head-dim", CLI_SIZE, AT(head_dim), "D", "head size (default 64)"), .min = 1},
    {CLI_OPT("--runs", CLI_SIZE, AT(runs), "N",
             "timed runs, the median reported (default 10; --op ring: 5)"),
     .min = 1},
    {CLI_OPT("--warmup", CLI_SIZE, AT(warmup), "N", "untimed runs first (default 1)")},
    {CLI_OPT("--json", CLI_FLAG, AT(json), NULL, "one JSON line per measurement")},
};
#undef AT
const cli_group cli_bench_group = {bench_options, CLI_COUNT(bench_options)};

/* The options a command takes, in its table's order, each group replaced by the members it
 * picks, their targets offsets into the command's struct; NULL when out of memory. */
static cli_option *expand(const cli_command *command, size_t *count)
{
    size_t total = 0;
    for (size_t i = 0; i < command->count; ++i)
        total += command->options[i].kind == CLI_GROUP ? command->options[i].group->count : 1;
    cli_option *list = malloc((total ? total : 1) * sizeof *list);
    if (list == NULL)
        return NULL;
    *count = 0;
    for (size_t i = 0; i < command->count; ++i) {
        const cli_option *row = &command->options[i];
        if (row->kind != CLI_GROUP) {
            list[(*count)++] = *row;
            continue;
        }
        for (size_t m = 0; m < row->group->count; ++m) {
            if (row->pick && !(row->pick & (1u << m)))
                continue;
            cli_option member = row->group->options[m];
            member.target += row->target;
            member.given += member.given ? row->target : 0;
            list[(*count)++] = member;
        }
    }
    return list;
}

/* Whether the option takes no value. */
static bool is_flag(const cli_option *o)
{
    return o->kind == CLI_FLAG || (o->kind == CLI_CUSTOM && o->arg == NULL && o->choices == NULL);
}

/* "a, b or c" (joiner " or ") or "a|b|c" (joiner NULL). */
static void choice_names(const cli_choice *choices, const char *last_joiner, char *text,
                         size_t size)
{
    size_t used = 0, count = 0;
    while (choices[count].name)
        ++count;
    text[0] = '\0';
    for (size_t i = 0; i < count && used < size; ++i)
        used += (size_t)snprintf(text + used, size - used, "%s%s",
                                 i == 0                ? ""
                                 : last_joiner == NULL ? "|"
                                 : i + 1 == count      ? last_joiner
                                                       : ", ",
                                 choices[i].name);
}

static int parse_choice(const cli_args *args, const cli_option *o, const char *value, int *target)
{
    for (const cli_choice *c = o->choices; c->name; ++c)
        if (strcmp(value, c->name) == 0) {
            *target = c->value;
            return 1;
        }
    char names[256];
    choice_names(o->choices, " or ", names, sizeof names);
    return cli_fail(args->command, -1, "%s: '%s' is not %s", o->name, value, names);
}

/* Parses the current option, o, into base: 1, or -1 after the error. */
static int parse_one(cli_args *args, const cli_option *o, char *base)
{
    void *target = base + o->target;
    if (o->given)
        *(bool *)(base + o->given - 1) = true;
    if (is_flag(o)) {
        if (cli_flag(args, o->name) < 0)
            return -1;
        if (o->kind == CLI_CUSTOM)
            return o->handle(args, NULL, target);
        *(bool *)target = true;
        return 1;
    }
    const char *value = cli_value(args);
    if (value == NULL)
        return -1;
    switch (o->kind) {
    case CLI_PATH:
        *(const char **)target = value;
        return 1;
    case CLI_SIZE:
        return cli_parse_size(args->command, o->name, value, o->min, target) ? 1 : -1;
    case CLI_FLOAT:
        if (!cli_parse_float(args->command, o->name, value, target))
            return -1;
        if (o->min > 0 && !(*(float *)target > 0.0f))
            return cli_fail(args->command, -1, "%s: %s is not positive", o->name, value);
        return 1;
    case CLI_CHOICE:
        return parse_choice(args, o, value, target);
    default:
        return o->handle(args, value, target);
    }
}

int cli_parse_command(const cli_command *command, int argc, char **argv, void *base)
{
    cli_args args = {.argc = argc, .argv = argv, .index = 1, .command = command->name};
    size_t count = 0;
    cli_option *options = expand(command, &count);
    unsigned char *seen = options ? calloc(count + 1, 1) : NULL;
    int rc = seen ? CLI_OK : cli_fail(command->name, CLI_FAILED, "out of memory");
    while (rc == CLI_OK && cli_next(&args)) {
        if (cli_is(&args, "--help") || cli_is(&args, "-h")) {
            cli_print_help(command, stdout);
            rc = -1;
            break;
        }
        if (command->operand && args.name[0] != '-' && !args.inline_value) {
            if (command->operand(&args, args.name, base) < 0)
                rc = CLI_BAD_INPUT;
            continue;
        }
        size_t i = 0;
        while (i < count && !cli_is(&args, options[i].name))
            ++i;
        if (i == count) {
            rc = cli_fail(command->name, CLI_BAD_INPUT, "unknown option '%s' (see --help)",
                          args.name);
            break;
        }
        if (seen[i] && !(options[i].flags & CLI_REPEATABLE)) {
            rc = cli_fail(command->name, CLI_BAD_INPUT, "%s given twice (give it once)",
                          options[i].name);
            break;
        }
        seen[i] = 1;
        if (parse_one(&args, &options[i], base) < 0)
            rc = CLI_BAD_INPUT;
    }
    free(seen);
    free(options);
    return rc;
}

/* "--name ARG", "--name a|b|c" or "--name". */
static void option_text(const cli_option *o, char *text, size_t size)
{
    char names[256] = "";
    if (o->arg)
        snprintf(names, sizeof names, "%s", o->arg);
    else if (o->choices)
        choice_names(o->choices, NULL, names, sizeof names);
    snprintf(text, size, "%s%s%s", o->name, names[0] ? " " : "", names);
}

/* The usage line(s) of the expanded options (as cli_usage). */
static size_t usage_text(const cli_command *command, const cli_option *options, size_t count,
                         char *text, size_t size)
{
    char lead[64], item[320];
    const int indent = snprintf(lead, sizeof lead, "usage: clattn %s", command->name);
    char operands[128] = "";
    if (command->operands)
        snprintf(operands, sizeof operands, " %s", command->operands);
    size_t used = 0, column = (size_t)indent;
    used += (size_t)snprintf(text, size, "%s%s", lead, operands);
    column += strlen(operands);
    for (size_t i = 0; i < count; ++i) {
        char option[300];
        option_text(&options[i], option, sizeof option);
        const bool required = options[i].flags & CLI_REQUIRED;
        const int length = snprintf(item, sizeof item, required ? "%s" : "[%s]", option);
        const bool wrap = column + 1 + (size_t)length > 100;
        char *at = used < size ? text + used : NULL;
        const size_t left = used < size ? size - used : 0;
        if (wrap)
            used += (size_t)snprintf(at, left, "\n%*s %s", indent, "", item);
        else
            used += (size_t)snprintf(at, left, " %s", item);
        column = (wrap ? (size_t)indent : column) + 1 + (size_t)length;
    }
    used += (size_t)snprintf(used < size ? text + used : NULL, used < size ? size - used : 0, "\n");
    return used;
}

size_t cli_usage(const cli_command *command, char *text, size_t size)
{
    size_t count = 0;
    cli_option *options = expand(command, &count);
    const size_t used = options ? usage_text(command, options, count, text, size) : 0;
    free(options);
    return used;
}

void cli_print_help(const cli_command *command, FILE *out)
{
    size_t count = 0;
    cli_option *options = expand(command, &count);
    if (options == NULL)
        return;
    const size_t size = usage_text(command, options, count, NULL, 0) + 1;
    char *usage = malloc(size);
    if (usage) {
        usage_text(command, options, count, usage, size);
        fputs(usage, out);
        free(usage);
    }
    fputs("\noptions:\n", out);
    for (size_t i = 0; i < count; ++i) {
        char option[300];
        option_text(&options[i], option, sizeof option);
        /* a repeatable option's help says so and what repeating does */
        fprintf(out, "  %-30s %s\n", option, options[i].help ? options[i].help : "");
    }
    free(options);
    fputs("\n", out);
    for (const char *const *part = command->help; part && *part; ++part)
        fputs(*part, out);
}
