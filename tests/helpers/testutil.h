/*
 * testutil.h - small helpers shared by the cmocka tests.
 *
 * Include after <stdarg.h>, <stddef.h>, <setjmp.h>, <stdint.h> and
 * <cmocka.h> (cmocka's rule).  Paths come from compile definitions set in
 * tests/CMakeLists.txt: MC_SOURCE_DIR, MC_FIXTURE_DIR, MC_SHARED_DIR,
 * MC_BIN_DIR.
 */
#ifndef TESTUTIL_H
#define TESTUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cmp_calib.h"
#include "rt_session.h"

/* A fresh empty directory under $TMPDIR (or /tmp), unique per call; the
 * caller removes it with tu_rmtree.  Returns a static-free malloc'ed path. */
char *tu_mkdtemp(const char *tag);
/* rm -rf path (best effort). */
void tu_rmtree(const char *path);

/* snprintf into a malloc'ed string. */
char *tu_fmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Path of stories260k in ../shared, or NULL when absent (tests then print
 * why and skip). */
const char *tu_stories_dir(void);
/* Skip the current cmocka test, printing the reason, if cond. */
#define TU_SKIP_IF(cond, why)                                                  \
    do {                                                                       \
        if (cond) {                                                            \
            printf("[  SKIP    ] %s\n", why);                                  \
            skip();                                                            \
        }                                                                      \
    } while (0)

/* Run a shell command; returns its exit status (0-255, or 128+signal).
 * Captures stdout into *out and stderr into *err (malloc'ed, NUL-terminated;
 * pass NULL to discard). */
int tu_run(const char *cmd, char **out, char **err);

/* Run MC_BIN_DIR/prog with the printf-formatted argument string (a shell
 * command line), like tu_run; *out and *err are freed first (NULL is
 * fine) and replaced.  Returns the exit status. */
int tu_run_bin(char **out, char **err, const char *prog, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Read a whole file (malloc'ed, NUL-terminated, *len = its byte length,
 * binary safe); NULL on failure. */
char *tu_read_file(const char *path, size_t *len);
/* 1 if the file at path holds exactly the len bytes of want, else 0
 * (also 0 when it cannot be read). */
int tu_file_is(const char *path, const void *want, size_t len);
/* Write bytes to a file; 0 on success. */
int tu_write_file(const char *path, const void *data, size_t len);
/* 1 if the path exists. */
int tu_exists(const char *path);
/* Number of entries in a directory (excluding . and ..), -1 if none. */
int tu_count_entries(const char *dir);

/* nseq sequences of T token ids below V, the same every run, as the flat
 * arrays cmp_calib_run takes: *tok [nseq * T], *off [nseq + 1] (malloc'ed,
 * the caller frees both). */
void tu_random_seqs(uint32_t V, size_t nseq, size_t T, int32_t **tok,
                    size_t **off);

/* Opens generated fixture `name` (MC_FIXTURE_DIR/name; its path in *path)
 * and draws tu_random_seqs(vocab, nseq, T) into *tok and *off; all new,
 * released by tu_fixture_close.  Fails the test if the model does not open. */
struct rt_model;
struct rt_model *tu_fixture_open(const char *name, size_t nseq, size_t T,
                                 char **path, int32_t **tok, size_t **off);
void tu_fixture_close(struct rt_model *m, char *path, int32_t *tok, size_t *off);

/* A cmocka setup/teardown that switches the kernels back to their defaults
 * (kn_set_no_avx512(0), kn_set_force_scalar(0), kn_set_float_dot(0)), so
 * a test that flips one does not leak it into the next. */
int tu_reset_kernel_switches(void **state);

/* Logits [n][vocab] of one prompt of n ids through m (malloc'ed), from a
 * session of one sequence of n positions, f32 KV cache, 2 threads and
 * prefill chunks of `chunk` tokens (up to 8: the decode kernels; more:
 * the prefill GEMM).  Fails the test on any error. */
float *tu_prompt_logits(const struct rt_model *m, const int32_t *ids,
                        uint32_t n, uint32_t chunk);

/* A xorshift64 generator; each test seeds its own (static tu_rng g = {seed})
 * so that its inputs do not depend on other tests. */
typedef struct tu_rng {
    uint64_t s; /* state, never 0 */
} tu_rng;
/* The next 32 random bits. */
uint32_t tu_rng_u32(tu_rng *r);
/* A float in [-1, 1) with 24 random bits. */
float tu_rng_f(tu_rng *r);
/* x[i] = amp * tu_rng_f(r) for i < n. */
void tu_rng_fill(tu_rng *r, float *x, size_t n, float amp);

/* Normalized error ||a - b|| / ||b|| of n floats (b the reference; plain
 * ||a - b|| when b is all zero), summed in double. */
double tu_norm_err(const float *a, const float *b, size_t n);

/* Calibration options of the default compile for int4: group g, the best
 * method, rotated, `heldout` sequences held out; everything else zero. */
cmp_calib_opts tu_calib_opts_best_q4(uint32_t group, size_t heldout);

/* A kn_pool of n threads whose workers have all run once: they free
 * their start-up arguments then, which would otherwise show up as frees
 * inside an mc_alloc measurement.  Fails the test if it cannot be made;
 * free with kn_pool_free. */
struct kn_pool;
struct kn_pool *tu_pool_warm(int n);

/* The backend the scheduler's tests run on, chosen by the harness:
 * $MC_TEST_BACKEND = "cpu" (default) or "cuda" (scripts/gpu-check runs
 * the session tests with cuda).  Another value fails the test. */
rt_device tu_backend(void);
/* rt_session_create on tu_backend().  On cuda, a missing device or build
 * and what the CUDA backend does not support (f16/int8 KV, ...) skip the
 * current test, printing the reason.  Returns the create status. */
mc_status tu_session_create(const rt_model *m, const rt_limits *lim,
                            const rt_layout *layout, rt_session **out,
                            mc_error *err);
/* mcrt_open(dir) with o->device set to tu_backend(): on cuda, a missing
 * device skips the current test (printing why); any other failure fails
 * it.  Returns the open handle. */
struct mcrt;
struct mcrt_options;
struct mcrt *tu_mcrt_open(const char *dir, struct mcrt_options *o);
/* Skip the current test on a backend that is not the CPU (for what only
 * the CPU backend has: the calibration tap, the arena canary). */
#define TU_SKIP_UNLESS_CPU(what)                                               \
    TU_SKIP_IF(tu_backend() != RT_DEVICE_CPU, what " is CPU-only")

#endif /* TESTUTIL_H */
