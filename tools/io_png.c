/* clattn_io: attention heatmaps as PNG. */
#include "io_internal.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <png.h>

#include "font5x7.h"

/* ------------------------------------------------------------------------------------------
 * PNG heatmap
 *
 * Layout (pixels; S = font scale 2, text line TH = 18, digits 14 tall, advance 12 per char):
 *
 *   margin 16
 *   | block | gap 24 | block | ... (up to 4 blocks per row, rows of blocks 24 apart) | gap 24 |
 *   colour bar block | margin 16
 *
 *   block:   "head N" (TH) / 8 / map area / frame 1, tick 4, 2, tick numbers (TH), 6, "key" (TH)
 *   left of the map: "query" rotated (TH wide), 6, tick numbers (right-aligned), 2, tick 4,
 *   frame 1.  map area height = max(map height, length of "query").
 *
 * Map: maps up to 512 cells a side draw each cell as a square of `cell` pixels, cell =
 * ceil(128 / max(rows, cols)) (so small maps are at least 128 px); bigger maps are downsampled
 * by an integer factor ceil(max(rows, cols) / 512), each pixel showing the maximum of the cells
 * it covers (NaN wins, so a NaN is never hidden). The image is rendered one row of blocks at a
 * time, so memory stays at one band of the image.
 * ------------------------------------------------------------------------------------------ */

#define HM_SCALE 2
#define HM_ADVANCE ((FONT_GLYPH_COLS + 1) * HM_SCALE)
#define HM_TEXT_H (FONT_GLYPH_ROWS * HM_SCALE)
#define HM_DIGIT_H (FONT_DIGIT_ROWS * HM_SCALE)
#define HM_MARGIN 16
#define HM_GAP 24
#define HM_TITLE_GAP 8
#define HM_TICK 4
#define HM_LABEL_GAP 6 /* between tick numbers and an axis label */
#define HM_MIN_PANEL 128
#define HM_MAX_PANEL 512
#define HM_PER_ROW 4
#define HM_BAR_W 16
#define HM_BAR_LABEL_CHARS 8 /* "%.3g" of a positive float is at most 8 characters */
#define HM_MAX_SIDE 16384
#define HM_MAX_TICK_GAPS 6 /* at most about 7 tick numbers per axis */

typedef struct hm_layout {
    size_t heads, rows, cols;
    clattn_heatmap_scale scale;
    const unsigned char *masked; /* NULL, or (rows, cols) / (heads, rows, cols) */
    int masked_per_panel;
    const char *panel, *row_label, *col_label, *value_label;
    int numbered;     /* titles "<panel> N" */
    char footer[160]; /* the pooling, stated on the picture ("" when none) */
    size_t footer_h;
    size_t cell, factor; /* pixels per cell (factor 1), or cells per pixel (cell 1) */
    size_t map_w, map_h, area_h;
    size_t gutter, content_w; /* map_x = block_x + gutter */
    size_t block_w, block_h, per_row, grid_rows;
    size_t bar_x, bar_y, bar_h;
    size_t width, height;
} hm_layout;

static size_t hm_text_w(size_t chars)
{
    return chars ? chars * HM_ADVANCE - HM_SCALE : 0;
}

static size_t decimal_digits(size_t value)
{
    size_t digits = 1;
    while (value >= 10) {
        value /= 10;
        ++digits;
    }
    return digits;
}

static size_t max_size(size_t a, size_t b)
{
    return a > b ? a : b;
}

/* 0 on success; 1 when the image would exceed HM_MAX_SIDE (width/height still set when they
 * fit in size_t, for the message). */
