/* cmp_svg.c - render a memory plan as SVG (see cmp_svg.h). */
#include "cmp_svg.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "mc_alloc.h"

/* A growing text buffer; on allocation failure it remembers the failure
 * and ignores further appends, so callers check once at the end. */
typedef struct svg_buf {
    char *s;
    size_t len, cap;
    int failed;
} svg_buf;

static void put(svg_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void put(svg_buf *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s ? b->s + b->len : NULL,
                          b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if (b->s && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 8192;
        while (cap < b->len + (size_t)n + 1)
            cap *= 2;
        char *s = mc_realloc(b->s, cap);
        if (!s) {
            b->failed = 1;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

static double gib(uint64_t bytes)
{
    return (double)bytes / (1024.0 * 1024.0 * 1024.0);
}

/* Human size with a unit that keeps 3 significant digits readable. */
static const char *human(uint64_t bytes, char *buf, size_t n)
{
    if (bytes >= (1ull << 30))
        snprintf(buf, n, "%.2f GiB", gib(bytes));
    else if (bytes >= (1ull << 20))
        snprintf(buf, n, "%.1f MiB", (double)bytes / (1 << 20));
    else
        snprintf(buf, n, "%.1f KiB", (double)bytes / 1024.0);
    return buf;
}

enum { W = 960, H = 520, BAR_TOP = 70, BAR_BOTTOM = 440, BAR_X0 = 70,
       BAR_W = 56, BAR_GAP = 34, CHART_X0 = 520, CHART_X1 = 920 };

typedef struct segment {
    const char *cls, *label, *color;
    uint64_t bytes;
} segment;

static void draw_bar(svg_buf *b, int x, const char *title,
                     const cmp_plan *p, uint64_t scale_max)
{
    uint64_t head = p->total_bytes <= p->target_bytes
                        ? p->target_bytes - p->total_bytes : 0;
    segment segs[] = {
        {"seg-weights", "weights", "#4e79a7", p->weights_bytes},
        {"seg-kv", "KV cache", "#f28e2b", p->kv_bytes},
        {"seg-activations", "activations", "#59a14f", p->activation_bytes},
        {"seg-reserve", "reserve", "#9c755f", p->reserve_bytes},
        {"seg-headroom", "headroom", "#e6e6e6", head},
    };
    double px_per_byte = (double)(BAR_BOTTOM - BAR_TOP) / (double)scale_max;
    double y = BAR_BOTTOM;
    char h[32];
    put(b, "<g class=\"bar\" data-format=\"%s\" data-fits=\"%s\">\n",
        title, p->fits ? "true" : "false");
    for (size_t i = 0; i < sizeof segs / sizeof segs[0]; i++) {
        double hgt = (double)segs[i].bytes * px_per_byte;
        y -= hgt;
        put(b,
            "  <rect class=\"%s\" x=\"%d\" y=\"%.2f\" width=\"%d\" "
            "height=\"%.2f\" fill=\"%s\" stroke=\"#ffffff\" "
            "stroke-width=\"0.5\"><title>%s %s: %s</title></rect>\n",
            segs[i].cls, x, y, BAR_W, hgt, segs[i].color, title,
            segs[i].label, human(segs[i].bytes, h, sizeof h));
    }
    put(b,
        "  <text x=\"%d\" y=\"%d\" text-anchor=\"middle\" "
        "font-size=\"13\">%s</text>\n"
        "  <text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"11\" "
        "fill=\"%s\">%s%s</text>\n</g>\n",
        x + BAR_W / 2, BAR_BOTTOM + 18, title, x + BAR_W / 2, BAR_BOTTOM + 34,
        p->fits ? "#2b7a2b" : "#b22222", human(p->total_bytes, h, sizeof h),
        p->fits ? "" : " (over)");
}

static void draw_frontier(svg_buf *b, const cmp_plan *p)
{
    put(b, "<g id=\"frontier\">\n<text x=\"%d\" y=\"40\" font-size=\"15\" "
           "font-weight=\"bold\">batch x context that fits (%s weights)"
           "</text>\n", CHART_X0, p->req.policy.quant);
    if (p->nfrontier == 0) {
        put(b, "<text x=\"%d\" y=\"200\">nothing fits the target</text>\n"
               "</g>\n", CHART_X0);
        return;
    }
    uint64_t ymax = 1;
    uint32_t bmax = 1;
    for (size_t i = 0; i < p->nfrontier; i++) {
        if (p->frontier[i].max_seq > ymax)
            ymax = p->frontier[i].max_seq;
        if (p->frontier[i].batch > bmax)
            bmax = p->frontier[i].batch;
    }
    double lx = log2((double)bmax) > 0 ? log2((double)bmax) : 1;
    double cw = CHART_X1 - CHART_X0, ch = BAR_BOTTOM - BAR_TOP;
    put(b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#333\"/>\n"
           "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#333\"/>\n",
        CHART_X0, BAR_BOTTOM, CHART_X1, BAR_BOTTOM, CHART_X0, BAR_TOP,
        CHART_X0, BAR_BOTTOM);
    put(b, "<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\">"
           "max batch (log scale)</text>\n<text x=\"%d\" y=\"%d\" "
           "font-size=\"12\">max context (tokens)</text>\n",
        (CHART_X0 + CHART_X1) / 2, BAR_BOTTOM + 34, CHART_X0 - 10,
        BAR_TOP - 12);
    put(b, "<polyline class=\"frontier-line\" fill=\"none\" "
           "stroke=\"#4e79a7\" stroke-width=\"2\" points=\"");
    for (size_t i = 0; i < p->nfrontier; i++) {
        double x = CHART_X0 + cw * log2((double)p->frontier[i].batch) / lx;
        double y = BAR_BOTTOM - ch * (double)p->frontier[i].max_seq / (double)ymax;
        put(b, "%.1f,%.1f ", x, y);
    }
    put(b, "\"/>\n");
    for (size_t i = 0; i < p->nfrontier; i++) {
        double x = CHART_X0 + cw * log2((double)p->frontier[i].batch) / lx;
        double y = BAR_BOTTOM - ch * (double)p->frontier[i].max_seq / (double)ymax;
        put(b, "<circle class=\"frontier-point\" cx=\"%.1f\" cy=\"%.1f\" "
               "r=\"4\" fill=\"#4e79a7\"><title>batch %u: up to %llu "
               "tokens</title></circle>\n<text x=\"%.1f\" y=\"%d\" "
               "font-size=\"10\" text-anchor=\"middle\">%u</text>\n",
            x, y, p->frontier[i].batch,
            (unsigned long long)p->frontier[i].max_seq, x, BAR_BOTTOM + 14,
            p->frontier[i].batch);
    }
    if (p->limits.max_batch >= 1 && p->fits) {
        double x = CHART_X0 + cw * log2((double)p->limits.max_batch) / lx;
        double y = BAR_BOTTOM - ch * (double)p->limits.max_seq / (double)ymax;
        if (y < BAR_TOP)
            y = BAR_TOP;
        put(b, "<circle id=\"chosen-point\" class=\"chosen-point\" "
               "cx=\"%.1f\" cy=\"%.1f\" r=\"7\" fill=\"none\" "
               "stroke=\"#e15759\" stroke-width=\"2.5\"><title>chosen: batch "
               "%u x %llu tokens</title></circle>\n",
            x, y, p->limits.max_batch,
            (unsigned long long)p->limits.max_seq);
    }
    put(b, "<text x=\"%d\" y=\"%.1f\" font-size=\"10\" text-anchor=\"end\">"
           "%llu</text>\n</g>\n", CHART_X0 - 4, (double)BAR_TOP + 4,
        (unsigned long long)ymax);
}

mc_status cmp_plan_svg(const fmt_model_config *cfg, const cmp_plan *plan,
                       char **out, mc_error *err)
{
    static const char *const formats[] = {"f32", "f16", "int8", "int4"};
    enum { NF = sizeof formats / sizeof formats[0] };
    *out = NULL;
    cmp_plan *plans = mc_calloc(NF, sizeof *plans);
    if (!plans)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1,
                       "no memory for the plan picture");
    /* The same limits under each weight format: what the choice of format
     * buys at this batch x context. */
    uint64_t scale_max = plan->target_bytes;
    for (int i = 0; i < NF; i++) {
        cmp_plan_request r = plan->req;
        mc_status st = cmp_wpolicy_parse(formats[i], plan->req.policy.group,
                                         &r.policy, err);
        if (st != MC_OK) {
            mc_free(plans);
            return st;
        }
        r.max_batch = plan->limits.max_batch;
        r.max_seq = plan->limits.max_seq;
        st = cmp_plan_build(cfg, &r, &plans[i], NULL);
        if (st != MC_OK && st != MC_ERR_PLAN) {
            mc_free(plans);
            return mc_fail(err, st, NULL, formats[i], -1,
                           "could not plan the %s variant", formats[i]);
        }
        if (plans[i].total_bytes > scale_max)
            scale_max = plans[i].total_bytes;
    }
    if (scale_max == 0)
        scale_max = 1;

    svg_buf b = {0};
    char h1[32], h2[32];
    put(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" "
            "width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
            "font-family=\"sans-serif\">\n"
            CMP_SVG_MARK "\n"
            "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n",
        W, H, W, H, W, H);
    put(&b, "<text x=\"%d\" y=\"40\" font-size=\"15\" font-weight=\"bold\">"
            "memory at batch %u x %llu tokens, target %s</text>\n",
        BAR_X0 - 40, plan->limits.max_batch,
        (unsigned long long)plan->limits.max_seq,
        human(plan->target_bytes, h1, sizeof h1));
    put(&b, "<g id=\"budget-bars\">\n");
    for (int i = 0; i < NF; i++)
        draw_bar(&b, BAR_X0 + i * (BAR_W + BAR_GAP), formats[i], &plans[i],
                 scale_max);
    double ty = BAR_BOTTOM - (double)(BAR_BOTTOM - BAR_TOP) *
                                 (double)plan->target_bytes / (double)scale_max;
    put(&b, "<line id=\"target-line\" class=\"target-line\" x1=\"%d\" "
            "y1=\"%.2f\" x2=\"%d\" y2=\"%.2f\" stroke=\"#e15759\" "
            "stroke-dasharray=\"6 4\" stroke-width=\"1.5\"/>\n"
            "<text x=\"%d\" y=\"%.2f\" font-size=\"11\" fill=\"#e15759\">"
            "target</text>\n<text x=\"%d\" y=\"%.2f\" font-size=\"11\" "
            "fill=\"#e15759\">%s</text>\n</g>\n",
        BAR_X0 - 10, ty, BAR_X0 + NF * (BAR_W + BAR_GAP) - BAR_GAP + 6, ty,
        BAR_X0 + NF * (BAR_W + BAR_GAP) - BAR_GAP + 10, ty - 4,
        BAR_X0 + NF * (BAR_W + BAR_GAP) - BAR_GAP + 10, ty + 10,
        human(plan->target_bytes, h2, sizeof h2));
    /* legend */
    static const char *const names[] = {"weights", "KV cache", "activations",
                                        "reserve", "headroom"};
    static const char *const colors[] = {"#4e79a7", "#f28e2b", "#59a14f",
                                         "#9c755f", "#e6e6e6"};
    put(&b, "<g id=\"legend\">\n");
    for (int i = 0; i < 5; i++)
        put(&b, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" "
                "fill=\"%s\" stroke=\"#999\"/><text x=\"%d\" y=\"%d\" "
                "font-size=\"11\">%s</text>\n",
            BAR_X0 - 40 + i * 86, H - 30, colors[i], BAR_X0 - 24 + i * 86,
            H - 20, names[i]);
    put(&b, "</g>\n");
    draw_frontier(&b, plan);
    put(&b, "</svg>\n");
    mc_free(plans);
    if (b.failed) {
        mc_free(b.s);
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1,
                       "no memory for the plan picture");
    }
    *out = b.s;
    return MC_OK;
}
