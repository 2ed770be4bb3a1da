/*
 * mc_parse.h - the numbers of command-line options, parsed strictly.
 *
 * Both programs parse every integer and float option here, so the rules
 * are the same everywhere: the whole argument is one plain decimal number
 * (digits, for floats an optional sign, point and exponent); no spaces,
 * no hex, no "inf"/"nan", no trailing text; floats must be finite and not
 * overflow or underflow; and the value must lie in the range the option
 * allows.  On failure `why` receives a message naming the flag, the value
 * and what was expected, e.g.
 *   --temperature: expected a finite number in [0, 10000], got 'nan'
 * and the program prints it and exits 2 (usage).
 */
#ifndef MC_PARSE_H
#define MC_PARSE_H

#include <stddef.h>
#include <stdint.h>

/* Bounds of mc_parse_f64: lo is excluded (e.g. --top-p in (0, 1]). */
#define MC_PARSE_LO_OPEN 1

/* Parse s as a float option into *out.  flags: 0 or MC_PARSE_LO_OPEN.
 * Returns 0, or -1 with the message in why[n] (*out untouched). */
int mc_parse_f64(const char *flag, const char *s, double lo, double hi,
                 int flags, double *out, char *why, size_t n);

/* Parse s as an unsigned integer option in [lo, hi] into *out.  Returns 0,
 * or -1 with the message in why[n] (*out untouched). */
int mc_parse_u64(const char *flag, const char *s, uint64_t lo, uint64_t hi,
                 uint64_t *out, char *why, size_t n);

#endif /* MC_PARSE_H */