static int hm_compute_layout(size_t heads, size_t rows, size_t cols,
                             const clattn_heatmap_options *options, hm_layout *layout)
{
    static const clattn_heatmap_options defaults = {0};
    const clattn_heatmap_options *o = options ? options : &defaults;
    memset(layout, 0, sizeof *layout);
    layout->heads = heads;
    layout->rows = rows;
    layout->cols = cols;
    layout->scale = o->scale;
    layout->masked = o->masked;
    layout->masked_per_panel = o->masked_per_panel;
    layout->numbered = !(o->panel_title && heads == 1);
    layout->panel = o->panel_title ? o->panel_title : "head";
    layout->row_label = o->row_label ? o->row_label : "query";
    layout->col_label = o->col_label ? o->col_label : "key";
    layout->value_label = o->value_label                   ? o->value_label
                          : o->scale == CLATTN_HEATMAP_ROW ? "weight / row max"
                          : o->scale == CLATTN_HEATMAP_LOG ? "log10 weight"
                                                           : "weight";
    const size_t min_panel = o->min_panel == 0
                                 ? HM_MIN_PANEL
                                 : (o->min_panel > HM_MAX_PANEL ? HM_MAX_PANEL : o->min_panel);
    size_t longest = max_size(rows, cols);
    if (longest <= HM_MAX_PANEL) {
        layout->factor = 1;
        layout->cell = longest < min_panel ? (min_panel + longest - 1) / longest : 1;
        layout->map_w = cols * layout->cell;
        layout->map_h = rows * layout->cell;
    } else {
        layout->cell = 1;
        layout->factor = longest / HM_MAX_PANEL + (longest % HM_MAX_PANEL != 0);
        layout->map_w = cols / layout->factor + (cols % layout->factor != 0);
        layout->map_h = rows / layout->factor + (rows % layout->factor != 0);
        snprintf(layout->footer, sizeof layout->footer,
                 "max-pooled: %zu x %zu cells shown as %zu x %zu pixels, each the max of %zu x "
                 "%zu cells",
                 rows, cols, layout->map_h, layout->map_w, layout->factor, layout->factor);
        layout->footer_h = HM_TEXT_H + HM_GAP / 2;
    }
    const size_t row_label_w = hm_text_w(strlen(layout->row_label));
    layout->area_h = max_size(layout->map_h, row_label_w);
    layout->gutter =
        HM_TEXT_H + HM_LABEL_GAP + hm_text_w(decimal_digits(rows - 1)) + 2 + HM_TICK + 1;
    size_t title_w =
        hm_text_w(strlen(layout->panel) + (layout->numbered ? 1 + decimal_digits(heads - 1) : 0));
    layout->content_w = max_size(layout->map_w + 1 + hm_text_w(decimal_digits(cols - 1)) / 2,
                                 max_size(title_w, hm_text_w(strlen(layout->col_label))));
    layout->block_w = layout->gutter + layout->content_w;
    layout->block_h = HM_TEXT_H + HM_TITLE_GAP + layout->area_h + 1 + HM_TICK + 2 + HM_TEXT_H +
                      HM_LABEL_GAP + HM_TEXT_H;
    layout->per_row = heads < HM_PER_ROW ? heads : HM_PER_ROW;
    layout->grid_rows = heads / HM_PER_ROW + (heads % HM_PER_ROW != 0);
    size_t grid_w = layout->per_row * layout->block_w + (layout->per_row - 1) * HM_GAP;
    layout->bar_x = HM_MARGIN + grid_w + HM_GAP;
    layout->bar_y = HM_MARGIN + HM_TEXT_H + HM_TITLE_GAP;
    layout->bar_h = layout->area_h;
    layout->width = layout->bar_x +
                    max_size(HM_BAR_W + 1 + HM_TICK + 2 + hm_text_w(HM_BAR_LABEL_CHARS),
                             hm_text_w(strlen(layout->value_label))) +
                    HM_MARGIN;
    layout->width = max_size(layout->width, 2 * HM_MARGIN + hm_text_w(strlen(layout->footer)));
    if (layout->grid_rows > HM_MAX_SIDE) {
        layout->height = SIZE_MAX;
        return 1;
    }
    layout->height = 2 * HM_MARGIN + layout->grid_rows * layout->block_h +
                     (layout->grid_rows - 1) * HM_GAP + layout->footer_h;
    return layout->width > HM_MAX_SIDE || layout->height > HM_MAX_SIDE;
}

