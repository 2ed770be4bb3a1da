/* cli_compile_report.c - what `mcompile MODEL --target ...` prints
 * (cli_compile_report.h). */
#include "cli_compile_report.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "mc_alloc.h"

#define GIB 1073741824.0

/* "13.49 GiB", "4.6 MiB", "386.3 KiB": readable at every model size. */
static const char *human_size(uint64_t b, char *buf, size_t n)
{
    if (b >= (1ull << 30))
        snprintf(buf, n, "%.2f GiB", (double)b / GIB);
    else if (b >= (1ull << 20))
        snprintf(buf, n, "%.1f MiB", (double)b / (1 << 20));
    else
        snprintf(buf, n, "%.1f KiB", (double)b / 1024.0);
    return buf;
}

double cmp_cli_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The plan before calibration starts (cmp_calib_plan): peak RSS by part
 * and the time estimate by phase. */
static void print_calib_plan(FILE *out, const cmp_calib_plan *p)
{
    const cmp_calib_mem *m = &p->mem;
    const double M = 1048576.0;
    uint64_t layers = m->peak + p->source_layers + p->program;
    uint64_t ends = m->ends_peak + p->source_ends + p->spill + p->program;
    fprintf(out, "calibration plan: peak RSS %.1f MiB, the larger of the "
            "layers %.1f = states %.1f + one block's weights %.1f + "
            "statistics %.1f + work and results %.1f (mc_alloc peak %.1f at "
            "%s) + source mapping %.1f (of %.1f) + program %.1f, and the ends "
            "%.1f = mc_alloc %.1f + source mapping %.1f + spill mapping %.1f "
            "+ program %.1f MiB\n", p->rss / M, layers / M, m->states / M,
            m->block / M, m->stats / M,
            (m->peak - m->states - m->block - m->stats) / M, m->peak / M,
            m->phase ? m->phase : "-", p->source_layers / M, p->source / M,
            p->program / M, ends / M, m->ends_peak / M, p->source_ends / M,
            p->spill / M, p->program / M);
    double madds = 0.0;
    for (int i = 0; i < CMP_PH_COUNT; i++)
        madds += p->madds[i];
    fprintf(out, "calibration plan: time ~%.0f s (%.1f forward passes over "
            "the calibration tokens; on cores of its own, "
            "longer under load; per phase within ~1.5x on the runs "
            "checked): forward %.0f s, statistics "
            "%.0f s, factorization %.0f s, search %.0f s, held-out %.0f s; "
            "%.3g multiply-adds, a float GEMM at %.1f G/s measured at start\n",
            p->total_s, p->forward_once_s > 0.0 ? p->total_s / p->forward_once_s : 0.0,
            p->seconds[CMP_PH_FORWARD], p->seconds[CMP_PH_STATS],
            p->seconds[CMP_PH_FACTOR], p->seconds[CMP_PH_SEARCH],
            p->seconds[CMP_PH_ENDS], madds, p->rate / 1e9);
}

static json_t *calib_plan_json(const cmp_calib_plan *p)
{
    const cmp_calib_mem *m = &p->mem;
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, "
                     "s:f, s:f, s:{s:f, s:f, s:f, s:f, s:f}}",
                     "peak_rss_bytes", (json_int_t)p->rss, "states_bytes",
                     (json_int_t)m->states, "block_bytes", (json_int_t)m->block,
                     "statistics_bytes", (json_int_t)m->stats, "alloc_peak_bytes",
                     (json_int_t)m->peak, "alloc_ends_peak_bytes",
                     (json_int_t)m->ends_peak, "spill_bytes", (json_int_t)p->spill,
                     "source_bytes", (json_int_t)p->source,
                     "source_layers_bytes", (json_int_t)p->source_layers,
                     "source_ends_bytes", (json_int_t)p->source_ends, "program_bytes",
                     (json_int_t)p->program, "multiply_adds",
                     (json_int_t)(p->madds[0] + p->madds[1] + p->madds[2] +
                                  p->madds[3] + p->madds[4]),
                     "rate_madds_per_s", p->rate, "seconds", p->total_s,
                     "forward_once_seconds", p->forward_once_s,
                     "phase_seconds", "forward", p->seconds[0], "statistics",
                     p->seconds[1], "factorization", p->seconds[2], "search",
                     p->seconds[3], "held_out", p->seconds[4]);
}

