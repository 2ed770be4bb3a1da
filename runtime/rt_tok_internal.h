/*
 * rt_tok_internal.h - the tokenizer's in-memory form, shared by its files:
 *   rt_tok_json.c    loading and validating tokenizer.json (+ rt_tok_json.h,
 *                    rt_tok_json_steps.c for the pipeline sections)
 *   rt_tok_unicode.c UTF-8 and White_Space
 *   rt_tok_regex.c   PCRE2 patterns and the Split behaviours
 *   rt_tok_norm.c    normalizers (utf8proc for the Unicode forms and case)
 *   rt_tok_pretok.c  pre-tokenizers
 *   rt_tok_bpe.c     vocabulary and merge hash maps, the BPE merge loop
 *   rt_tokenizer.c   encode (added tokens, template), decode, accessors
 * Not a public header.
 */
#ifndef RT_TOK_INTERNAL_H
#define RT_TOK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "mc_error.h"
#include "rt_tok_regex.h"
#include "rt_tokenizer.h"

/* Upper bound on ids (and so on vocab_size): keeps every id in 24 bits so
 * a merge key (left << 32 | right) never equals the empty-slot marker. */
#define RT_TOK_MAX_ID (1u << 24)

/* Per-id flags. */
#define RT_TOK_F_MODEL 1u   /* id is in model.vocab */
#define RT_TOK_F_ADDED 2u   /* id is an added token (text overrides model's) */
#define RT_TOK_F_SPECIAL 4u /* added token with "special": true */
#define RT_TOK_F_NORMALIZED 8u /* added token shown by its normalized form */

/* A growable byte or int buffer owned by one encode/decode call. */
typedef struct rt_tok_buf {
    uint8_t *p;  /* bytes */
    size_t len;  /* used bytes */
    size_t cap;  /* allocated bytes */
} rt_tok_buf;

/* A piece of text during pre-tokenization: bytes [off, off+len) of the
 * current work buffer.  at_start: the piece begins at offset 0 of the
 * original input (Metaspace prepend_scheme "first"). */
typedef struct rt_tok_piece {
    size_t off;  /* byte offset in the work buffer */
    size_t len;  /* bytes */
    int at_start;
} rt_tok_piece;

enum {
    RT_NORM_PREPEND, RT_NORM_REPLACE, RT_NORM_NFC, RT_NORM_NFD, RT_NORM_NFKC,
    RT_NORM_NFKD, RT_NORM_LOWER, RT_NORM_STRIP, RT_NORM_STRIP_ACCENTS
};
/* kinds are distinct across the three lists so one switch can mix them */
enum { RT_PRE_METASPACE = 10, RT_PRE_BYTELEVEL, RT_PRE_SPLIT };
enum { RT_PREPEND_NEVER, RT_PREPEND_FIRST, RT_PREPEND_ALWAYS };
enum {
    RT_DEC_BYTELEVEL = 20, RT_DEC_METASPACE, RT_DEC_REPLACE, RT_DEC_BYTEFALLBACK,
    RT_DEC_FUSE, RT_DEC_STRIP
};

/* One step of a normalizer, pre-tokenizer or decoder pipeline.  Which
 * fields mean something depends on kind.  Pre-tokenizers that only cut
 * (Split, Digits, Whitespace, WhitespaceSplit, Punctuation, BertPreTokenizer,
 * CharDelimiterSplit) are all RT_PRE_SPLIT with their pattern. */
typedef struct rt_tok_step {
    int kind;        /* RT_NORM_*, RT_PRE_* or RT_DEC_* */
    uint8_t *a;      /* Prepend text / Replace or Split literal / Metaspace replacement / Strip char (owned) */
    size_t a_len;    /* bytes */
    uint8_t *b;      /* Replace content (owned) */
    size_t b_len;    /* bytes */
    rt_tok_re *re;   /* Replace / Split regex, ByteLevel's GPT-2 split (owned); NULL: the literal a */
    int behaviour;   /* Split: RT_SPLIT_* */
    int invert;      /* Split: cut on what does not match */
    int prepend;     /* Metaspace: RT_PREPEND_* */
    int split;       /* Metaspace: split on the replacement */
    int add_prefix_space; /* ByteLevel */
    int use_regex;   /* ByteLevel: split with the GPT-2 pattern (re) */
    size_t start, stop; /* Strip: leading / trailing chars to remove
                         * (normalizer: 0 or 1 = strip that side) */
} rt_tok_step;

/* An added token, matched before the model: in the raw text, or (normalized)
 * in the normalized text by its own normalized form. */