/* Image rows [y0, y1) held in memory, width * 3 bytes each. Drawing is clipped to them. */
typedef struct hm_canvas {
    unsigned char *pixels;
    long width, y0, y1;
} hm_canvas;

typedef struct hm_rgb {
    unsigned char r, g, b;
} hm_rgb;

static const hm_rgb hm_white = {255, 255, 255};
static const hm_rgb hm_ink = {32, 32, 32};
static const hm_rgb hm_frame = {96, 96, 96};
static const hm_rgb hm_nan = {230, 40, 200};     /* magenta: not on the ramp */
static const hm_rgb hm_masked = {176, 176, 176}; /* grey: masked cells, not on the ramp */

static void hm_fill(hm_canvas *canvas, long x, long y, long w, long h, hm_rgb colour)
{
    long x_end = x + w < canvas->width ? x + w : canvas->width;
    long y_end = y + h < canvas->y1 ? y + h : canvas->y1;
    for (long row = y > canvas->y0 ? y : canvas->y0; row < y_end; ++row) {
        unsigned char *line = canvas->pixels + (size_t)(row - canvas->y0) * canvas->width * 3;
        for (long col = x > 0 ? x : 0; col < x_end; ++col) {
            line[3 * col] = colour.r;
            line[3 * col + 1] = colour.g;
            line[3 * col + 2] = colour.b;
        }
    }
}

static void hm_outline(hm_canvas *canvas, long x, long y, long w, long h, hm_rgb colour)
{
    hm_fill(canvas, x, y, w, 1, colour);
    hm_fill(canvas, x, y + h - 1, w, 1, colour);
    hm_fill(canvas, x, y, 1, h, colour);
    hm_fill(canvas, x + w - 1, y, 1, h, colour);
}

static const unsigned char *hm_glyph(char ch)
{
    if (ch >= 'A' && ch <= 'Z')
        ch = (char)(ch - 'A' + 'a');
    for (size_t i = 0; i < sizeof font_glyphs / sizeof font_glyphs[0]; ++i) {
        if (font_glyphs[i].ch == ch)
            return font_glyphs[i].rows;
    }
    return font_missing_glyph;
}

/* Text with its top-left at (x, y); vertical text reads upwards, (x, y) the top-left of its
 * box (TH wide, text_w tall), the letters' tops facing left. */
static void hm_text(hm_canvas *canvas, long x, long y, const char *text, int vertical)
{
    long length = (long)hm_text_w(strlen(text));
    for (long index = 0; text[index] != '\0'; ++index) {
        const unsigned char *rows = hm_glyph(text[index]);
        for (long gy = 0; gy < FONT_GLYPH_ROWS; ++gy) {
            for (long gx = 0; gx < FONT_GLYPH_COLS; ++gx) {
                if (!(rows[gy] >> (FONT_GLYPH_COLS - 1 - gx) & 1))
                    continue;
                long u = index * HM_ADVANCE + gx * HM_SCALE; /* along the text */
                long v = gy * HM_SCALE;                      /* down the glyph */
                if (vertical)
                    hm_fill(canvas, x + v, y + length - u - HM_SCALE, HM_SCALE, HM_SCALE, hm_ink);
                else
                    hm_fill(canvas, x + u, y + v, HM_SCALE, HM_SCALE, hm_ink);
            }
        }
    }
}

/* The colour ramp: dark blue -> blue -> teal -> yellow, lightness rising monotonically. */
static hm_rgb hm_ramp(float t)
{
    static const float stops[4][3] = {{14, 16, 64}, {24, 88, 148}, {36, 160, 136}, {250, 228, 48}};
    if (!(t > 0.0f))
        t = 0.0f;
    if (t > 1.0f)
        t = 1.0f;
    float position = t * 3.0f;
    int segment = position >= 3.0f ? 2 : (int)position;
    float f = position - (float)segment;
    hm_rgb colour;
    unsigned char channel[3];
    for (int c = 0; c < 3; ++c) {
        float value = stops[segment][c] + (stops[segment + 1][c] - stops[segment][c]) * f;
        channel[c] = (unsigned char)(value + 0.5f);
    }
    colour.r = channel[0];
    colour.g = channel[1];
    colour.b = channel[2];
    return colour;
}

