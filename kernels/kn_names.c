/* kn_names.c - the names of the weight formats and KV cache types (see
 * kn_quant.h): one table each, so the compiler that writes them and the
 * runtime that reads them cannot drift apart. */
#include "kn_quant.h"

#include <string.h>

static const char *const g_wformat[KN_W_COUNT_] = {
    [KN_W_F32] = "f32", [KN_W_F16] = "f16", [KN_W_BF16] = "bf16",
    [KN_W_Q8] = "q8",   [KN_W_Q4] = "q4",   [KN_W_Q4S] = "q4s",
};

static const char *const g_kvtype[] = {
    [KN_KV_F32] = "f32", [KN_KV_F16] = "f16", [KN_KV_I8] = "int8",
};
#define N_KVTYPE (sizeof g_kvtype / sizeof g_kvtype[0])

const char *kn_wformat_name(kn_wformat f)
{
    return (unsigned)f < KN_W_COUNT_ ? g_wformat[f] : "?";
}

int kn_wformat_parse(const char *s, kn_wformat *out)
{
    for (int i = 0; s && i < KN_W_COUNT_; i++)
        if (strcmp(s, g_wformat[i]) == 0) {
            *out = (kn_wformat)i;
            return 0;
        }
    return -1;
}

const char *kn_kvtype_name(kn_kvtype t)
{
    return (unsigned)t < N_KVTYPE ? g_kvtype[t] : "?";
}

int kn_kvtype_parse(const char *s, kn_kvtype *out)
{
    if (s && strcmp(s, "i8") == 0) { /* the short form --kv has taken */
        *out = KN_KV_I8;
        return 0;
    }
    for (size_t i = 0; s && i < N_KVTYPE; i++)
        if (strcmp(s, g_kvtype[i]) == 0) {
            *out = (kn_kvtype)i;
            return 0;
        }
    return -1;
}
