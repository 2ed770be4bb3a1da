/*
 * mcrt.h - the small public C API for embedding the mcompile runtime.
 *
 *   mcrt *h;
 *   if (mcrt_open("model_dir", NULL, &h) != 0)
 *       fprintf(stderr, "%s\n", mcrt_last_error(NULL));
 *   int32_t out[64]; mcrt_result r = {.ids = out};
 *   const int32_t *p[1] = {prompt}; size_t n[1] = {len};
 *   mcrt_gen_params gp; mcrt_gen_params_default(&gp);
 *   gp.max_new_tokens = 64;
 *   mcrt_generate(h, p, n, 1, &gp, &r);
 *   mcrt_close(h);
 *
 * Self-contained (plain C types only).  Return values are mc_status codes
 * (0 = ok; the values of formats/mc_error.h, e.g. 10 = request exceeds the
 * memory plan).  Any number of prompts may be passed: they run in waves of
 * the session's max_batch, and sequence i of the request is seeded with
 * (seed, i) whatever wave it lands in, so results do not depend on n.
 * A handle is not thread-safe; use one per thread.
 *
 * Backends.  A handle runs on one device (mcrt_options.device): the CPU or
 * CUDA.  Every device is driven by the same scheduler (runtime/rt_sched.c),
 * so requests, refusals and results (up to float rounding) do not depend
 * on the device.  To add one, implement the function table of
 * runtime/rt_backend.h (create over the planned arena, upload, one block,
 * the head, optional argmax) and give it an MCRT_DEVICE_ value; the steps
 * are listed at the top of that header.
 */
#ifndef MCRT_H
#define MCRT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mcrt mcrt;

/* Zero-initialized options mean defaults (from the artifact's plan, or
 * batch 8 / max_seq min(max_position, 2048) / chunk 256 / f32 KV / the
 * CPUs this process may use for a Hugging Face directory). */
typedef struct mcrt_options {
    int threads;               /* 0: the plan's, at most the CPUs this
                                  process may use (kn_cpus.h: affinity
                                  and cgroup limit); no plan: those CPUs */
    uint32_t max_batch;        /* 0: default */
    uint64_t max_seq;          /* 0: default */
    uint32_t prefill_chunk;    /* 0: default (raised to max_batch) */
    int kv_type;               /* 0: default (the plan's, else f32);
                                  1 f32, 2 f16, 3 int8 */
    /* Hints for a model without a stored plan, used where the field above
     * is 0: size the session for this request instead of the defaults
     * (max_batch = min(8, want_batch), max_seq = min(max_position,
     * want_seq)).  0 = no hint. */
    uint32_t want_batch;
    uint64_t want_seq;
    int device;                /* MCRT_DEVICE_*: 0 = the plan's device
                                  (an artifact planned with --device cuda
                                  runs on CUDA), else the CPU */
} mcrt_options;

#define MCRT_DEVICE_DEFAULT 0
#define MCRT_DEVICE_CPU 1
#define MCRT_DEVICE_CUDA 2     /* fails to open (status 4, unsupported)
                                  without a CUDA build, driver or GPU */

typedef struct mcrt_gen_params {
    uint32_t max_new_tokens;
    float temperature;         /* <= 0: greedy */
    uint32_t top_k;            /* 0: off */
    float top_p;               /* >= 1: off */
    uint64_t seed;
    const int32_t *stop_ids;   /* extra stop tokens (borrowed) */
    size_t n_stop;
    int use_model_eos;         /* 1: the config's eos ids stop too */
    int truncate;              /* 0 refuse, 1 drop left, 2 drop right */
    /* Optional (NULL: none): called after each generated token is stored,
     * with the sequence's index (in the mcrt_generate call, or the
     * seq_index of mcrt_submit_generate) and its tokens so far
     * ids[0..n); nonzero ends the sequence (stop_reason 3, the token
     * kept), e.g. on a stop string.  It runs inside the model's step:
     * it must be quick and must not call back into h. */
    int (*on_token)(void *ctx, uint64_t seq, const int32_t *ids, size_t n);
    void *on_token_ctx;
} mcrt_gen_params;