/* A weight's position on the ramp, 0 .. 1, under the layout's scale: row_max is the largest
 * visible weight of its row (ROW), vmax the largest of all (GLOBAL). */
static float hm_position_on_ramp(const hm_layout *layout, float weight, float row_max, float vmax)
{
    switch (layout->scale) {
    case CLATTN_HEATMAP_LOG:
        return weight > 0.0f ? (float)((log10((double)weight) + 4.0) / 4.0) : 0.0f;
    case CLATTN_HEATMAP_GLOBAL:
        return weight / vmax;
    default:
        return row_max > 0.0f ? weight / row_max : 0.0f;
    }
}

/* Pixel offset, inside the map, of the centre of cell `index` along an axis. */
static long hm_position(const hm_layout *layout, size_t index)
{
    if (layout->factor == 1)
        return (long)(index * layout->cell + layout->cell / 2);
    return (long)(index / layout->factor);
}

/* Whether ticks `distance` cells apart are at least min_px pixels apart (overflow-free). */
static int hm_far_enough(const hm_layout *layout, size_t distance, size_t min_px)
{
    if (layout->factor == 1)
        return distance >= (min_px + layout->cell - 1) / layout->cell;
    return distance / layout->factor >= min_px;
}

/* The step between tick numbers: the smallest of 1, 2, 5, 10, 20, 50, ... that leaves min_px
 * between neighbouring ticks and at most about HM_MAX_TICK_GAPS gaps along the axis; n when none
 * fits (then only the first and last are drawn). */
static size_t hm_tick_step(const hm_layout *layout, size_t n, size_t min_px)
{
    static const size_t mantissas[3] = {1, 2, 5};
    for (size_t scale = 1; scale < n && scale <= SIZE_MAX / 10; scale *= 10) {
        for (int m = 0; m < 3; ++m) {
            size_t step = mantissas[m] * scale;
            if (step >= n)
                return n;
            if (hm_far_enough(layout, step, min_px) && step >= (n - 1) / HM_MAX_TICK_GAPS)
                return step;
        }
    }
    return n;
}

static void hm_tick(hm_canvas *canvas, const hm_layout *layout, size_t index, long map_x,
                    long map_y, int vertical_axis)
{
    char label[24];
    snprintf(label, sizeof label, "%zu", index);
    long label_w = (long)hm_text_w(strlen(label));
    long at = hm_position(layout, index);
    if (vertical_axis) {
        long y = map_y + at;
        hm_fill(canvas, map_x - 1 - HM_TICK, y, HM_TICK, 1, hm_frame);
        hm_text(canvas, map_x - 1 - HM_TICK - 2 - label_w, y - HM_DIGIT_H / 2, label, 0);
    } else {
        long x = map_x + at;
        long below = map_y + (long)layout->map_h + 1;
        hm_fill(canvas, x, below, 1, HM_TICK, hm_frame);
        hm_text(canvas, x - label_w / 2, below + HM_TICK + 2, label, 0);
    }
}

/* Ticks along an axis of n cells: 0, the multiples of the step not too close to the last
 * index, and the last index unless it is too close to 0. */