typedef struct rt_tok_added {
    uint8_t *text;   /* content (owned) */
    size_t len;      /* bytes, >= 1 */
    uint8_t *ntext;  /* normalized content, matched when normalized (owned) */
    size_t nlen;     /* bytes (0: never matches) */
    int32_t id;
    int special;
    int normalized;  /* matched after the normalizer, on ntext */
    int single_word; /* only between non-word characters */
    int lstrip, rstrip; /* absorb White_Space on that side */
} rt_tok_added;

struct rt_tokenizer {
    /* vocabulary: token text of id i is pool[tok_off[i] .. +tok_len[i]) */
    uint8_t *pool;          /* all token texts (owned) */
    size_t pool_len;        /* bytes used */
    uint32_t *tok_off;      /* (vocab_size) byte offset in pool */
    uint32_t *tok_len;      /* (vocab_size) bytes */
    uint8_t *flags;         /* (vocab_size) RT_TOK_F_*; 0 = no such id */
    uint32_t vocab_size;    /* largest id + 1 */
    /* model vocab text -> id (open addressing, value id+1, 0 empty).
     * Holds the model's texts, never the added tokens' overrides. */
    uint32_t *vhash;        /* (vhash_mask + 1) */
    size_t vhash_mask;
    uint32_t *model_off;    /* (vocab_size) model text offset (kept when an added token overrides) */
    uint32_t *model_len;    /* (vocab_size) */
    /* merges: (left << 32 | right) -> rank, result id */
    uint64_t *mkey;         /* (mhash_mask + 1), UINT64_MAX = empty */
    uint32_t *mrank;        /* rank = index in model.merges */
    int32_t *mnew;          /* id of left+right */
    size_t mhash_mask;
    size_t n_merges;
    /* model options */
    int byte_level;         /* a ByteLevel pre-tokenizer: model sees bytes */
    int byte_fallback;      /* unknown chars -> <0xNN> */
    int fuse_unk;
    int ignore_merges;      /* a word in the vocab is one token */
    int32_t unk_id;         /* -1 if none */
    /* SentencePiece words may be cut before each run of the space symbol
     * (chunk_sym, e.g. "▁") without changing the result: set when every
     * model token is chunk_sym* followed by text free of chunk_sym, so no
     * token can span a non-symbol char followed by the symbol.  Keeps BPE
     * on an unsplit text (Metaspace split=false) to word-sized heaps. */
    int chunk;
    uint8_t chunk_sym[4];
    size_t chunk_sym_len;
    int32_t byte_id[256];   /* byte-level: id of the char for byte b, or -1 */
    int32_t fallback_id[256]; /* id of "<0xNN>", or -1 */
    uint8_t bl_char[256][2];/* byte-level char of byte b, UTF-8 */
    uint8_t bl_char_len[256];
    int16_t bl_byte[324];   /* byte-level char code point -> byte, -1 */
    /* pipelines */
    rt_tok_step *norm; size_t n_norm;
    rt_tok_step *pre;  size_t n_pre;
    rt_tok_step *dec;  size_t n_dec;
    int has_decoder;        /* 0: tokens joined with " " (HF's default) */
    /* added tokens, longest first (by the form they are matched by) */
    rt_tok_added *added; size_t n_added;
    uint8_t added_first[2][256]; /* [normalized][b]: some token of that set starts with byte b */
    rt_tok_re *word_re;     /* one word character (single_word), or NULL */
    /* post-processor template (single): ids; -1 marks the sequence */
    int32_t *tmpl; size_t n_tmpl;
    int32_t bos_id, eos_id; /* -1 if none */
};

/* ---- rt_tok_bpe.c ---- */
uint64_t rt_tok_hash(const uint8_t *s, size_t n);
/* Model vocab lookup: id or -1. */
int32_t rt_tok_vocab_find(const rt_tokenizer *t, const uint8_t *s, size_t n);
/* Build the vocab hash from model_off/model_len over ids with F_MODEL.
 * MC_ERR_NOMEM, or MC_ERR_FORMAT when two ids share a text. */
mc_status rt_tok_vocab_index(rt_tokenizer *t, const char *file, mc_error *err);
/* Allocate the merge table for n_merges entries (MC_ERR_NOMEM). */
mc_status rt_tok_merge_alloc(rt_tokenizer *t, size_t n_merges);
/* Insert a merge; overwrites an existing pair (HF keeps the last). */
void rt_tok_merge_put(rt_tokenizer *t, int32_t a, int32_t b, uint32_t rank,
                      int32_t result);
