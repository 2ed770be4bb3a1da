/* kn_names.c - the names of the weight formats and KV cache types (see
 * kn_quant.h): one table each, so the compiler that writes them and the
 * runtime that reads them cannot drift apart.  The weight formats' names
 * are the artifact's (formats/fmt_artifact.h: formats sit below kernels,
 * so the table lives there and the numbering is asserted here). */
#include "kn_quant.h"

#include <string.h>

#include "fmt_artifact.h"

_Static_assert(KN_W_F32 == (int)FMT_ART_F32 && KN_W_F16 == (int)FMT_ART_F16 &&
                   KN_W_BF16 == (int)FMT_ART_BF16 &&
                   KN_W_Q8 == (int)FMT_ART_Q8 && KN_W_Q4 == (int)FMT_ART_Q4 &&
                   KN_W_Q4S == (int)FMT_ART_Q4S &&
                   KN_W_COUNT_ == (int)FMT_ART_NFORMATS,
               "kn_wformat numbers the artifact's formats");

static const char *const g_kvtype[] = {
    [KN_KV_F32] = "f32", [KN_KV_F16] = "f16", [KN_KV_I8] = "int8",
};
#define N_KVTYPE (sizeof g_kvtype / sizeof g_kvtype[0])

const char *kn_wformat_name(kn_wformat f)
{
    return fmt_art_wformat_name((fmt_art_wformat)f);
}

int kn_wformat_parse(const char *s, kn_wformat *out)
{
    fmt_art_wformat f;
    if (fmt_art_wformat_parse(s, &f) != 0)
        return -1;
    *out = (kn_wformat)f;
    return 0;
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