static void hm_axis_ticks(hm_canvas *canvas, const hm_layout *layout, size_t n, size_t min_px,
                          long map_x, long map_y, int vertical_axis)
{
    size_t step = hm_tick_step(layout, n, min_px);
    size_t last = n - 1;
    hm_tick(canvas, layout, 0, map_x, map_y, vertical_axis);
    for (size_t index = step; index < last; index += step) {
        if (hm_far_enough(layout, last - index, min_px))
            hm_tick(canvas, layout, index, map_x, map_y, vertical_axis);
        if (index > SIZE_MAX - step)
            break;
    }
    if (last > 0 && hm_far_enough(layout, last, min_px))
        hm_tick(canvas, layout, last, map_x, map_y, vertical_axis);
}

/* The colour of the cells one pixel block covers (one cell when not pooled): the largest of
 * their ramp positions, skipping masked cells; masked grey when every cell is masked; NaN
 * magenta when any is NaN (a NaN is never hidden). */
static hm_rgb hm_block_colour(const hm_layout *layout, const float *map,
                              const unsigned char *masked, const float *row_max, float vmax,
                              size_t row0, size_t row_end, size_t col0, size_t col_end)
{
    float best = -INFINITY;
    for (size_t row = row0; row < row_end; ++row) {
        for (size_t col = col0; col < col_end; ++col) {
            const size_t at = row * layout->cols + col;
            if (masked && masked[at])
                continue;
            float value = map[at];
            if (isnan(value))
                return hm_nan;
            value = hm_position_on_ramp(layout, value, row_max ? row_max[row] : vmax, vmax);
            if (value > best)
                best = value;
        }
    }
    return best == -INFINITY ? hm_masked : hm_ramp(best);
}

static void hm_draw_map(hm_canvas *canvas, const hm_layout *layout, const float *map,
                        const unsigned char *masked, const float *row_max, float vmax, long map_x,
                        long map_y)
{
    long first = canvas->y0 > map_y ? canvas->y0 - map_y : 0;
    long end = canvas->y1 - map_y < (long)layout->map_h ? canvas->y1 - map_y : (long)layout->map_h;
    if (layout->factor == 1) {
        long cell = (long)layout->cell;
        for (long row = first / cell; row * cell < end; ++row) {
            for (size_t col = 0; col < layout->cols; ++col) {
                hm_rgb colour = hm_block_colour(layout, map, masked, row_max, vmax, (size_t)row,
                                                (size_t)row + 1, col, col + 1);
                hm_fill(canvas, map_x + (long)col * cell, map_y + row * cell, cell, cell, colour);
            }
        }
        return;
    }
    const size_t f = layout->factor;
    for (long py = first; py < end; ++py) {
        const size_t row0 = (size_t)py * f;
        const size_t row_end = row0 + f < layout->rows ? row0 + f : layout->rows;
        for (size_t px = 0; px < layout->map_w; ++px) {
            const size_t col0 = px * f, col_end = col0 + f < layout->cols ? col0 + f : layout->cols;
            hm_fill(
                canvas, map_x + (long)px, map_y + py, 1, 1,
                hm_block_colour(layout, map, masked, row_max, vmax, row0, row_end, col0, col_end));
        }
    }
}

