/* rt_plan.c - the stored plan: make, write, read, check (see rt_plan.h). */
#include "rt_plan.h"

#include <stdio.h>
#include <string.h>

#include "mc_checked.h"

mc_status rt_plan_make(const fmt_model_config *cfg, const rt_limits *lim,
                       uint64_t weights_bytes, uint64_t reserve_bytes,
                       rt_plan *out, mc_error *err)
{
    memset(out, 0, sizeof *out);
    mc_status st = rt_layout_build(cfg, lim, &out->layout, err);
    if (st != MC_OK)
        return st;
    out->weights_bytes = weights_bytes;
    out->reserve_bytes = reserve_bytes;
    if (!mc_add_u64(weights_bytes, out->layout.arena_bytes,
                    &out->total_bytes) ||
        !mc_add_u64(out->total_bytes, reserve_bytes, &out->total_bytes))
        return mc_fail(err, MC_ERR_OVERFLOW, NULL, "total_bytes", -1,
                       "weights + arena + reserve overflow 64 bits");
    return MC_OK;
}

mc_status rt_plan_job_budget(uint64_t line_bytes, uint64_t hold_bytes,
                             uint64_t max_seq, rt_job_budget *out,
                             mc_error *err)
{
    memset(out, 0, sizeof *out);
    if (line_bytes < RT_JOB_MIN_LINE_BYTES ||
        line_bytes > RT_JOB_MAX_LINE_BYTES)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "--max-line-bytes", -1,
                       "%llu is not in %llu..%llu",
                       (unsigned long long)line_bytes,
                       RT_JOB_MIN_LINE_BYTES, RT_JOB_MAX_LINE_BYTES);
    if (hold_bytes < 1)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "--hold-bytes", -1,
                       "expected >= 1 byte");
    uint64_t a, b, t;
    out->line_bytes = line_bytes;
    out->hold_bytes = hold_bytes;
    out->scratch_bytes = RT_JOB_SCRATCH_PER_LINE_BYTE * line_bytes;
    if (!mc_mul_u64(max_seq, RT_JOB_LINE_PER_TOKEN, &a) ||
        !mc_add_u64(a, RT_JOB_LINE_PER_LINE_BYTE * line_bytes, &a) ||
        !mc_add_u64(a, RT_JOB_LINE_BASE, &out->one_line_bytes) ||
        !mc_add_u64(line_bytes + 1, out->scratch_bytes, &b) ||
        !mc_add_u64(b, hold_bytes, &t) ||
        !mc_add_u64(t, out->one_line_bytes, &out->total_bytes))
        return mc_fail(err, MC_ERR_OVERFLOW, NULL, "--hold-bytes", -1,
                       "the job's budget overflows 64 bits");
    return MC_OK;
}

uint64_t rt_plan_heap_chunk(uint64_t n)
{
    uint64_t c = (n + 8 + 15) & ~(uint64_t)15;
    return c < 32 ? 32 : c;
}

static json_t *u64j(uint64_t v) { return json_integer((json_int_t)v); }

int rt_plan_to_json(const rt_plan *p, json_t *o)
{
    const rt_layout *l = &p->layout;
    json_t *bufs = json_array();
    int bad = bufs == NULL;
    for (int i = 0; !bad && i < RT_BUF_COUNT_; i++) {
        const rt_buffer *b = &l->buf[i];
        bad |= json_array_append_new(
            bufs, json_pack("{s:i, s:s, s:I, s:I, s:i, s:i}", "id", i, "name",
                            rt_layout_buf_name((rt_buf_id)i), "offset",
                            (json_int_t)b->offset, "bytes",
                            (json_int_t)b->bytes, "first", (int)b->first,
                            "last", (int)b->last));
    }
    bad |= json_object_set_new(o, "weights_bytes", u64j(p->weights_bytes));
    bad |= json_object_set_new(o, "kv_slot_bytes", u64j(l->kv_slot_bytes));
    bad |= json_object_set_new(o, "kv_bytes", u64j(l->kv_bytes));
    bad |= json_object_set_new(o, "activation_bytes", u64j(l->activation_bytes));
    bad |= json_object_set_new(o, "arena_bytes", u64j(l->arena_bytes));
    bad |= json_object_set_new(o, "reserve_bytes", u64j(p->reserve_bytes));
    bad |= json_object_set_new(o, "device", json_string(p->cuda ? "cuda" : "cpu"));
    bad |= json_object_set_new(o, "total_bytes", u64j(p->total_bytes));
    bad |= json_object_set_new(o, "target_bytes", u64j(p->target_bytes));
    bad |= json_object_set_new(o, "max_batch", u64j(l->limits.max_batch));
    bad |= json_object_set_new(o, "max_seq", u64j(l->limits.max_seq));
    bad |= json_object_set_new(o, "prefill_chunk", u64j(l->limits.prefill_chunk));
    bad |= json_object_set_new(o, "threads", json_integer(l->limits.threads));
    bad |= json_object_set_new(o, "kv_type",
                               json_string(kn_kvtype_name(l->limits.kv_type)));
    bad |= json_object_set_new(o, "buffers", bufs);
    return bad ? -1 : 0;
}

