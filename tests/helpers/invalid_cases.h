/*
 * invalid_cases.h - the invalid-input suites kept as data folders.
 *
 * Layout (one folder per case, as in jansson's test/suites/invalid):
 *   tests/invalid/<group>/<case>/    the bad file(s) the parser is given
 *   tests/invalid/<group>/<case>/expect
 *       one line: a substring the formatted mc_error must contain
 * Groups: safetensors, index (formats), config, adapter (their owners).
 *
 * Include after <stdarg.h>, <stddef.h>, <setjmp.h>, <stdint.h>, <cmocka.h>.
 */
#ifndef INVALID_CASES_H
#define INVALID_CASES_H

/* Call check(case_dir, expect, ctx) for every case folder of group, in name
 * order.  expect is the first line of the case's expect file, trailing
 * whitespace removed (a case without one fails the running test).  Prints
 * each case's name first so a failing assertion can be traced to it.
 * Returns the number of cases (0 if the group folder is absent). */
int tu_for_each_invalid_case(const char *group,
                             void (*check)(const char *case_dir,
                                           const char *expect, void *ctx),
                             void *ctx);

/* Path (malloc'ed) of the one file in case_dir whose name ends in suffix,
 * or NULL if there is none. */
char *tu_case_file(const char *case_dir, const char *suffix);

/* Assert that the formatted error msg contains expect and the name of a
 * file inside case_dir (its path or its base name). */
void tu_assert_case_error(const char *case_dir, const char *expect,
                          const char *msg);

/* Whole file as bytes (malloc'ed, NUL added); *len gets the size.  NULL if
 * it cannot be opened.  (tu_read_file is for text: it stops at a NUL.) */
char *tu_read_binary(const char *path, size_t *len);

#endif /* INVALID_CASES_H */
