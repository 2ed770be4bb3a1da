/* fuzz_tok_json.h - a small SentencePiece-style tokenizer.json (BPE with
 * byte fallback, Metaspace, <unk>/<s>/</s>) shared by the fuzz targets
 * that need a fixed tokenizer.  Header-only: fuzz/CMakeLists.txt builds
 * every fuzz_*.c alone. */
#ifndef FUZZ_TOK_JSON_H
#define FUZZ_TOK_JSON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MS "\xE2\x96\x81" /* U+2581, SentencePiece's space */

static const char SPM[] =
    "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true},"
    "{\"id\":1,\"content\":\"<s>\",\"special\":true},{\"id\":2,\"content\":"
    "\"</s>\",\"special\":true}],\"pre_tokenizer\":{\"type\":\"Metaspace\","
    "\"replacement\":\"" MS "\",\"prepend_scheme\":\"first\",\"split\":"
    "false},\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":"
    "\"Replace\",\"pattern\":{\"String\":\"" MS "\"},\"content\":\" \"},"
    "{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\","
    "\"content\":\" \",\"start\":1,\"stop\":0}]},\"model\":{\"type\":"
    "\"BPE\",\"byte_fallback\":true,\"unk_token\":\"<unk>\",\"merges\":["
    "\"" MS " " MS "\",\"" MS " h\",\"l l\",\"" MS "h e\",\"a b\"],"
    "\"vocab\":{\"<unk>\":0,\"<s>\":1,\"</s>\":2,\"" MS "\":3,\"h\":4,"
    "\"e\":5,\"l\":6,\"a\":7,\"b\":8,\"" MS MS "\":9,\"" MS "h\":10,"
    "\"ll\":11,\"" MS "he\":12,\"ab\":13,\"\xC3\xA9\":14%s}}}";

/* The tokenizer.json text (malloc'ed; aborts on OOM): SPM, its 256
 * <0xNN> byte tokens (ids 15..270), then extra (JSON members starting
 * with ',', or ""). */
static char *fuzz_spm_json(const char *extra)
{
    char bytes[256 * 16 + 256] = "", *p = bytes;
    for (int b = 0; b < 256; b++)
        p += sprintf(p, ",\"<0x%02X>\":%d", b, 15 + b);
    if (strlen(extra) > 255)
        abort();
    strcat(bytes, extra);
    char *spm = malloc(sizeof SPM + sizeof bytes);
    if (!spm)
        abort();
    sprintf(spm, SPM, bytes);
    return spm;
}

#endif /* FUZZ_TOK_JSON_H */