/* An integer key in [lo, hi] into *out; 0 if absent or out of range. */
static int get_int(const json_t *o, const char *key, json_int_t lo,
                   json_int_t hi, json_int_t *out)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < lo ||
        json_integer_value(v) > hi)
        return 0;
    *out = json_integer_value(v);
    return 1;
}

static mc_status read_limits(const json_t *o, const char *path,
                             rt_limits *lim, mc_error *err)
{
    json_int_t b, s, c, t;
    memset(lim, 0, sizeof *lim);
    const json_t *k = json_object_get(o, "kv_type");
    if (!get_int(o, "max_batch", 1, UINT32_MAX, &b) ||
        !get_int(o, "max_seq", 1, INT64_MAX, &s) ||
        !get_int(o, "prefill_chunk", 1, UINT32_MAX, &c) ||
        !get_int(o, "threads", 1, 256, &t) || !json_is_string(k) ||
        !json_is_integer(json_object_get(o, "arena_bytes")) ||
        !json_is_array(json_object_get(o, "buffers")))
        return mc_fail(err, MC_ERR_FORMAT, path, "plan", -1,
                       "manifest plan lacks max_batch, max_seq, "
                       "prefill_chunk, threads, kv_type, arena_bytes or "
                       "buffers (or has them out of range)");
    if (kn_kvtype_parse(json_string_value(k), &lim->kv_type) != 0)
        return mc_fail(err, MC_ERR_FORMAT, path, "plan.kv_type", -1,
                       "manifest plan kv_type '%s' is not f32, f16 or int8",
                       json_string_value(k));
    lim->max_batch = (uint32_t)b;
    lim->max_seq = (uint64_t)s;
    lim->prefill_chunk = (uint32_t)c;
    lim->threads = (int)t;
    return MC_OK;
}

/* Every stored buffer (offset and size) and the arena equal the layout. */
static int buffers_equal(const json_t *o, const rt_layout *lay)
{
    const json_t *bufs = json_object_get(o, "buffers");
    int same = (uint64_t)json_integer_value(json_object_get(o, "arena_bytes")) ==
                   lay->arena_bytes &&
               json_array_size(bufs) == RT_BUF_COUNT_;
    for (size_t i = 0; same && i < RT_BUF_COUNT_; i++) {
        const json_t *e = json_array_get(bufs, i);
        const json_t *off = json_object_get(e, "offset"),
                     *by = json_object_get(e, "bytes");
        same = json_is_integer(off) && json_is_integer(by) &&
               (uint64_t)json_integer_value(off) == lay->buf[i].offset &&
               (uint64_t)json_integer_value(by) == lay->buf[i].bytes;
    }
    return same;
}

/* The stored figures equal what the model and the layout imply: a doctored
 * total (e.g. a smaller one to pass a memory check, with the checksums
 * redone) is refused. */
static mc_status check_totals(const json_t *o, const rt_plan *p,
                              const char *path, mc_error *err)
{
    static const char *const keys[] = {"weights_bytes", "kv_bytes",
                                       "activation_bytes", "reserve_bytes",
                                       "total_bytes"};
    const uint64_t want[5] = {p->weights_bytes, p->layout.kv_bytes,
                              p->layout.activation_bytes, p->reserve_bytes,
                              p->total_bytes};
    for (size_t i = 0; i < 5; i++) {
        json_int_t v;
        if (!get_int(o, keys[i], 0, INT64_MAX, &v))
            return mc_fail(err, MC_ERR_FORMAT, path, "plan", -1,
                           "manifest plan lacks %s (or it is negative)",
                           keys[i]);
        if ((uint64_t)v != want[i])
            return mc_fail(err, MC_ERR_FORMAT, path, "plan", -1,
                           "manifest plan %s is %lld bytes, but the artifact "
                           "implies %llu (weights from its tensor table, "
                           "arena from its limits, total = weights + arena + "
                           "reserve); refusing a manifest whose figures "
                           "disagree", keys[i], (long long)v,
                           (unsigned long long)want[i]);
    }
    /* "fits" (the compiler's, when it wrote one): the dataset job's
     * default buffers (job_bytes) and the total both within the target,
     * as cmp_plan computes it */
    const json_t *fits = json_object_get(o, "fits");
    if (fits) {
        json_int_t target, job = 0;
        if (!get_int(o, "target_bytes", 0, INT64_MAX, &target) ||
            !json_is_boolean(fits) ||
            (json_object_get(o, "job_bytes") &&
             !get_int(o, "job_bytes", 0, INT64_MAX, &job)))
            return mc_fail(err, MC_ERR_FORMAT, path, "plan", -1,
                           "manifest plan needs integers target_bytes and "
                           "job_bytes >= 0 beside a boolean fits");
        int want = job <= target &&
                   p->total_bytes <= (uint64_t)target - (uint64_t)job;
        if (json_is_true(fits) != want)
            return mc_fail(err, MC_ERR_FORMAT, path, "plan", -1,
                           "manifest plan says fits %s with total_bytes %llu "
                           "and job_bytes %lld against target_bytes %lld; "
                           "expected fits = (job + total <= target)",
                           json_is_true(fits) ? "true" : "false",
                           (unsigned long long)p->total_bytes, (long long)job,
                           (long long)target);
    }
    return MC_OK;
}