void cmp_cli_calib_progress(void *ctx, const cmp_calib_progress *p)
{
    cmp_cli_calib_prog *c = ctx;
    if (p->plan) {
        if (c->plan_on)
            print_calib_plan(stderr, p->plan);
        return;
    }
    double t = cmp_cli_mono_s();
    if (!c->on || (t - c->last < 0.25 && p->layer < p->layers))
        return;
    c->last = t;
    fprintf(stderr, "\rcalibrating: layer %u/%u, %.0f s, ETA %.0f s   ",
            p->layer, p->layers, p->elapsed_s, p->eta_s);
    if (p->layer == p->layers)
        fputc('\n', stderr);
}

/* The effort the default cap cut to, against the options' (both in
 * forward passes over the calibration tokens). */
static void print_capped(FILE *out, const cmp_calib_effort *e,
                         const cmp_calib_effort *most, double passes)
{
    char opts[128];
    double once = most->forward_once_s > 0.0 ? most->forward_once_s : 1.0;
    fprintf(out, "calibration effort: %s (%.1f forward passes over the "
            "calibration tokens: the options as given, %.1f, are over "
            "the cap of %g; --calib-passes 0 keeps them)\n",
            cmp_calib_effort_options(e, opts, sizeof opts),
            e->estimate_s / once, most->estimate_s / once, passes);
}

void cmp_cli_calib_capped(void *ctx, const cmp_calib_effort *chosen,
                          const cmp_calib_effort *given, double passes)
{
    const cmp_cli_calib_prog *c = ctx;
    if (c->plan_on)
        print_capped(stderr, chosen, given, passes);
}

/* The effort calibrated with: its options (which reproduce it without a
 * budget) and, under --calib-time, the estimates the choice compared. */
static void print_effort(FILE *out, const cmp_compile_report *rep)
{
    char opts[128];
    const cmp_calib_effort *e = &rep->calib_effort;
    cmp_calib_effort_options(e, opts, sizeof opts);
    const cmp_calib_effort *most = &rep->calib_effort_most;
    double once = most->forward_once_s;
    if (rep->calib_budget_s > 0.0)
        fprintf(out, "calibration effort: %s (estimate %.0f s within the "
                "budget of %.0f s; the options as given: %.0f s); these "
                "options reproduce the artifact without --calib-time\n",
                opts, e->estimate_s, rep->calib_budget_s,
                most->estimate_s);
    else if (rep->calib_capped)
        print_capped(out, e, most, rep->calib_passes);
    else if (rep->calib_passes > 0.0 && once > 0.0 &&
             e->estimate_s > rep->calib_passes * once)
        fprintf(out, "calibration effort: %s (%.1f forward passes over the "
                "calibration tokens, over the cap of %g but within its "
                "floor, %.0f minutes at %.0f G multiply-adds/s: a short "
                "compile keeps its effort)\n",
                opts, e->estimate_s / once, rep->calib_passes,
                CMP_CALIB_PASSES_FLOOR_S / 60.0, CMP_CALIB_NOMINAL_RATE / 1e9);
    else if (rep->calib_passes > 0.0 && once > 0.0)
        fprintf(out, "calibration effort: %s (%.1f forward passes over the "
                "calibration tokens, within the cap of %g)\n",
                opts, e->estimate_s / once, rep->calib_passes);
    else
        fprintf(out, "calibration effort: %s\n", opts);
}

