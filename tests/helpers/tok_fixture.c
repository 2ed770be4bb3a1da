/* tok_fixture.c - a small tokenizer.json for tests (see tok_fixture.h). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "tok_fixture.h"

#define MS "\xE2\x96\x81" /* U+2581, the SentencePiece space */

/* ---- a small SentencePiece-style tokenizer ------------------------------
 * <unk> 0, <s> 1 (or <pad> without BOS), </s> 2, <0x00>..<0xFF> 3..258,
 * "▁" 259, "a".."z" 260..285, no merges: a word of n lowercase letters is
 * "▁" + n letters, n + 1 ids, so token counts are known by construction;
 * anything else falls back to bytes. */
char *tu_spm_tokenizer_json(int with_bos)
{
    json_t *vocab = json_object();
    json_object_set_new(vocab, "<unk>", json_integer(0));
    json_object_set_new(vocab, with_bos ? "<s>" : "<pad>", json_integer(1));
    json_object_set_new(vocab, "</s>", json_integer(2));
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        json_object_set_new(vocab, name, json_integer(3 + b));
    }
    json_object_set_new(vocab, MS, json_integer(TU_SPM_SPACE));
    for (int c = 0; c < 26; c++) {
        char name[2] = {(char)('a' + c), 0};
        json_object_set_new(vocab, name, json_integer(TU_SPM_A + c));
    }
    json_t *model = json_pack(
        "{s:s,s:n,s:s,s:n,s:n,s:b,s:b,s:b,s:o,s:[]}", "type", "BPE",
        "dropout", "unk_token", "<unk>", "continuing_subword_prefix",
        "end_of_word_suffix", "fuse_unk", 0, "byte_fallback", 1,
        "ignore_merges", 0, "vocab", vocab, "merges");
    json_t *added = json_array();
    const char *names[3] = {"<unk>", with_bos ? "<s>" : "<pad>", "</s>"};
    for (int i = 0; i < 3; i++)
        json_array_append_new(
            added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", i,
                             "content", names[i], "single_word", 0, "lstrip",
                             0, "rstrip", 0, "normalized", 0, "special", 1));
    json_t *pre = json_pack("{s:s,s:s,s:s,s:b}", "type", "Metaspace",
                            "replacement", MS, "prepend_scheme", "first",
                            "split", 0);
    json_t *dec = json_pack(
        "{s:s,s:[{s:s,s:{s:s},s:s},{s:s},{s:s},{s:s,s:s,s:i,s:i}]}", "type",
        "Sequence", "decoders", "type", "Replace", "pattern", "String", MS,
        "content", " ", "type", "ByteFallback", "type", "Fuse", "type",
        "Strip", "content", " ", "start", 1, "stop", 0);
    json_t *post = with_bos
        ? json_pack("{s:s,s:[{s:{s:s,s:i}},{s:{s:s,s:i}}],"
                    "s:{s:{s:s,s:[i],s:[s]}}}",
                    "type", "TemplateProcessing", "single", "SpecialToken",
                    "id", "<s>", "type_id", 0, "Sequence", "id", "A",
                    "type_id", 0, "special_tokens", "<s>", "id", "<s>", "ids",
                    1, "tokens", "<s>")
        : json_null();
    json_t *root = json_pack("{s:s,s:n,s:n,s:o,s:n,s:o,s:o,s:o,s:o}",
                             "version", "1.0", "truncation", "padding",
                             "added_tokens", added, "normalizer",
                             "pre_tokenizer", pre, "post_processor", post,
                             "decoder", dec, "model", model);
    assert_non_null(root);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    assert_non_null(s);
    return s;
}

/* ---- a tokenizer for the fixture models --------------------------------
 * A tiny SentencePiece-style tokenizer whose ids fit the fixtures'
 * vocabulary of 256: specials 0-2, "▁" 3, "a".."z" 4-29, "Z030"..
 * "Z255" for the rest, no merges. */
void tu_tiny_tokenizer_write(const char *path)
{
    char vocab[8192];
    size_t k = (size_t)snprintf(vocab, sizeof vocab,
                                "\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, "
                                "\"\xe2\x96\x81\": 3");
    for (int c = 0; c < 26; c++)
        k += (size_t)snprintf(vocab + k, sizeof vocab - k, ", \"%c\": %d",
                              'a' + c, 4 + c);
    for (int id = 30; id < 256; id++) /* every id decodes */
        k += (size_t)snprintf(vocab + k, sizeof vocab - k, ", \"Z%03d\": %d",
                              id, id);
    char *json = tu_fmt(
        "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, "
        "\"added_tokens\": ["
        "{\"id\": 0, \"content\": \"<unk>\", \"single_word\": false, "
        "\"lstrip\": false, \"rstrip\": false, \"normalized\": false, "
        "\"special\": true}, "
        "{\"id\": 1, \"content\": \"<s>\", \"single_word\": false, "
        "\"lstrip\": false, \"rstrip\": false, \"normalized\": false, "
        "\"special\": true}, "
        "{\"id\": 2, \"content\": \"</s>\", \"single_word\": false, "
        "\"lstrip\": false, \"rstrip\": false, \"normalized\": false, "
        "\"special\": true}], "
        "\"normalizer\": null, "
        "\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": "
        "\"\xe2\x96\x81\", \"prepend_scheme\": \"first\", \"split\": false}, "
        "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": "
        "[{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, "
        "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], "
        "\"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1], "
        "\"tokens\": [\"<s>\"]}}}, "
        "\"decoder\": {\"type\": \"Metaspace\", \"replacement\": "
        "\"\xe2\x96\x81\", \"prepend_scheme\": \"first\", \"split\": false}, "
        "\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": "
        "\"<unk>\", \"continuing_subword_prefix\": null, "
        "\"end_of_word_suffix\": null, \"fuse_unk\": true, "
        "\"byte_fallback\": false, \"ignore_merges\": false, "
        "\"vocab\": {%s}, \"merges\": []}}", vocab);
    assert_int_equal(tu_write_file(path, json, strlen(json)), 0);
    free(json);
}