/* Scratch for the BPE loop, reused across words of one encode call. */
typedef struct rt_tok_bpe_work {
    int32_t *sym_id; int32_t *sym_prev; int32_t *sym_next; size_t sym_cap;
    struct rt_tok_merge_ent *heap; size_t heap_len, heap_cap;
    rt_tok_buf mapped;      /* byte-level text of a word (ignore_merges) */
} rt_tok_bpe_work;
void rt_tok_bpe_work_free(rt_tok_bpe_work *w);
/* BPE-encode one pre-tokenized word, appending ids to out (int32 array
 * as bytes). */
mc_status rt_tok_bpe_word(const rt_tokenizer *t, rt_tok_bpe_work *w,
                          const uint8_t *s, size_t n, rt_tok_buf *out);
int rt_tok_buf_reserve(rt_tok_buf *b, size_t extra);
int rt_tok_buf_append(rt_tok_buf *b, const void *p, size_t n);

/* Scratch of one encode call for normalizing and pre-tokenizing. */
typedef struct rt_tok_work {
    rt_tok_buf cur, other;       /* work text */
    rt_tok_buf pieces, pieces2;  /* rt_tok_piece arrays */
    rt_tok_span *spans;          /* Split results */
    size_t n_spans, spans_cap;
    rt_tok_re_scratch *re;       /* PCRE2 match data (created on first use) */
} rt_tok_work;
void rt_tok_work_free(rt_tok_work *w);

/* ---- rt_tok_norm.c ---- */
/* The most a normalizer may grow a text of n bytes to: GROWTH x n + SLACK
 * bytes after any step. */
#define RT_TOK_NORM_GROWTH 64
#define RT_TOK_NORM_SLACK 4096
/* Run the normalizer steps over src[0..n) into out (cleared first; tmp is
 * scratch).  *lost_start is set when the first original characters were
 * removed (so the result no longer begins at the original offset 0), else
 * left alone.  MC_ERR_NOMEM, MC_ERR_INVALID_ARG (regex match failure),
 * MC_ERR_OVERFLOW (a step grew the text past the bound above). */
mc_status rt_tok_normalize(const rt_tokenizer *t, const uint8_t *src, size_t n,
                           rt_tok_buf *out, rt_tok_buf *tmp, rt_tok_work *w,
                           int *lost_start);
/* Append src[0..n) to out with every occurrence of pat replaced by rep;
 * 0 when out of memory. */
int rt_tok_replace_into(rt_tok_buf *out, const uint8_t *src, size_t n,
                        const uint8_t *pat, size_t plen, const uint8_t *rep,
                        size_t rlen);
/* Append src[0..n) to out through a Replace step (literal a or regex re
 * -> b).  lost_start (may be NULL): set when leading characters are
 * replaced by nothing (see rt_tok_normalize).  MC_ERR_OVERFLOW, nothing
 * appended, when the result would pass RT_TOK_NORM_GROWTH x n +
 * RT_TOK_NORM_SLACK bytes (one step with a long replacement). */
mc_status rt_tok_replace_step(const rt_tok_step *st, rt_tok_work *w,
                              const uint8_t *src, size_t n, rt_tok_buf *out,
                              int *lost_start);
/* PCRE2 scratch of w, created on first use; NULL when out of memory. */
rt_tok_re_scratch *rt_tok_work_re(rt_tok_work *w);

/* ---- rt_tok_pretok.c ---- */
/* Pre-tokenize text[0..n) (normalized; one segment between added tokens).
 * at_start: the segment begins at original offset 0.  Result: the pieces
 * in w->pieces, into the bytes of w->cur. */
mc_status rt_tok_pretokenize(const rt_tokenizer *t, const uint8_t *text,
                             size_t n, int at_start, rt_tok_work *w);

/* ---- rt_tokenizer.c ---- */
/* Text of id as decode and id_to_token give it: a normalized added token
 * by its normalized form (as Hugging Face does), else its stored text.
 * id must name a token. */
const uint8_t *rt_tok_text(const rt_tokenizer *t, int32_t id, size_t *len);

/* ---- rt_tok_json.c ---- */
mc_status rt_tok_parse(rt_tokenizer *t, const void *data, size_t len,
                       const char *file, mc_error *err);
mc_status rt_tok_read_config(rt_tokenizer *t, const char *cfg_path,
                             mc_error *err);
void rt_tok_free_internal(rt_tokenizer *t);

#endif /* RT_TOK_INTERNAL_H */