typedef struct mcrt_result {
    int32_t *ids;              /* caller buffer of max_new_tokens ids */
    size_t n_ids;              /* out */
    int stop_reason;           /* out: 1 length, 2 stop token, 3 on_token */
    size_t prompt_used;        /* out: prompt tokens used after truncation */
} mcrt_result;

typedef struct mcrt_info {
    uint32_t vocab_size;
    uint32_t hidden_size;
    uint32_t num_layers;
    uint64_t max_seq;
    uint32_t max_batch;
    uint32_t prefill_chunk;
    int threads;
    int32_t bos_id;            /* -1 if none */
    int32_t eos_ids[8];
    int n_eos;
    uint64_t arena_bytes;      /* the one arena the session allocated */
    uint64_t kv_bytes;         /* KV cache part of the arena */
    uint64_t weight_bytes;     /* matrix bytes read per token (embedding
                                  row excluded, lm_head included) */
    uint64_t params;
    /* Memory the plan accounts for: weights + arena + reserve.  For an
     * artifact run with its stored limits, the manifest's plan.total_bytes;
     * with limits overridden at open, the plan's weights and reserve plus
     * this session's arena; for a Hugging Face model (no stored plan),
     * weights_mapped_bytes + arena_bytes.  >= arena_bytes. */
    uint64_t planned_bytes;
    uint64_t reserve_bytes;    /* device reserve the plan counts (0: none) */
    uint64_t weights_mapped_bytes; /* every weight byte the model holds:
                                  matrices mapped from the file (or
                                  decompressed at load), f32 norms/biases */
    int plan_source;           /* MCRT_PLAN_* */
    int device;                /* MCRT_DEVICE_CPU or _CUDA: where it runs */
    uint64_t target_bytes;     /* the memory an artifact's stored plan was
                                  made for (mcompile --target), which the
                                  dataset job's buffers must fit beside
                                  planned_bytes; 0: unknown (no stored
                                  plan, limits overridden, older artifact) */
} mcrt_info;

#define MCRT_PLAN_RUNTIME 0    /* no stored plan: the runtime's defaults/hints */
#define MCRT_PLAN_STORED 1     /* the artifact's plan, as compiled */
#define MCRT_PLAN_OVERRIDDEN 2 /* the artifact's plan with limits changed */

/* Counters since open.  A request is one sequence (prompt) passed to
 * mcrt_generate / mcrt_score_* / mcrt_logits; a call that fails refuses
 * the sequences it had not finished (the waves before it stay served). */
typedef struct mcrt_stats {
    uint64_t prefill_tokens, decode_tokens;
    double prefill_seconds, decode_seconds;
    uint64_t requests;         /* sequences submitted */
    uint64_t refused;          /* of those, refused (sum of the three below) */
    uint64_t refused_plan;     /* beyond the memory plan (status 10) */
    uint64_t refused_input;    /* malformed request (status 7) */
    uint64_t refused_other;    /* any other failure */
    /* Highest arena byte offset + 1 that no longer holds the canary written
     * at open: the measured peak of the arena (<= arena_bytes).  A scan
     * down from the arena's end; it stops at the first touched byte, so it
     * is cheap once a step has run. */
    uint64_t arena_high_water_bytes;
    /* Arena bytes that no longer hold the canary (rt_session.h): how much
     * of the plan a run really wrote (<= arena_high_water_bytes).  Costs a
     * scan of the whole arena. */
    uint64_t arena_touched_bytes;
} mcrt_stats;

void mcrt_options_default(mcrt_options *o);
void mcrt_gen_params_default(mcrt_gen_params *p);

/* Open a model (HF directory/file or artifact).  On failure *out is NULL
 * and mcrt_last_error(NULL) says why. */
int mcrt_open(const char *path, const mcrt_options *opts, mcrt **out);
void mcrt_close(mcrt *h);      /* NULL is a no-op */

/* Last error of h, or of the last failed mcrt_open in this thread when h
 * is NULL.  "" when none.  Valid until the next call on h. */
const char *mcrt_last_error(const mcrt *h);

int mcrt_get_info(const mcrt *h, mcrt_info *out);

