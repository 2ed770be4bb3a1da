/* mc_parse.c - strict option numbers (see mc_parse.h). */
#include "mc_parse.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 1 if s is [+-]digits[.digits][(e|E)[+-]digits] with at least one digit
 * in the mantissa: what strtod would take, minus hex, inf, nan and
 * leading spaces, which it would take too. */
static int plain_decimal(const char *s, int allow_sign, int allow_frac)
{
    const char *p = s;
    if (allow_sign && (*p == '+' || *p == '-'))
        p++;
    size_t digits = strspn(p, "0123456789");
    p += digits;
    if (allow_frac && *p == '.') {
        size_t d2 = strspn(p + 1, "0123456789");
        digits += d2;
        p += 1 + d2;
    }
    if (digits == 0)
        return 0;
    if (allow_frac && (*p == 'e' || *p == 'E')) {
        p++;
        if (*p == '+' || *p == '-')
            p++;
        size_t de = strspn(p, "0123456789");
        if (de == 0)
            return 0;
        p += de;
    }
    return *p == '\0';
}

int mc_parse_f64(const char *flag, const char *s, double lo, double hi,
                 int flags, double *out, char *why, size_t n)
{
    int lo_open = (flags & MC_PARSE_LO_OPEN) != 0;
    double v = 0;
    int ok = s && plain_decimal(s, 1, 1);
    if (ok) {
        errno = 0;
        char *end = NULL;
        v = strtod(s, &end);
        ok = end && *end == '\0' && errno == 0 && isfinite(v) &&
             (lo_open ? v > lo : v >= lo) && v <= hi;
    }
    if (!ok) {
        snprintf(why, n, "%s: expected a finite number in %c%g, %g], got "
                 "'%s'", flag, lo_open ? '(' : '[', lo, hi, s ? s : "");
        return -1;
    }
    *out = v;
    return 0;
}

int mc_parse_u64(const char *flag, const char *s, uint64_t lo, uint64_t hi,
                 uint64_t *out, char *why, size_t n)
{
    unsigned long long v = 0;
    int ok = s && plain_decimal(s, 0, 0);
    if (ok) {
        errno = 0;
        char *end = NULL;
        v = strtoull(s, &end, 10);
        ok = end && *end == '\0' && errno == 0 && v >= lo && v <= hi;
    }
    if (!ok) {
        snprintf(why, n, "%s: expected a whole number in [%llu, %llu], got "
                 "'%s'", flag, (unsigned long long)lo, (unsigned long long)hi,
                 s ? s : "");
        return -1;
    }
    *out = v;
    return 0;
}
