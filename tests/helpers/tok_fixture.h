/* tok_fixture.h - a small SentencePiece-style tokenizer.json for tests:
 * <unk> 0, <s> 1 (or <pad> without BOS), </s> 2, <0x00>..<0xFF> 3..258,
 * "\u2581" 259, "a".."z" 260..285, no merges: a word of n lowercase letters
 * is "\u2581" + n letters, n + 1 ids, so token counts are known by
 * construction; anything else falls back to bytes. */
#ifndef TOK_FIXTURE_H
#define TOK_FIXTURE_H

enum { TU_SPM_SPACE = 259, TU_SPM_A = 260, TU_SPM_VOCAB = 286 };

/* The tokenizer.json text (malloc'ed; the caller frees), with a BOS
 * (<s> and a TemplateProcessing post-processor) when with_bos is 1. */
char *tu_spm_tokenizer_json(int with_bos);

/* Write to path a tokenizer.json whose ids fit the fixture models'
 * vocabulary of 256: <unk> 0, <s> 1 (BOS, added to text), </s> 2,
 * "\u2581" 3, "a".."z" 4..29, "Z030".."Z255" 30..255, no merges (a word of
 * n letters is n + 1 ids).  Fails the test when it cannot. */
void tu_tiny_tokenizer_write(const char *path);

#endif /* TOK_FIXTURE_H */