/* Generate for n prompts; results[i].ids must hold max_new_tokens ids. */
int mcrt_generate(mcrt *h, const int32_t *const *prompts, const size_t *lens,
                  size_t n, const mcrt_gen_params *p, mcrt_result *results);

/* Log-probabilities of each label token right after each prompt:
 * out[i * n_labels + j] = log p(labels[j] | prompt i). */
int mcrt_score_labels(mcrt *h, const int32_t *const *prompts,
                      const size_t *lens, size_t n, const int32_t *labels,
                      size_t n_labels, float *out, int truncate);

/* Labels of one or more tokens (label j: labels[j][0 .. label_lens[j]),
 * at least one token each): out[i * n_labels + j] = the sum of the
 * log-probabilities of label j's tokens after prompt i, each given the
 * prompt and the label's tokens before it (teacher-forced); it equals
 * (float) of mcrt_score_continuations' sum for prompt i and label j, bit
 * for bit.  The prompt runs once per request; each label's tokens but the
 * last are fed after it.  prompt + the longest label must fit in max_seq
 * (status 10), or truncate (1 left, 2 right) makes room. */
int mcrt_score_label_seqs(mcrt *h, const int32_t *const *prompts,
                          const size_t *lens, size_t n,
                          const int32_t *const *labels,
                          const size_t *label_lens, size_t n_labels,
                          float *out, int truncate);

/* Log-probability of each continuation token given the prompt and the
 * continuation before it: per_token[i] has cont_lens[i] entries (may be
 * NULL), sum[i] (may be NULL) gets their sum. */
int mcrt_score_continuations(mcrt *h, const int32_t *const *prompts,
                             const size_t *lens, size_t n,
                             const int32_t *const *conts,
                             const size_t *cont_lens, float *const *per_token,
                             double *sum, int truncate);

/* Logits at every position of each prompt: out[i] holds lens[i] * vocab
 * floats. */
int mcrt_logits(mcrt *h, const int32_t *const *prompts, const size_t *lens,
                size_t n, float *const *out);

/* Continuous batching: instead of whole calls, submit one request at a
 * time into a free slot (of max_batch) and step the model; a request
 * finishes in its own time and its slot takes the next request at the
 * next step, its prompt rows sharing steps with the others' decoding.
 * The memory plan does not change, and each request gives the ids
 * mcrt_generate gives it (its RNG is (p->seed, seq_index), as sequence
 * seq_index of a call).  The whole-call functions above refuse to run
 * while a submitted request is unfinished.
 *
 * mcrt_submit_generate: prompt, p's stop ids and result->ids (room for
 * p->max_new_tokens ids) are borrowed until the slot is reported done;
 * the same checks and refusals as mcrt_generate (status 10 beyond the
 * plan); *slot_out (may be NULL) the slot it took.  No free slot: status
 * 7 (invalid argument). */
size_t mcrt_free_slots(const mcrt *h);
int mcrt_submit_generate(mcrt *h, const int32_t *prompt, size_t len,
                         const mcrt_gen_params *p, uint64_t seq_index,
                         mcrt_result *result, uint32_t *slot_out);
/* One step over the submitted requests: the slots that finished go to
 * done[] (room for max_batch), their count to *n_done, and their
 * mcrt_result is complete.  Nothing submitted: *n_done = 0.  On failure
 * every unfinished request is dropped (counted as refused). */
int mcrt_step(mcrt *h, uint32_t *done, size_t *n_done);

void mcrt_get_stats(const mcrt *h, mcrt_stats *out);

/* 1 if path is an mcompile artifact (it starts with the artifact magic),
 * else 0 (also when it cannot be read).  Cheap: reads 8 bytes. */
int mcrt_is_artifact(const char *path);

/* The tokenizer.json an artifact embeds: borrowed bytes (not
 * NUL-terminated) valid until mcrt_close, their count in *len (len may be
 * NULL).  NULL when h was opened from a Hugging Face model or the artifact
 * has none. */
const char *mcrt_tokenizer_json(const mcrt *h, size_t *len);

#ifdef __cplusplus
}
#endif

#endif /* MCRT_H */
