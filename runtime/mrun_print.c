/* mrun_print.c - what mrun prints (mrun_print.h). */
#include "mrun_print.h"
#include "rt_plan.h"

#include <stdio.h>
#include <string.h>

/* JSON string: quotes and escapes. */
void mrun_print_json_str(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch == '\n')
            fputs("\\n", f);
        else if (ch == '\t')
            fputs("\\t", f);
        else if (ch == '\r')
            fputs("\\r", f);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

const char *mrun_plan_name(int source)
{
    return source == MCRT_PLAN_STORED       ? "stored"
           : source == MCRT_PLAN_OVERRIDDEN ? "overridden"
                                            : "runtime";
}

static double rate(uint64_t n, double s)
{
    return s > 0 ? (double)n / s : 0.0;
}

void mrun_report_fill(mrun_report *r, const mcrt *h, size_t n_req,
                      int open_status)
{
    memset(r, 0, sizeof *r);
    rt_metrics_init(&r->m);
    if (!h) {
        r->requests = r->refused = n_req;
        rt_metrics_count(&r->m, open_status, n_req);
        r->m.peak_rss_bytes = rt_metrics_peak_rss_bytes();
        return;
    }
    mcrt_get_info(h, &r->info);
    mcrt_get_stats(h, &r->st);
    rt_metrics_from_mcrt(&r->m, h); /* planned, high water, counters too */
    r->requests = r->st.requests;
    r->refused = r->st.refused;
}