static void hm_draw_block(hm_canvas *canvas, const hm_layout *layout, const float *weights,
                          float vmax, size_t head)
{
    long block_x = (long)(HM_MARGIN + (head % HM_PER_ROW) * (layout->block_w + HM_GAP));
    long block_y = (long)(HM_MARGIN + (head / HM_PER_ROW) * (layout->block_h + HM_GAP));
    long map_x = block_x + (long)layout->gutter;
    long map_y = block_y + HM_TEXT_H + HM_TITLE_GAP;
    long map_w = (long)layout->map_w, map_h = (long)layout->map_h;
    char title[176];
    if (layout->numbered)
        snprintf(title, sizeof title, "%.140s %zu", layout->panel, head);
    else
        snprintf(title, sizeof title, "%.150s", layout->panel);
    long title_w = (long)hm_text_w(strlen(title));
    hm_text(canvas, map_x + (map_w > title_w ? (map_w - title_w) / 2 : 0), block_y, title, 0);
    long query_h = (long)hm_text_w(strlen(layout->row_label));
    hm_text(canvas, block_x, map_y + (map_h > query_h ? (map_h - query_h) / 2 : 0),
            layout->row_label, 1);
    long key_w = (long)hm_text_w(strlen(layout->col_label));
    long key_y = map_y + map_h + 1 + HM_TICK + 2 + HM_TEXT_H + HM_LABEL_GAP;
    hm_text(canvas, map_x + (map_w > key_w ? (map_w - key_w) / 2 : 0), key_y, layout->col_label, 0);
    hm_outline(canvas, map_x - 1, map_y - 1, map_w + 2, map_h + 2, hm_frame);
    const size_t cells = layout->rows * layout->cols;
    const float *map = weights + head * cells;
    const unsigned char *masked =
        layout->masked ? layout->masked + (layout->masked_per_panel ? head * cells : 0) : NULL;
    /* ROW: each row's largest visible finite weight (no memory: the global scale instead). */
    float *row_max = NULL;
    if (layout->scale == CLATTN_HEATMAP_ROW &&
        (row_max = malloc(layout->rows * sizeof *row_max)) != NULL) {
        for (size_t row = 0; row < layout->rows; ++row) {
            float best = 0.0f;
            for (size_t col = 0; col < layout->cols; ++col) {
                const size_t at = row * layout->cols + col;
                if ((!masked || !masked[at]) && isfinite(map[at]) && map[at] > best)
                    best = map[at];
            }
            row_max[row] = best;
        }
    }
    hm_draw_map(canvas, layout, map, masked, row_max, vmax, map_x, map_y);
    free(row_max);
    hm_axis_ticks(canvas, layout, layout->rows, HM_DIGIT_H + 4, map_x, map_y, 1);
    size_t x_label_w = hm_text_w(decimal_digits(layout->cols - 1));
    hm_axis_ticks(canvas, layout, layout->cols, x_label_w + 8, map_x, map_y, 0);
}

static void hm_draw_bar(hm_canvas *canvas, const hm_layout *layout, float vmax)
{
    long x = (long)layout->bar_x, y = (long)layout->bar_y, h = (long)layout->bar_h;
    /* What the colours mean, over the bar (on the panels' title line). */
    hm_text(canvas, x, HM_MARGIN, layout->value_label, 0);
    for (long row = 0; row < h; ++row) {
        float t = h > 1 ? 1.0f - (float)row / (float)(h - 1) : 1.0f;
        hm_fill(canvas, x, y + row, HM_BAR_W, 1, hm_ramp(t));
    }
    hm_outline(canvas, x - 1, y - 1, HM_BAR_W + 2, h + 2, hm_frame);
    if (layout->masked) { /* the masked colour's swatch under the bar */
        const long swatch_y = y + h + 1 + HM_TICK + 2;
        hm_fill(canvas, x, swatch_y, HM_BAR_W, HM_TEXT_H, hm_masked);
        hm_outline(canvas, x - 1, swatch_y - 1, HM_BAR_W + 2, HM_TEXT_H + 2, hm_frame);
        hm_text(canvas, x + HM_BAR_W + 1 + HM_TICK + 2, swatch_y, "masked", 0);
    }
    const double values[3] = {layout->scale == CLATTN_HEATMAP_GLOBAL ? vmax : 1.0,
                              layout->scale == CLATTN_HEATMAP_GLOBAL ? vmax / 2.0
                              : layout->scale == CLATTN_HEATMAP_LOG  ? 0.01
                                                                     : 0.5,
                              layout->scale == CLATTN_HEATMAP_LOG ? 1e-4 : 0.0};
    const long offsets[3] = {0, (h - 1) / 2, h - 1};
    for (int i = 0; i < 3; ++i) {
        char label[32];
        if (layout->scale == CLATTN_HEATMAP_LOG)
            snprintf(label, sizeof label, "%s", i == 0 ? "1" : i == 1 ? "1e-2" : "1e-4");
        else
            snprintf(label, sizeof label, "%.3g", values[i]);
        hm_fill(canvas, x + HM_BAR_W + 1, y + offsets[i], HM_TICK, 1, hm_frame);
        hm_text(canvas, x + HM_BAR_W + 1 + HM_TICK + 2, y + offsets[i] - HM_DIGIT_H / 2, label, 0);
    }
}