static json_t *effort_json(const cmp_compile_report *rep)
{
    char opts[128];
    const cmp_calib_effort *e = &rep->calib_effort;
    json_t *j = json_pack("{s:I, s:s, s:I, s:s}", "stages",
                          (json_int_t)e->stages, "method",
                          cmp_qmethod_name(e->method), "sequences",
                          (json_int_t)e->seqs, "options",
                          cmp_calib_effort_options(e, opts, sizeof opts));
    if (j && e->full_layers)
        json_object_set_new(j, "full_layers", json_integer((json_int_t)e->full_layers));
    if (j)
        json_object_set_new(j, "refine", json_boolean(!e->no_refine));
    if (j && rep->calib_budget_s > 0.0) {
        json_object_set_new(j, "budget_seconds", json_real(rep->calib_budget_s));
        json_object_set_new(j, "estimate_seconds", json_real(e->estimate_s));
        json_object_set_new(j, "options_given_estimate_seconds",
                            json_real(rep->calib_effort_most.estimate_s));
    }
    double once = rep->calib_effort_most.forward_once_s;
    if (j && rep->calib_passes > 0.0 && once > 0.0) {
        json_object_set_new(j, "cap_forward_passes", json_real(rep->calib_passes));
        json_object_set_new(j, "forward_passes", json_real(e->estimate_s / once));
        json_object_set_new(j, "options_given_forward_passes",
                            json_real(rep->calib_effort_most.estimate_s / once));
    }
    return j;
}

/* The per-layer table (cmp_calib_table_row) and the summary lines. */
static void print_calib(FILE *out, const cmp_compile_report *rep, int verbose)
{
    const cmp_calib_result *r = rep->calib;
    size_t n = (size_t)r->layers * CMP_LIN_COUNT, nf[4] = {0};
    double e = 0.0, erq = 0.0;
    for (size_t i = 0; i < n; i++) {
        kn_wformat f = r->t[i].fmt;
        nf[f == KN_W_Q4 || f == KN_W_Q4S ? 0 : f == KN_W_Q8 ? 1 : 2]++;
        e += r->t[i].err;
        erq += r->t[i].err_rtn;
    }
    {
        char row[256];
        fprintf(out, "%s\n", cmp_calib_table_header());
        for (size_t i = 0; i < n; i++)
            fprintf(out, "%s\n",
                    cmp_calib_table_row(&r->t[i], rep->calib_group, row,
                                        sizeof row));
    }
    fprintf(out, "calibrated %zu linears on %zu tokens (%zu sequences, %zu "
            "held out): int4 %zu, int8 %zu, float %zu; mean error %.5f "
            "(rtn %.5f)\n", n, r->calib_tokens, rep->calib_seqs,
            rep->heldout_seqs, nf[0], nf[1], nf[2], n ? e / n : 0.0,
            n ? erq / n : 0.0);
    if (r->prescale_tokens && r->prescale_tokens < r->calib_tokens)
        fprintf(out, "AWQ pre-scaling statistics from %zu of the tokens "
                "(every %zu-th sequence)\n", r->prescale_tokens,
                cmp_calib_prescale_stride(r->calib_tokens));
    {
        /* what the calibration planned to hold (cmp_calib_memory) */
        const cmp_calib_mem *mm = &r->mem;
        static const char *const tap[4] = {"q/k/v", "o_proj", "gate/up",
                                           "down_proj"};
        char lean[64] = "";
        for (int p = 0; p < 4; p++)
            if (mm->lean & (1u << p))
                snprintf(lean + strlen(lean), sizeof lean - strlen(lean),
                         "%s%s", lean[0] ? ", " : "", tap[p]);
        fprintf(out, "calibration memory: planned peak %.1f MiB (at %s), "
                "spilled %.1f MiB to disk; lean statistics: %s%s%s\n",
                mm->peak / 1048576.0, mm->phase ? mm->phase : "-",
                mm->spill / 1048576.0, lean[0] ? lean : "none",
                (mm->lean & CMP_CALIB_LEAN_DOWN_STORE)
                    ? "; down_proj's inputs not stored (whole-block final moves)"
                    : "",
                (mm->lean & CMP_CALIB_LEAN_REFIT_HW)
                    ? "; no H w kept between scale refits" : "");
        if (mm->device)
            fprintf(out, "calibration device memory: statistics %.1f MiB (at %s)\n",
                    mm->device / 1048576.0, mm->device_phase ? mm->device_phase : "-");
    }
    /* a cut effort is always said: the user did not ask for it */
    if (verbose || rep->calib_budget_s > 0.0 || rep->calib_capped)
        print_effort(out, rep);
    if (r->rotated)
        fprintf(out, "rotated: residual stream (Hadamard blocks of %u), value "
                "heads (%u)\n", r->rot_block, r->rot_head_block);
    if (r->has_heldout)
        fprintf(out, "held out: KLD mean %.5f p99 %.5f, top-1 %.2f%%, "
                "perplexity %.3f (reference %.3f) on %llu tokens\n",
                r->heldout.kld_mean, r->heldout.kld_p99,
                100.0 * r->heldout.top1, r->heldout.ppl, r->heldout.ppl_ref,
                (unsigned long long)r->heldout.tokens);
    if (verbose) {
        const cmp_calib_times *t = &r->times;
        fprintf(out, "calibration time: %.1f s: forward %.1f s, statistics "
                "%.1f s, factorization %.1f s, search %.1f s, ends %.1f s; "
                "write %.1f s\n", rep->calib_seconds, t->forward.wall,
                t->stats.wall, t->factor.wall, t->search.wall, t->ends.wall,
                rep->write_seconds);
        fprintf(out, "calibration CPU time (all threads): forward %.1f s, "
                "statistics %.1f s, factorization %.1f s, search %.1f s, "
                "ends %.1f s\n", t->forward.cpu, t->stats.cpu, t->factor.cpu,
                t->search.cpu, t->ends.cpu);
    }
}