mc_status rt_plan_from_json(const json_t *o, const fmt_model_config *cfg,
                            uint64_t weights_bytes, const char *path,
                            rt_plan *out, mc_error *err)
{
    memset(out, 0, sizeof *out);
    rt_limits lim;
    json_int_t reserve;
    mc_status st = read_limits(o, path, &lim, err);
    if (st != MC_OK)
        return st;
    if (!get_int(o, "reserve_bytes", 0, INT64_MAX, &reserve))
        return mc_fail(err, MC_ERR_FORMAT, path, "plan", -1,
                       "manifest plan lacks reserve_bytes (or it is "
                       "negative)");
    if ((st = rt_plan_make(cfg, &lim, weights_bytes, (uint64_t)reserve, out,
                           err))) {
        if (st == MC_ERR_OVERFLOW)
            return mc_fail(err, MC_ERR_FORMAT, path, "plan", -1,
                           "manifest plan's totals overflow 64 bits");
        /* the limits came from the artifact: name it */
        if (err && !err->file[0] && path)
            snprintf(err->file, sizeof err->file, "%s", path);
        return st;
    }
    const json_t *dv = json_object_get(o, "device");
    if (dv && (!json_is_string(dv) ||
               (strcmp(json_string_value(dv), "cpu") != 0 &&
                strcmp(json_string_value(dv), "cuda") != 0)))
        return mc_fail(err, MC_ERR_FORMAT, path, "plan.device", -1,
                       "expected \"cpu\" or \"cuda\"");
    out->cuda = dv && strcmp(json_string_value(dv), "cuda") == 0;
    json_int_t target = 0; /* a report key: absent or odd means unknown */
    if (get_int(o, "target_bytes", 0, INT64_MAX, &target))
        out->target_bytes = (uint64_t)target;
    if (!buffers_equal(o, &out->layout))
        return mc_fail(err, MC_ERR_PLAN, path, "plan", -1,
                       "the artifact's arena plan (batch %u, max_seq %llu, "
                       "chunk %u) differs from this runtime's layout for the "
                       "same limits; recompile the artifact", lim.max_batch,
                       (unsigned long long)lim.max_seq, lim.prefill_chunk);
    return check_totals(o, out, path, err);
}

static int limits_equal(const rt_limits *a, const rt_limits *b)
{
    return a->max_batch == b->max_batch && a->max_seq == b->max_seq &&
           a->prefill_chunk == b->prefill_chunk && a->kv_type == b->kv_type;
}

mc_status rt_plan_session_layout(const fmt_model_config *cfg,
                                 const rt_limits *lim,
                                 const rt_layout *stored, const char *path,
                                 rt_layout *out, mc_error *err)
{
    mc_status st = rt_layout_build(cfg, lim, out, err);
    if (st != MC_OK || !stored)
        return st;
    rt_layout check;
    rt_limits lp = stored->limits;
    if (rt_layout_build(cfg, &lp, &check, NULL) != MC_OK ||
        !limits_equal(&check.limits, &out->limits) ||
        check.arena_bytes != stored->arena_bytes ||
        memcmp(check.buf, stored->buf, sizeof check.buf) != 0)
        return mc_fail(err, MC_ERR_PLAN, path, "layout", -1,
                       "stored plan (batch %u, max_seq %llu, chunk %u, %llu "
                       "arena bytes) does not match the requested limits "
                       "(batch %u, max_seq %llu, chunk %u, needs %llu bytes) "
                       "or this model",
                       stored->limits.max_batch,
                       (unsigned long long)stored->limits.max_seq,
                       stored->limits.prefill_chunk,
                       (unsigned long long)stored->arena_bytes,
                       out->limits.max_batch,
                       (unsigned long long)out->limits.max_seq,
                       out->limits.prefill_chunk,
                       (unsigned long long)out->arena_bytes);
    int threads = out->limits.threads;
    *out = *stored;
    if (threads < out->limits.threads)
        out->limits.threads = threads;
    return MC_OK;
}