typedef struct hm_job {
    const hm_layout *layout;
    const float *weights;
    float vmax;
    unsigned char *band; /* width * 3 * band rows */
} hm_job;

/* Renders each row of blocks into the band buffer and hands its rows to libpng. */
static void hm_write_rows(png_structp png, const hm_job *job)
{
    const hm_layout *layout = job->layout;
    size_t row_bytes = layout->width * 3;
    for (size_t grid_row = 0; grid_row < layout->grid_rows; ++grid_row) {
        size_t y0 = grid_row == 0 ? 0 : HM_MARGIN + grid_row * (layout->block_h + HM_GAP);
        size_t y1 = grid_row + 1 == layout->grid_rows
                        ? layout->height
                        : HM_MARGIN + (grid_row + 1) * (layout->block_h + HM_GAP);
        hm_canvas canvas = {job->band, (long)layout->width, (long)y0, (long)y1};
        hm_fill(&canvas, 0, (long)y0, (long)layout->width, (long)(y1 - y0), hm_white);
        for (size_t column = 0; column < HM_PER_ROW; ++column) {
            size_t head = grid_row * HM_PER_ROW + column;
            if (head < layout->heads)
                hm_draw_block(&canvas, layout, job->weights, job->vmax, head);
        }
        if (grid_row == 0)
            hm_draw_bar(&canvas, layout, job->vmax);
        if (grid_row + 1 == layout->grid_rows && layout->footer[0])
            hm_text(&canvas, HM_MARGIN, (long)(layout->height - HM_MARGIN - HM_TEXT_H),
                    layout->footer, 0);
        for (size_t y = y0; y < y1; ++y)
            png_write_row(png, job->band + (y - y0) * row_bytes);
    }
}

typedef struct hm_png_failure {
    char text[160];
} hm_png_failure;

static void hm_png_error(png_structp png, png_const_charp message)
{
    hm_png_failure *failure = png_get_error_ptr(png);
    if (failure != NULL)
        snprintf(failure->text, sizeof failure->text, "%s", message);
    png_longjmp(png, 1);
}

static void hm_png_warning(png_structp png, png_const_charp message)
{
    (void)png;
    (void)message;
}

/* libpng reports errors by longjmp to here: nothing this function changes after setjmp is
 * read after it, so no local needs to be volatile. */