void mrun_print_figures(const mrun_report *r, const char *error)
{
    const rt_metrics *m = &r->m;
    const mcrt_info *in = &r->info;
    if (error) {
        printf("\"error\": ");
        mrun_print_json_str(stdout, error, strlen(error));
        printf(", ");
    }
    printf("\"prefill_tok_s\": %.3f, \"decode_tok_s\": %.3f, "
           "\"prefill_seconds\": %.6f, \"decode_seconds\": %.6f, ",
           rate(m->prefill_tokens, m->prefill_seconds),
           rate(m->decode_tokens, m->decode_seconds), m->prefill_seconds,
           m->decode_seconds);
    /* What a dataset job (mrun --input) on this plan adds with default
     * options (rt_plan.h rt_job_budget), and the target it must fit. */
    rt_job_budget jb = {0};
    if (in->device == MCRT_DEVICE_CPU)
        rt_plan_job_budget(RT_JOB_DEFAULT_LINE_BYTES, RT_JOB_DEFAULT_HOLD_BYTES,
                           in->max_seq, &jb, NULL);
    const struct {
        const char *key;
        uint64_t v;
    } f[] = {{"prefill_tokens", m->prefill_tokens},
             {"decode_tokens", m->decode_tokens},
             {"requests", r->requests},
             {"refused", r->refused},
             {"planned_bytes", m->planned_bytes},
             {"reserve_bytes", in->reserve_bytes},
             {"job_bytes", jb.total_bytes},
             {"target_bytes", in->target_bytes},
             {"weights_mapped_bytes", in->weights_mapped_bytes},
             {"arena_bytes", m->arena_bytes},
             {"arena_high_water_bytes", m->arena_high_water_bytes},
             {"arena_touched_bytes", m->arena_touched_bytes},
             {"kv_bytes", in->kv_bytes},
             {"peak_rss_bytes", m->peak_rss_bytes},
             {"weight_bytes", in->weight_bytes},
             {"params", in->params},
             {"threads", (uint64_t)(in->threads > 0 ? in->threads : 0)},
             {"max_batch", in->max_batch},
             {"max_seq", in->max_seq},
             {"prefill_chunk", in->prefill_chunk}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        printf("\"%s\": %llu, ", f[i].key, (unsigned long long)f[i].v);
    printf("\"refused_by\": {\"plan\": %llu, \"input\": %llu, \"other\": "
           "%llu}, \"plan\": \"%s\"}\n",
           (unsigned long long)m->requests_refused[RT_REFUSE_PLAN],
           (unsigned long long)m->requests_refused[RT_REFUSE_INPUT],
           (unsigned long long)m->requests_refused[RT_REFUSE_OTHER],
           mrun_plan_name(in->plan_source));
}

int mrun_report_finish(const mrun_cli *c, const mrun_report *r, int ok)
{
    const rt_metrics *m = &r->m;
    if (!c->quiet && ok)
        fprintf(stderr,
                "mrun: prefill %llu tokens in %.3f s (%.1f tok/s); decode "
                "%llu tokens in %.3f s (%.1f tok/s)\n",
                (unsigned long long)m->prefill_tokens, m->prefill_seconds,
                rate(m->prefill_tokens, m->prefill_seconds),
                (unsigned long long)m->decode_tokens, m->decode_seconds,
                rate(m->decode_tokens, m->decode_seconds));
    if (c->verbose)
        fprintf(stderr,
                "mrun: memory: planned %llu, arena %llu (high water %llu), "
                "peak RSS %llu, weights %llu bytes; prefill %.1f tok/s, "
                "decode %.1f tok/s; requests %llu, refused %llu\n",
                (unsigned long long)m->planned_bytes,
                (unsigned long long)m->arena_bytes,
                (unsigned long long)m->arena_high_water_bytes,
                (unsigned long long)m->peak_rss_bytes,
                (unsigned long long)r->info.weights_mapped_bytes,
                rate(m->prefill_tokens, m->prefill_seconds),
                rate(m->decode_tokens, m->decode_seconds),
                (unsigned long long)r->requests,
                (unsigned long long)r->refused);
    if (!c->metrics_path)
        return 0;
    mc_error e;
    mc_error_clear(&e);
    if (rt_metrics_write_prometheus(m, c->metrics_path, &e) != MC_OK) {
        char buf[1400];
        fprintf(stderr, "mrun: cannot write metrics: %s\n",
                mc_error_format(&e, buf, sizeof buf));
        return 1;
    }
    return 0;
}

void mrun_print_scores(const mrun_cli *c, size_t n, const float *lab,
                         float *const *per, const double *sum)
{
    if (c->json)
        printf("\"scores\": [");
    for (size_t i = 0; i < n; i++) {
        if (c->json) {
            printf("%s{", i ? ", " : "");
            if (lab) {
                const mrun_seqs *L = &c->labels;
                printf("\"labels\": [");
                for (size_t j = 0; j < L->n; j++) {
                    printf("%s{\"%s\": ", j ? ", " : "",
                           L->len[j] == 1 ? "id" : "ids");
                    for (size_t t = 0; t < L->len[j]; t++)
                        printf("%s%d", t ? ", " : L->len[j] == 1 ? "" : "[",
                               (int)L->ids[j][t]);
                    printf("%s, \"logprob\": %.7g}", L->len[j] == 1 ? "" : "]",
                           lab[i * L->n + j]);
                }
                printf("]}");
            } else {
                printf("\"logprobs\": [");
                for (size_t j = 0; j < c->n_cont; j++)
                    printf("%s%.7g", j ? ", " : "", per[i][j]);
                printf("], \"sum\": %.9g}", sum[i]);
            }
        } else if (lab) {
            for (size_t j = 0; j < c->labels.n; j++)
                printf("%s%.7g", j ? " " : "", lab[i * c->labels.n + j]);
            putchar('\n');
        } else {
            printf("%.9g\t", sum[i]);
            for (size_t j = 0; j < c->n_cont; j++)
                printf("%s%.7g", j ? " " : "", per[i][j]);
            putchar('\n');
        }
    }
    if (c->json)
        printf("], ");
}

void mrun_print_sequence(const mrun_cli *c, size_t i, const mcrt_result *res,
                         const char *text, size_t tl)
{
    if (c->json) {
        printf("%s{\"ids\": [", i ? ", " : "");
        for (size_t j = 0; j < res->n_ids; j++)
            printf("%s%d", j ? ", " : "", (int)res->ids[j]);
        printf("], \"text\": ");
        if (text)
            mrun_print_json_str(stdout, text, tl);
        else
            printf("null");
        printf(", \"prompt_tokens\": %zu, \"stop_reason\": \"%s\"}",
               res->prompt_used,
               res->stop_reason == 3   ? "stop_string"
               : res->stop_reason == 2 ? "stop_token"
               : res->stop_reason == 1 ? "length"
                                       : "none");
        return;
    }
    for (size_t j = 0; j < res->n_ids; j++)
        printf("%s%d", j ? " " : "", (int)res->ids[j]);
    if (text) {
        putchar('\t');
        for (size_t j = 0; j < tl; j++)
            fputs(text[j] == '\n'   ? "\\n"
                  : text[j] == '\t' ? "\\t"
                                    : (char[2]){text[j], 0},
                  stdout);
    }
    putchar('\n');
}
