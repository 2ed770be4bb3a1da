/* fuzz_options.c - the numbers of command-line options (mc_parse.h) and
 * sizes (cmp_parse_size): any bytes are accepted or refused, never a crash;
 * an accepted float is finite and in its range, an accepted integer in its
 * range, and a refusal leaves the output untouched and names the flag. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_plan.h"
#include "mc_parse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096)
        return 0;
    char *s = malloc(size + 1); /* options are C strings: cut at a NUL */
    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    char why[256];
    double d = -7.0;
    why[0] = '\0';
    if (mc_parse_f64("--f", s, -1e6, 1e6, 0, &d, why, sizeof why) == 0) {
        if (!isfinite(d) || d < -1e6 || d > 1e6)
            abort();
    } else if (d != -7.0 || !strstr(why, "--f")) {
        abort();
    }
    if (mc_parse_f64("--p", s, 0, 1, MC_PARSE_LO_OPEN, &d, why, sizeof why) ==
            0 && !(d > 0 && d <= 1))
        abort();
    uint64_t u = 7;
    if (mc_parse_u64("--u", s, 1, 256, &u, why, sizeof why) == 0) {
        if (u < 1 || u > 256)
            abort();
    } else if (u != 7 || !strstr(why, "--u")) {
        abort();
    }
    (void)mc_parse_u64("--w", s, 0, UINT64_MAX, &u, why, sizeof why);
    (void)cmp_parse_size(s, &u);
    free(s);
    return 0;
}
