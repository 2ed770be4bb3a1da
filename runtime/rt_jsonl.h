/*
 * rt_jsonl.h - one line of a JSONL dataset job (mrun --input): the request
 * an input line asks for, parsed from untrusted text, and the result line
 * written for it.
 *
 * Input: one JSON object per line (a prompt may hold newlines: they are
 * escaped inside the JSON string).  Keys (others are ignored, so a dataset
 * may carry its own fields, e.g. the true label):
 *
 *   "id"             string or integer       default: the line number
 *   "prompt"         text (needs a tokenizer)  } exactly one of the two
 *   "ids"            [token id, ...]           }
 *   "max_new_tokens" integer 0..1000000      default: the job's
 *   "temperature"    number >= 0 (0 greedy)  default: the job's
 *   "top_k"          integer >= 0 (0 off)    default: the job's
 *   "top_p"          number in (0, 1]        default: the job's
 *   "seed"           integer >= 0            default: see below
 *   "stop"           [token id | text, ...]  extra stop tokens and stop
 *                                            strings (1..RT_STOP_STRING_MAX
 *                                            bytes; rt_stopstr.h)
 *   "labels"         [token id | text | [token id, ...], ...] } scoring
 *   "continuation"   text | [token id, ...]                   } instead of
 *                                                               generation
 * A label is one token id, a text (encoded without BOS) or an id array, of
 * one or more tokens (none: the line is an error); its score is the sum of
 * its tokens' log-probabilities after the prompt (rt_session.h rt_labels).
 * Sampling RNG of a request: (seed, 0) when the line gives "seed", else
 * (the job's seed, line number - 1).  Either way it depends only on the
 * line, never on what else runs in the batch, so a resumed job samples the
 * same tokens.
 *
 * Output: one line per non-blank input line, keys in this order, no
 * spaces, floats as %.9g (sums %.17g), text with invalid UTF-8 replaced by
 * U+FFFD; the same request always gives the same bytes:
 *
 *   {"id":ID,"line":N,"prompt_tokens":P,"generated_tokens":G,
 *    "stop_reason":"length"|"stop_token"|"stop_string","ids":[...],
 *    "text":"..."|null}     (stop_string: ids end with the token that
 *                            completed the match, text is cut before it)
 *   {"id":ID,"line":N,"prompt_tokens":P,
 *    "labels":[{"label":L,"logprob":x,"tokens":m},...],"label":L_best,
 *    "continuation_logprobs":[...],"continuation_sum":x}   (parts present
 *                                                  as the request asked)
 *   {"id":ID,"line":N,"error":"...","max_batch":B,"max_seq":S}
 *                           (the limits only for a request beyond the plan)
 *
 * Nothing here prints; results are new strings the caller frees.
 */
#ifndef RT_JSONL_H
#define RT_JSONL_H

#include <stddef.h>
#include <stdint.h>

#include "mc_error.h"
#include "rt_tokenizer.h"

/* The job's defaults for keys a line leaves out. */
typedef struct rt_jsonl_defaults {
    uint32_t max_new_tokens;
    float temperature;         /* <= 0: greedy */
    uint32_t top_k;            /* 0: off */
    float top_p;               /* >= 1: off */
    uint64_t seed;
    int add_special;           /* "prompt" text gets BOS etc. */
} rt_jsonl_defaults;

/* A parsed line.  Every pointer is owned (rt_jsonl_req_free). */
typedef struct rt_jsonl_req {
    uint64_t line;             /* 1-based line number in the input */
    char *id;                  /* the id as JSON text ("\"a\"", "17");
                                  NULL only when parsing failed before it */
    int32_t *ids;              /* prompt token ids [n_ids] */
    size_t n_ids;
    uint32_t max_new_tokens;
    float temperature, top_p;
    uint32_t top_k;
    uint64_t seed;             /* RNG stream (seed, seq_index) */
    uint64_t seq_index;
    int32_t *stop;             /* [n_stop] stop token ids from the line */
    size_t n_stop;
    char **stop_str;           /* [n_stop_str] stop strings (owned) */
    size_t *stop_str_len;      /* [n_stop_str] their bytes, >= 1 */
    size_t n_stop_str;
    int score;                 /* labels and/or continuation: scoring */
    int32_t **label_seq;       /* [n_labels] each label's tokens (owned) */
    size_t *label_len;         /* [n_labels] their counts, >= 1 */
    size_t n_labels;
    char **label_json;         /* [n_labels] each label as given, JSON text */
    int32_t *cont;             /* [n_cont] */
    size_t n_cont;
} rt_jsonl_req;

/* A fixed buffer the job lends to one call at a time (allocated once, at
 * job start): rt_jsonl_parse_in builds the line's JSON tree in it instead
 * of the heap, and rt_jsonl_write_result uses it for the decoded text and
 * the line's bytes.  Not thread-safe: jansson's allocator is global. */