void cmp_cli_compile_print(const cmp_compile_opts *o,
                           const cmp_compile_report *rep, mc_status s,
                           double seconds, int json, int quiet, int verbose)
{
    if (json) {
        json_t *j = json_object();
        if (s == MC_OK && rep->calib) {
            const cmp_calib_result *r = rep->calib;
            json_t *c = json_pack("{s:s, s:I, s:I, s:I}", "method",
                                  cmp_qmethod_name(rep->calib_effort.method),
                                  "tokens",
                                  (json_int_t)r->calib_tokens, "sequences",
                                  (json_int_t)rep->calib_seqs,
                                  "heldout_sequences",
                                  (json_int_t)rep->heldout_seqs);
            if (c && r->has_heldout)
                json_object_set_new(c, "heldout_kld_mean",
                                    json_real(r->heldout.kld_mean));
            if (c)
                json_object_set_new(c, "rotated", json_boolean(r->rotated));
            if (c && r->prescale_tokens)
                json_object_set_new(c, "prescale_tokens",
                                    json_integer((json_int_t)r->prescale_tokens));
            if (c)
                json_object_set_new(c, "statistics",
                                    json_string(o->calib_stats_f32 ? "f32" : "bf16"));
            if (c)
                json_object_set_new(c, "forward",
                                    json_string(o->calib_fwd_f32 ? "f32" : "bf16"));
            if (c)
                json_object_set_new(c, "full_pass",
                                    json_string(r->full_bf16 ? "bf16" : "f32"));
            if (c)
                json_object_set_new(
                    c, "phase_seconds",
                    json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "total",
                              rep->calib_seconds, "forward", r->times.forward.wall,
                              "statistics", r->times.stats.wall, "factorization",
                              r->times.factor.wall, "search", r->times.search.wall,
                              "ends", r->times.ends.wall, "write",
                              rep->write_seconds));
            if (c)
                json_object_set_new(
                    c, "phase_cpu_seconds",
                    json_pack("{s:f, s:f, s:f, s:f, s:f}", "forward",
                              r->times.forward.cpu, "statistics",
                              r->times.stats.cpu, "factorization",
                              r->times.factor.cpu, "search", r->times.search.cpu,
                              "ends", r->times.ends.cpu));
            if (c)
                json_object_set_new(c, "plan", calib_plan_json(&r->plan));
            if (c)
                json_object_set_new(c, "effort", effort_json(rep));
            json_object_set_new(j, "calibration", c);
        }
        json_object_set_new(j, "ok", json_boolean(s == MC_OK));
        json_object_set_new(j, "status", json_integer(s));
        json_object_set_new(j, "output", json_string(o->out));
        json_object_set_new(j, "file_bytes", json_integer((json_int_t)rep->file_bytes));
        json_object_set_new(j, "tensors", json_integer((json_int_t)rep->tensors));
        json_object_set_new(j, "weights_bytes",
                            json_integer((json_int_t)rep->weights_bytes));
        json_object_set_new(
            j, "part_bytes",
            json_pack("{s:I, s:I, s:I, s:I, s:s}", "embeddings",
                      (json_int_t)rep->part_bytes[CMP_PART_EMBED], "lm_head",
                      (json_int_t)rep->part_bytes[CMP_PART_LM_HEAD], "linears",
                      (json_int_t)rep->part_bytes[CMP_PART_LINEARS], "other",
                      (json_int_t)rep->part_bytes[CMP_PART_OTHER], "lm_head_format",
                      rep->lm_head_tied ? "tied" : kn_wformat_name(rep->lm_head_fmt)));
        json_object_set_new(j, "tokenizer", json_boolean(rep->tokenizer));
        json_object_set_new(j, "adapters", json_integer((json_int_t)rep->adapters));
        json_object_set_new(j, "seconds", json_real(seconds));
        if (rep->plan.total_bytes)
            json_object_set_new(j, "plan", cmp_plan_to_json(&rep->plan));
        char *t = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
        if (t)
            printf("%s\n", t);
        mc_free(t);
        json_decref(j);
    } else if (s == MC_OK && !quiet) {
        if (verbose)
            cmp_cli_print_plan(stdout, &rep->cfg, &rep->plan);
        if (rep->calib)
            print_calib(stdout, rep, verbose);
        char hw[32], ht[32], hg[32], hj[32], job[64] = "";
        if (rep->plan.job_bytes) /* mrun --input's buffers (cmp_plan.h) */
            snprintf(job, sizeof job, " (+ dataset job %s)",
                     human_size(rep->plan.job_bytes, hj, sizeof hj));
        printf("wrote %s: %zu tensors, weights %s (%llu bytes), file "
               "%llu bytes%s%s; plan batch %u x context %llu, arena %llu "
               "bytes, total %s%s of %s; %.2f s\n", o->out, rep->tensors,
               human_size(rep->weights_bytes, hw, sizeof hw),
               (unsigned long long)rep->weights_bytes,
               (unsigned long long)rep->file_bytes,
               rep->tokenizer ? ", tokenizer" : "",
               o->compress ? ", zstd" : "", rep->plan.limits.max_batch,
               (unsigned long long)rep->plan.limits.max_seq,
               (unsigned long long)rep->plan.arena_bytes,
               human_size(rep->plan.total_bytes, ht, sizeof ht), job,
               human_size(rep->plan.target_bytes, hg, sizeof hg), seconds);
        char he[32], hl[32], hn[32], ho[32];
        printf("weights by part: embeddings %s, output layer %s (%s%s), "
               "linears %s, norms and biases %s\n",
               human_size(rep->part_bytes[CMP_PART_EMBED], he, sizeof he),
               human_size(rep->part_bytes[CMP_PART_LM_HEAD], hl, sizeof hl),
               rep->lm_head_tied ? "tied: the embeddings, " : "",
               kn_wformat_name(rep->lm_head_fmt),
               human_size(rep->part_bytes[CMP_PART_LINEARS], hn, sizeof hn),
               human_size(rep->part_bytes[CMP_PART_OTHER], ho, sizeof ho));
    }
    if (s == MC_OK && !quiet && rep->tokenizer_note[0])
        fprintf(stderr, "mcompile: note: %s\n", rep->tokenizer_note);
    /* An int4 tied output layer is the embedding: the token lookup reads
     * the int4 rows too, which costs more than the head's own error
     * (docs/quantization.md "An int4 output layer"). */
    if (s == MC_OK && !quiet && rep->lm_head_tied &&
        (rep->lm_head_fmt == KN_W_Q4 || rep->lm_head_fmt == KN_W_Q4S))
        fprintf(stderr, "mcompile: note: the output layer is the tied "
                "embedding, so the token lookup reads %s rows too (a "
                "cost beyond the head's own: docs/quantization.md, \"An "
                "int4 output layer\"); a calibrated compile that rotates "
                "unties the two and keeps the embedding float\n",
                kn_wformat_name(rep->lm_head_fmt));
}
