/* rt_metrics.c - Prometheus text exposition of the runtime's figures.
 *
 * Format reference: "Exposition formats" of the Prometheus docs, text
 * format 0.0.4.  Values are printed with %.17g (exact round trip of a
 * double) and the special values as NaN / +Inf / -Inf. */
#include "rt_metrics.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "fmt_atomic.h"
#include "fmt_input.h"
#include "mc_alloc.h"

void rt_metrics_init(rt_metrics *m)
{
    if (m)
        memset(m, 0, sizeof *m);
}

const char *rt_metrics_reason_name(rt_refuse_reason r)
{
    switch (r) {
    case RT_REFUSE_PLAN:
        return "plan";
    case RT_REFUSE_INPUT:
        return "input";
    default:
        return "other";
    }
}

rt_refuse_reason rt_metrics_reason_of_status(int status)
{
    if (status == MC_ERR_PLAN)
        return RT_REFUSE_PLAN;
    if (status == MC_ERR_INVALID_ARG)
        return RT_REFUSE_INPUT;
    return RT_REFUSE_OTHER;
}

void rt_metrics_count(rt_metrics *m, int status, uint64_t n)
{
    if (!m)
        return;
    if (status == MC_OK)
        m->requests_served += n;
    else
        m->requests_refused[rt_metrics_reason_of_status(status)] += n;
}

uint64_t rt_metrics_peak_rss_bytes(void)
{
    /* VmHWM is the high water of this program image.  getrusage's ru_maxrss
     * is a fallback only: it also keeps the peak of the image before
     * exec(), i.e. of a large parent that forked us. */
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        unsigned long long kib = 0;
        int found = 0;
        while (!found && fgets(line, sizeof line, f))
            found = sscanf(line, "VmHWM: %llu kB", &kib) == 1;
        fclose(f);
        if (found)
            return (uint64_t)kib * 1024u;
    }
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0 || ru.ru_maxrss < 0)
        return 0;
    return (uint64_t)ru.ru_maxrss * 1024u; /* Linux reports KiB */
}

void rt_metrics_from_mcrt(rt_metrics *m, const mcrt *h)
{
    if (!m || !h)
        return;
    mcrt_info info;
    memset(&info, 0, sizeof info);
    if (mcrt_get_info(h, &info) == 0) {
        m->arena_bytes = info.arena_bytes;
        m->planned_bytes = info.planned_bytes;
    }
    mcrt_stats st;
    memset(&st, 0, sizeof st);
    mcrt_get_stats(h, &st);
    m->arena_high_water_bytes = st.arena_high_water_bytes;
    m->arena_touched_bytes = st.arena_touched_bytes;
    m->prefill_tokens = st.prefill_tokens;
    m->prefill_seconds = st.prefill_seconds;
    m->decode_tokens = st.decode_tokens;
    m->decode_seconds = st.decode_seconds;
    m->requests_served = st.requests - st.refused;
    m->requests_refused[RT_REFUSE_PLAN] = st.refused_plan;
    m->requests_refused[RT_REFUSE_INPUT] = st.refused_input;
    m->requests_refused[RT_REFUSE_OTHER] = st.refused_other;
    m->peak_rss_bytes = rt_metrics_peak_rss_bytes();
}

/* A growing text buffer; the first failure sticks (later appends no-op). */
typedef struct tbuf {
    char *p;
    size_t len, cap;
    int failed;
} tbuf;