typedef struct rt_jsonl_scratch {
    char *buf;                 /* cap bytes, 16-byte aligned */
    size_t cap;
    size_t used;               /* reset by each call */
    int exhausted;             /* the last call ran out of it */
} rt_jsonl_scratch;

/* 1 if the len bytes are only blanks (' ', '\t', '\r'): such lines are
 * skipped and get no output line. */
int rt_jsonl_is_blank(const char *line, size_t len);

/* Parse line line_no (len bytes, no '\n').  tok (may be NULL) encodes
 * "prompt", text labels and continuations.  MC_OK, or MC_ERR_FORMAT
 * (not JSON, not an object, a key of the wrong type or range, text without
 * a tokenizer; err->field names the key, the message the line number and
 * what was expected) or MC_ERR_NOMEM.  On failure out->id is still set
 * when the line had a valid "id" (for its error line), and the rest is
 * freed.  out is overwritten (not freed) first. */
mc_status rt_jsonl_parse(const char *line, size_t len, uint64_t line_no,
                         const rt_jsonl_defaults *d, const rt_tokenizer *tok,
                         rt_jsonl_req *out, mc_error *err);

/* rt_jsonl_parse, with the JSON tree of the line in scratch (NULL: the
 * heap).  A line whose tree does not fit is MC_ERR_FORMAT ("line N: its
 * JSON needs more than the job's parse scratch of C bytes"), with
 * scratch->exhausted set; what out owns is on the heap either way. */
mc_status rt_jsonl_parse_in(const char *line, size_t len, uint64_t line_no,
                            const rt_jsonl_defaults *d,
                            const rt_tokenizer *tok,
                            rt_jsonl_scratch *scratch, rt_jsonl_req *out,
                            mc_error *err);

/* The heap bytes r owns (malloc's chunks, rt_plan_heap_chunk). */
uint64_t rt_jsonl_req_bytes(const rt_jsonl_req *r);

/* Tokens a scoring request needs after its prompt: the longer of its
 * continuation and its longest label. */
size_t rt_jsonl_score_extra(const rt_jsonl_req *r);

/* Free the contents of r (not r itself); NULL is a no-op. */
void rt_jsonl_req_free(rt_jsonl_req *r);

/* What a request gave (borrowed views). */
typedef struct rt_jsonl_result {
    size_t prompt_tokens;      /* prompt tokens used (after truncation) */
    const int32_t *gen_ids;    /* generate: [n_gen] */
    size_t n_gen;
    int stop_token;            /* generate: 1 a stop token ended it */
    int stop_string;           /* generate: 1 a stop string ended it */
    const char *text;          /* generate: decoded text, or NULL */
    size_t text_len;
    const float *label_logprobs; /* score: [req->n_labels] label sums */
    const float *cont_logprobs;  /* score: [req->n_cont] */
} rt_jsonl_result;

/* The result line of r (with its '\n') in a new buffer (*out, freed with
 * free(); *len bytes).  MC_ERR_NOMEM on failure. */
mc_status rt_jsonl_format_result(const rt_jsonl_req *r,
                                 const rt_jsonl_result *res, char **out,
                                 size_t *len);

/* The error line of input line line_no: id (JSON text; NULL: the line
 * number), msg, and when max_seq > 0 the plan's limits. */
mc_status rt_jsonl_format_error(const char *id, uint64_t line_no,
                                const char *msg, uint32_t max_batch,
                                uint64_t max_seq, char **out, size_t *len);

/* Where rt_jsonl_write_* put a line: the same bytes as the format_*
 * functions give, built in a fixed buffer and passed to write(ctx, p, n)
 * once when the line fits buf (one write() per line: a crash leaves
 * whole lines), else in buf-sized pieces.  write returns 0 or -1. */
typedef struct rt_jsonl_sink {
    char *buf;
    size_t cap;                /* >= 64 */
    int (*write)(void *ctx, const char *p, size_t n);
    void *ctx;
} rt_jsonl_sink;

/* rt_jsonl_format_result / _error into sink.  MC_ERR_IO when a write
 * failed. */
mc_status rt_jsonl_write_result(const rt_jsonl_req *r,
                                const rt_jsonl_result *res,
                                const rt_jsonl_sink *sink);
mc_status rt_jsonl_write_error(const char *id, uint64_t line_no,
                               const char *msg, uint32_t max_batch,
                               uint64_t max_seq, const rt_jsonl_sink *sink);

/* The "id" of an output line as JSON text (new string, *id) for --resume,
 * and whether it is an error line (*failed = 1).  MC_ERR_FORMAT when the
 * line is not an object with "id" and "line". */
mc_status rt_jsonl_output_id(const char *line, size_t len, char **id,
                             int *failed, mc_error *err);

#endif /* RT_JSONL_H */