static clattn_io_status hm_write_png(FILE *stream, const hm_job *job, hm_png_failure *failure)
{
    clattn_io_status status = CLATTN_IO_OK;
    png_infop info = NULL;
    png_structp png =
        png_create_write_struct(PNG_LIBPNG_VER_STRING, failure, hm_png_error, hm_png_warning);
    if (png != NULL)
        info = png_create_info_struct(png);
    if (png == NULL || info == NULL) {
        snprintf(failure->text, sizeof failure->text, "out of memory");
        status = CLATTN_IO_ERR_MEMORY;
        goto done;
    }
    if (setjmp(png_jmpbuf(png))) {
        status = CLATTN_IO_ERR_OPEN;
        goto done;
    }
    png_init_io(png, stream);
    png_set_IHDR(png, info, (png_uint_32)job->layout->width, (png_uint_32)job->layout->height, 8,
                 PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    hm_write_rows(png, job);
    png_write_end(png, info);
done:
    png_destroy_write_struct(&png, &info);
    return status;
}

/* Largest finite weight; 1 when there is no positive finite weight. */
static float hm_scale_max(const float *weights, size_t count)
{
    float vmax = 0.0f;
    for (size_t i = 0; i < count; ++i) {
        if (isfinite(weights[i]) && weights[i] > vmax)
            vmax = weights[i];
    }
    return vmax > 0.0f ? vmax : 1.0f;
}

clattn_io_status clattn_png_write_heatmap(const char *path, const float *weights, size_t heads,
                                          size_t rows, size_t cols, char *msg, size_t msg_size)
{
    return clattn_png_write_heatmap_ex(path, weights, heads, rows, cols, NULL, msg, msg_size);
}

clattn_io_status clattn_png_write_heatmap_ex(const char *path, const float *weights, size_t heads,
                                             size_t rows, size_t cols,
                                             const clattn_heatmap_options *options, char *msg,
                                             size_t msg_size)
{
    clattn_io_status status = CLATTN_IO_OK;
    FILE *stream = NULL;
    unsigned char *band = NULL;
    size_t count = 0;
    hm_layout layout;
    io_clear_message(msg, msg_size);
    if (path == NULL || weights == NULL || heads == 0 || rows == 0 || cols == 0) {
        status = io_fail(msg, msg_size, CLATTN_IO_ERR_ARGUMENT, path,
                         "clattn_png_write_heatmap: need a path, weights and heads, rows, cols > 0 "
                         "(got %zu, %zu, %zu)",
                         heads, rows, cols);
        goto done;
    }
    if (io_mul_overflows(heads, rows, &count) || io_mul_overflows(count, cols, &count)) {
        status = io_fail(msg, msg_size, CLATTN_IO_ERR_TOO_LARGE, path,
                         "%zu heads of %zu x %zu weights overflow the size of memory", heads, rows,
                         cols);
        goto done;
    }
    if (options && (unsigned)options->scale > (unsigned)CLATTN_HEATMAP_GLOBAL) {
        status = io_fail(msg, msg_size, CLATTN_IO_ERR_ARGUMENT, path,
                         "clattn_png_write_heatmap_ex: scale %d is not ROW, LOG or GLOBAL",
                         (int)options->scale);
        goto done;
    }
    if (hm_compute_layout(heads, rows, cols, options, &layout)) {
        char height[32];
        if (layout.height == SIZE_MAX)
            snprintf(height, sizeof height, "more than %d", HM_MAX_SIDE);
        else
            snprintf(height, sizeof height, "%zu", layout.height);
        status = io_fail(msg, msg_size, CLATTN_IO_ERR_TOO_LARGE, path,
                         "%zu heads of %zu x %zu need an image of %zu x %s pixels; the limit is "
                         "%d x %d",
                         heads, rows, cols, layout.width, height, HM_MAX_SIDE, HM_MAX_SIDE);
        goto done;
    }
    /* The tallest band: the first or last row of blocks with the margin and a gap. */
    size_t band_rows = HM_MARGIN + layout.block_h + HM_GAP + HM_MARGIN + layout.footer_h;
    band = malloc(layout.width * 3 * band_rows);
    if (band == NULL) {
        status = io_fail(msg, msg_size, CLATTN_IO_ERR_MEMORY, path, "out of memory for the image");
        goto done;
    }
    hm_job job = {&layout, weights, hm_scale_max(weights, count), band};
    /* The last band holds the last row of blocks, the margin and the footer. */
    stream = fopen(path, "wb");
    if (stream == NULL) {
        status =
            io_fail(msg, msg_size, CLATTN_IO_ERR_OPEN, path, "cannot create: %s", strerror(errno));
        goto done;
    }
    hm_png_failure failure = {""};
    status = hm_write_png(stream, &job, &failure);
    if (status != CLATTN_IO_OK)
        io_fail(msg, msg_size, status, path, "cannot write the PNG: libpng: %s", failure.text);
done:
    if (stream != NULL) {
        if (fclose(stream) != 0 && status == CLATTN_IO_OK)
            status = io_fail(msg, msg_size, CLATTN_IO_ERR_OPEN, path, "write error on close: %s",
                             strerror(errno));
        if (status != CLATTN_IO_OK)
            remove(path);
    }
    free(band);
    return status;
}
