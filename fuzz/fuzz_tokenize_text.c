/* fuzz_tokenize_text.c - encode arbitrary bytes with two small fixed
 * tokenizers (byte-level with the Llama-3 split regex; SentencePiece-style
 * with byte fallback) and decode again.  Both must round-trip exactly
 * (the SentencePiece one only when the text does not start with a space,
 * which its decoder strips by design), and every id must be in range. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc_alloc.h"
#include "fuzz_tok_json.h"
#include "rt_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);


static size_t put_byte_char(char *out, int b)
{
    int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) ||
               (b >= 174 && b <= 255);
    int cp = b;
    if (!keep) {
        cp = 256;
        for (int x = 0; x < b; x++)
            cp += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) ||
                    (x >= 174 && x <= 255));
    }
    if (cp == '"' || cp == '\\') {
        out[0] = '\\';
        out[1] = (char)cp;
        return 2;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

static char *json_byte_level(void)
{
    size_t cap = 16384, o = 0;
    char *s = malloc(cap);
    if (!s)
        abort();
    o += (size_t)snprintf(s + o, cap - o,
        "{\"added_tokens\":[{\"id\":262,\"content\":\"<|endoftext|>\","
        "\"special\":true}],\"pre_tokenizer\":{\"type\":\"Sequence\","
        "\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
        "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?"
        "\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|"
        "\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":"
        "\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\","
        "\"add_prefix_space\":false,\"use_regex\":false}]},"
        "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\","
        "\"merges\":[\"\xC4\xA0 t\",\"h e\",\"\xC4\xA0t he\",\"i s\","
        "\"\xC4\xA0 is\",\"\xC4\xA0 \xC4\xA0\"],\"vocab\":{");
    for (int b = 0; b < 256; b++) {
        s[o++] = '"';
        o += put_byte_char(s + o, b);
        o += (size_t)snprintf(s + o, cap - o, "\":%d,", b);
    }
    o += (size_t)snprintf(s + o, cap - o,
        "\"\xC4\xA0t\":256,\"he\":257,\"\xC4\xA0the\":258,\"is\":259,"
        "\"\xC4\xA0is\":260,\"\xC4\xA0\xC4\xA0\":261}}}");
    return s;
}

/* g_tok[2] is g_tok[1] plus a token "x▁" no merge can build: it turns off
 * the chunking shortcut (rt_tokenizer.chunk) and must change nothing. */
static rt_tokenizer *g_tok[3];

static void init(void)
{
    if (g_tok[0])
        return;
    char *bl = json_byte_level();
    char *spm = fuzz_spm_json("");
    mc_error e;
    char msg[1600];
    if (rt_tokenizer_load_memory(bl, strlen(bl), "bl", &g_tok[0], &e) ||
        rt_tokenizer_load_memory(spm, strlen(spm), "spm", &g_tok[1], &e)) {
        fprintf(stderr, "fuzz_tokenize_text: %s\n",
                mc_error_format(&e, msg, sizeof msg));
        abort();
    }
    free(spm);
    spm = fuzz_spm_json(",\"x" MS "\":271");
    if (rt_tokenizer_load_memory(spm, strlen(spm), "spm2", &g_tok[2], &e)) {
        fprintf(stderr, "fuzz_tokenize_text: %s\n",
                mc_error_format(&e, msg, sizeof msg));
        abort();
    }
    free(bl);
    free(spm);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    init();
    if (size > 1 << 16)
        return 0;
    size_t cap = size * 4 + 8;
    int32_t *ids = malloc(cap * sizeof *ids);
    int32_t *ids2 = malloc(cap * sizeof *ids2);
    char *out = malloc(size * 8 + 64);
    if (!ids || !ids2 || !out)
        abort();
    for (int k = 0; k < 2; k++) {
        const rt_tokenizer *t = g_tok[k];
        size_t n = 0, len = 0;
        if (rt_tokenizer_encode(t, (const char *)data, size, 0, ids, cap, &n,
                                NULL) != MC_OK)
            abort();
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || (size_t)ids[i] >= rt_tokenizer_vocab_size(t))
                abort();
        if (rt_tokenizer_decode(t, ids, n, 0, out, size * 8 + 64, &len) !=
            MC_OK)
            abort();
        /* SentencePiece: the decoder strips the leading space, and a
         * literal U+2581 in the text decodes as a space */
        int check = k == 0 ||
                    (!(size && data[0] == ' ') &&
                     !memmem(data, size, MS, 3));
        if (check && (len != size || memcmp(out, data, size) != 0))
            abort();
    }
    /* with and without the chunking shortcut, the same ids */
    size_t n1 = 0, n2 = 0;
    if (rt_tokenizer_encode(g_tok[1], (const char *)data, size, 1, ids, cap,
                            &n1, NULL) != MC_OK ||
        rt_tokenizer_encode(g_tok[2], (const char *)data, size, 1, ids2, cap,
                            &n2, NULL) != MC_OK ||
        n1 != n2 || (n1 && memcmp(ids, ids2, n1 * sizeof *ids) != 0))
        abort();
    free(ids2);
    free(ids);
    free(out);
    return 0;
}
