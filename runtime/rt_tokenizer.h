/*
 * rt_tokenizer.h - Hugging Face `tokenizer.json` BPE tokenizers, encode and
 * decode, without printing and without Python.  docs/tokenizer.md lists
 * what is read and how it was checked against the `tokenizers` library.
 *
 * The pipeline is Hugging Face's: added tokens are cut out of the raw text
 * (those with "normalized": false), the rest is normalized, normalized added
 * tokens are cut out of that, the pieces are pre-tokenized and BPE-encoded,
 * and the post-processor's TemplateProcessing (single template) adds the
 * special tokens.  Read, in any Sequence:
 *  - normalizers NFC, NFD, NFKC, NFKD (utf8proc), Lowercase, Strip,
 *    StripAccents, Prepend, Replace (string or regex);
 *  - pre-tokenizers Split (string or regex; Removed, Isolated,
 *    MergedWithPrevious, MergedWithNext, Contiguous; invert), Digits,
 *    ByteLevel (add_prefix_space, use_regex), Metaspace (prepend_scheme
 *    first / always / never or legacy add_prefix_space, split), Whitespace,
 *    WhitespaceSplit, Punctuation, BertPreTokenizer, CharDelimiterSplit;
 *    regexes run on PCRE2 (rt_tok_regex.h says how Oniguruma's are
 *    translated, and what is refused);
 *  - decoders ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace;
 *  - the BPE model: merges as ["a b", ...] or [["a", "b"], ...],
 *    byte_fallback, ignore_merges, unk_token, fuse_unk;
 *  - added_tokens with special, lstrip, rstrip, single_word, normalized.
 * Anything else (another model, normalizer, pre-tokenizer, decoder or
 * post-processor type, BPE dropout, a regex without a faithful translation)
 * is MC_ERR_UNSUPPORTED at load, naming the field and what it is; nothing
 * is approximated.
 *
 * Behaviour that differs from the Hugging Face library, on purpose:
 *  - encode accepts any bytes: an invalid UTF-8 byte is a character of its
 *    own that no regex class matches and normalizers pass through;
 *    byte-level and byte_fallback vocabularies encode it losslessly.
 *  - decode returns the exact bytes; it does not replace invalid UTF-8 with
 *    U+FFFD (so concatenated partial decodes keep multi-byte characters).
 *
 * Input is untrusted: every JSON field is type-checked and errors name the
 * file and the field (e.g. "model.merges[17]").  Ids are int32 in
 * [0, vocab_size).  vocab_size is the largest id (model or added) + 1; ids
 * inside that range that name no token are rejected by decode.
 *
 * Thread safety: a loaded tokenizer is read-only; encode/decode may run on
 * several threads at once (each call allocates its own scratch).
 * All allocation goes through mc_malloc (fault injection).
 */
#ifndef RT_TOKENIZER_H
#define RT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "mc_error.h"

typedef struct rt_tokenizer rt_tokenizer;

/* Load `path` (a tokenizer.json).  If a tokenizer_config.json sits next to
 * it, its bos_token / eos_token (string or {"content": ...}) name the BOS and
 * EOS ids; otherwise BOS is the first special token of the post-processor
 * template and EOS is the first of "</s>", "<|end_of_text|>",
 * "<|endoftext|>", "<|im_end|>" that exists.  On success *out is new and the
 * caller frees it with rt_tokenizer_free.  On failure *out is NULL. */
mc_status rt_tokenizer_load(const char *path, rt_tokenizer **out, mc_error *err);

/* Same from a tokenizer.json held in memory (no sibling config is read).
 * name is used in error messages only (may be NULL). */
mc_status rt_tokenizer_load_memory(const void *data, size_t len,
                                   const char *name, rt_tokenizer **out,
                                   mc_error *err);

/* Free; NULL is a no-op. */
void rt_tokenizer_free(rt_tokenizer *tok);

/* Encode len bytes of text (need not be NUL-terminated; text may be NULL
 * when len is 0).  add_special != 0 applies the post-processor template
 * (e.g. Llama's "<s>" prefix).  Writes the ids to ids[0..cap) and the count
 * to *n.  If the ids do not fit, *n is set to the number needed, nothing
 * useful is written, and MC_ERR_INVALID_ARG is returned (a size query:
 * ids = NULL, cap = 0).  Errors: MC_ERR_NOMEM, MC_ERR_INVALID_ARG. */
mc_status rt_tokenizer_encode(const rt_tokenizer *tok, const char *text,
                              size_t len, int add_special, int32_t *ids,
                              size_t cap, size_t *n, mc_error *err);

/* Decode n ids to text in buf (always NUL-terminated when cap > 0).
 * skip_special != 0 drops special added tokens (e.g. <s>, </s>).  *len gets
 * the text length in bytes, excluding the NUL.  If len + 1 > cap, *len is
 * the length needed and MC_ERR_INVALID_ARG is returned (buf = NULL, cap = 0
 * is a size query).  An id outside [0, vocab_size) or naming no token is
 * MC_ERR_INVALID_ARG (*len = 0).  MC_ERR_NOMEM if scratch space fails. */
mc_status rt_tokenizer_decode(const rt_tokenizer *tok, const int32_t *ids,
                              size_t n, int skip_special, char *buf,
                              size_t cap, size_t *len);

/* Largest token id + 1 (model vocabulary and added tokens). */
size_t rt_tokenizer_vocab_size(const rt_tokenizer *tok);
/* BOS / EOS id, or -1 when the tokenizer names none (see rt_tokenizer_load). */
int32_t rt_tokenizer_bos(const rt_tokenizer *tok);
int32_t rt_tokenizer_eos(const rt_tokenizer *tok);

/* Id of the token whose text is exactly s[0..len) (added tokens first, then
 * the model vocabulary, in its stored form, e.g. "▁the" or "Ġthe"); -1 if
 * none. */
int32_t rt_tokenizer_token_to_id(const rt_tokenizer *tok, const char *s,
                                 size_t len);

/* Stored text of token id (borrowed, valid until rt_tokenizer_free; not
 * NUL-terminated), its length in *len; NULL if id names no token.  An added
 * token with "normalized": true is given in its normalized form (what
 * decode shows, as Hugging Face's id_to_token does). */
const char *rt_tokenizer_id_to_token(const rt_tokenizer *tok, int32_t id,
                                     size_t *len);

/* 1 if id is a special added token (<s>, <|endoftext|>, ...), else 0. */
int rt_tokenizer_is_special(const rt_tokenizer *tok, int32_t id);

#endif /* RT_TOKENIZER_H */
