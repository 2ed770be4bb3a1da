/*
 * rt_tok_json.h - helpers shared by the tokenizer.json readers
 * (rt_tok_json.c: vocabulary, model, the whole file; rt_tok_json_steps.c:
 * normalizer, pre-tokenizer, decoder and post-processor pipelines).  Each
 * helper fills ctx->err with the file and JSON path of the field and
 * returns the status.  Not a public header.
 */
#ifndef RT_TOK_JSON_H
#define RT_TOK_JSON_H

#include <jansson.h>

#include "rt_tok_internal.h"

/* Nesting limit for Sequence normalizers / pre-tokenizers / decoders. */
#define RT_TOKJ_MAX_DEPTH 8
/* Limit on pipeline steps, so a hostile file cannot ask for many. */
#define RT_TOKJ_MAX_STEPS 64

typedef struct rt_tokj_ctx {
    rt_tokenizer *t;
    const char *file; /* for messages */
    mc_error *err;
} rt_tokj_ctx;

/* MC_ERR_FORMAT at field; fmt has one %s filled with a. */
mc_status rt_tokj_bad(rt_tokj_ctx *c, const char *field, const char *fmt,
                      const char *a);
/* MC_ERR_UNSUPPORTED at field: what is not supported (named). */
mc_status rt_tokj_unsupported(rt_tokj_ctx *c, const char *field,
                              const char *what);
mc_status rt_tokj_nomem(rt_tokj_ctx *c, const char *field);
/* Optional boolean member path.key: absent or null gives def. */
mc_status rt_tokj_get_bool(rt_tokj_ctx *c, json_t *obj, const char *key,
                           const char *path, int def, int *out);
/* String member path.key (borrowed, length in *len).  present == NULL: it
 * is required; else absent or null sets *present = 0. */
mc_status rt_tokj_get_str(rt_tokj_ctx *c, json_t *obj, const char *key,
                          const char *path, const char **s, size_t *len,
                          int *present);
/* mc_malloc'ed copy of s[0..n) (not NUL-terminated); NULL if out of memory. */
uint8_t *rt_tokj_dup_bytes(const char *s, size_t n);

/* Pipelines: append steps to t->norm / t->pre / t->dec; the template to
 * t->tmpl (needs the vocabulary loaded). */
mc_status rt_tokj_parse_normalizer(rt_tokj_ctx *c, json_t *obj,
                                   const char *path, int depth);
mc_status rt_tokj_parse_pretok(rt_tokj_ctx *c, json_t *obj, const char *path,
                               int depth);
mc_status rt_tokj_parse_decoder(rt_tokj_ctx *c, json_t *obj, const char *path,
                                int depth);
mc_status rt_tokj_parse_post(rt_tokj_ctx *c, json_t *obj, const char *path,
                             int depth);

#endif /* RT_TOK_JSON_H */