__attribute__((format(printf, 2, 3))) static void tb_printf(tbuf *b,
                                                            const char *fmt,
                                                            ...)
{
    if (b->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->len;
        int n = vsnprintf(b->p ? b->p + b->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if ((size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 1024;
        while (cap - b->len <= (size_t)n)
            cap *= 2;
        char *q = mc_realloc(b->p, cap);
        if (!q) {
            b->failed = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

/* A sample value: integers exactly, doubles round-trip, specials spelled
 * the way the format wants them. */
static void tb_value(tbuf *b, double v)
{
    if (isnan(v))
        tb_printf(b, "NaN");
    else if (isinf(v))
        tb_printf(b, v > 0 ? "+Inf" : "-Inf");
    else
        tb_printf(b, "%.17g", v);
}

static void family(tbuf *b, const char *name, const char *type,
                   const char *help)
{
    tb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sample_u64(tbuf *b, const char *name, const char *type,
                       const char *help, uint64_t v)
{
    family(b, name, type, help);
    tb_printf(b, "%s %llu\n", name, (unsigned long long)v);
}

static void sample_f(tbuf *b, const char *name, const char *type,
                     const char *help, double v)
{
    family(b, name, type, help);
    tb_printf(b, "%s ", name);
    tb_value(b, v);
    tb_printf(b, "\n");
}

static double rate(uint64_t tokens, double seconds)
{
    return seconds > 0 ? (double)tokens / seconds : 0.0;
}

mc_status rt_metrics_format_prometheus(const rt_metrics *m, char **out,
                                       size_t *len, mc_error *err)
{
    if (!m || !out)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, NULL, -1,
                       "rt_metrics_format_prometheus: NULL argument");
    *out = NULL;
    if (len)
        *len = 0;
    tbuf b = {0};
    sample_u64(&b, "mcompile_planned_bytes", "gauge",
               "Bytes the memory plan reserves (weights + arena + reserve).",
               m->planned_bytes);
    sample_u64(&b, "mcompile_arena_bytes", "gauge",
               "Bytes of the one arena allocated at load.", m->arena_bytes);
    sample_u64(&b, "mcompile_arena_high_water_bytes", "gauge",
               "Highest arena byte offset touched + 1 (0 = not measured).",
               m->arena_high_water_bytes);
    sample_u64(&b, "mcompile_arena_touched_bytes", "gauge",
               "Arena bytes actually written (0 = not measured).",
               m->arena_touched_bytes);
    sample_u64(&b, "mcompile_peak_rss_bytes", "gauge",
               "Peak resident set size of the process (measured peak).",
               m->peak_rss_bytes);
    sample_u64(&b, "mcompile_prefill_tokens_total", "counter",
               "Prompt tokens run through prefill.", m->prefill_tokens);
    sample_f(&b, "mcompile_prefill_seconds_total", "counter",
             "Wall seconds spent in prefill.", m->prefill_seconds);
    sample_f(&b, "mcompile_prefill_tokens_per_second", "gauge",
             "Prefill throughput (prompt tokens per wall second).",
             rate(m->prefill_tokens, m->prefill_seconds));
    sample_u64(&b, "mcompile_decode_tokens_total", "counter",
               "Tokens generated by decode.", m->decode_tokens);
    sample_f(&b, "mcompile_decode_seconds_total", "counter",
             "Wall seconds spent in decode.", m->decode_seconds);
    sample_f(&b, "mcompile_decode_tokens_per_second", "gauge",
             "Decode throughput (generated tokens per wall second).",
             rate(m->decode_tokens, m->decode_seconds));
    sample_u64(&b, "mcompile_requests_served_total", "counter",
               "Requests that completed.", m->requests_served);
    family(&b, "mcompile_requests_refused_total", "counter",
           "Requests refused, by reason (plan: beyond the memory plan; "
           "input: malformed request; other: any other failure).");
    for (int r = 0; r < RT_REFUSE_COUNT_; r++)
        tb_printf(&b, "mcompile_requests_refused_total{reason=\"%s\"} %llu\n",
                  rt_metrics_reason_name((rt_refuse_reason)r),
                  (unsigned long long)m->requests_refused[r]);
    if (b.failed) {
        mc_free(b.p);
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1,
                       "out of memory formatting metrics");
    }
    *out = b.p;
    if (len)
        *len = b.len;
    return MC_OK;
}

mc_status rt_metrics_write_prometheus(const rt_metrics *m, const char *path,
                                      mc_error *err)
{
    if (!path)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, NULL, -1,
                       "rt_metrics_write_prometheus: NULL path");
    mc_status s = rt_metrics_check_path(path, err);
    if (s != MC_OK)
        return s;
    char *text = NULL;
    size_t len = 0;
    s = rt_metrics_format_prometheus(m, &text, &len, err);
    if (s != MC_OK)
        return s;
    fmt_atomic_file *f = NULL;
    s = fmt_atomic_create(path, &f, err);
    if (s == MC_OK) {
        s = fmt_atomic_write(f, text, len, err);
        if (s == MC_OK)
            s = fmt_atomic_commit(f, err);
        else
            fmt_atomic_abort(f);
    }
    mc_free(text);
    return s;
}

mc_status rt_metrics_check_path(const char *path, mc_error *err)
{
    return fmt_output_check_ours(path, "a metrics file mrun wrote",
                                 "# HELP mcompile_", NULL, 64, err);
}
