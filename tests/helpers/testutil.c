/* testutil.c - helpers shared by the cmocka tests (see testutil.h). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "testutil.h"

#include "kn_ops.h"
#include "kn_qdot.h"
#include "mcrt.h"
#include "rt_model.h"

#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

char *tu_fmt(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = malloc((size_t)n + 1);
    assert_non_null(s);
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

char *tu_mkdtemp(const char *tag)
{
    const char *base = getenv("TMPDIR");
    char *tmpl = tu_fmt("%s/mc-%s-XXXXXX", base && *base ? base : "/tmp", tag);
    assert_non_null(mkdtemp(tmpl));
    return tmpl;
}

void tu_rmtree(const char *path)
{
    if (!path || !*path)
        return;
    char *cmd = tu_fmt("rm -rf '%s'", path);
    int rc = system(cmd);
    (void)rc;
    free(cmd);
}

const char *tu_stories_dir(void)
{
    static char path[4096];
    snprintf(path, sizeof path, "%s/models/stories260k", MC_SHARED_DIR);
    char cfg[4200];
    snprintf(cfg, sizeof cfg, "%s/model.safetensors", path);
    return access(cfg, R_OK) == 0 ? path : NULL;
}

static char *slurp_fd(int fd, size_t *len_out)
{
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    for (;;) {
        if (len + 1 >= cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    buf[len] = '\0';
    if (len_out)
        *len_out = len;
    return buf;
}

int tu_run(const char *cmd, char **out, char **err)
{
    char *dir = tu_mkdtemp("run");
    char *outp = tu_fmt("%s.out", dir);
    free(dir);
    char *errp = tu_fmt("%s.err", outp);
    char *full = tu_fmt("( %s ) >'%s' 2>'%s' </dev/null", cmd, outp, errp);
    int st = system(full);
    int rc = WIFEXITED(st) ? WEXITSTATUS(st)
             : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 255;
    if (out) {
        char *s = tu_read_file(outp, NULL);
        *out = s ? s : calloc(1, 1);
    }
    if (err) {
        char *s = tu_read_file(errp, NULL);
        *err = s ? s : calloc(1, 1);
    }
    /* outp is "<dir>.out": remove the files and the directory */
    unlink(outp);
    unlink(errp);
    outp[strlen(outp) - 4] = '\0';
    tu_rmtree(outp);
    free(outp);
    free(errp);
    free(full);
    return rc;
}

int tu_run_bin(char **out, char **err, const char *prog, const char *fmt, ...)
{
    char args[16384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    free(*out);
    free(*err);
    *out = *err = NULL;
    char *cmd = tu_fmt("%s/%s %s", MC_BIN_DIR, prog, args);
    int rc = tu_run(cmd, out, err);
    free(cmd);
    return rc;
}

char *tu_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *s = slurp_fd(fileno(f), len);
    fclose(f);
    return s;
}

int tu_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(data, 1, len, f);
    int rc = fclose(f);
    return (w == len && rc == 0) ? 0 : -1;
}

int tu_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

int tu_count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

uint32_t tu_rng_u32(tu_rng *r)
{
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (uint32_t)(r->s >> 16);
}

float tu_rng_f(tu_rng *r)
{
    return (float)((tu_rng_u32(r) & 0xffffff) / 8388608.0 - 1.0);
}

void tu_rng_fill(tu_rng *r, float *x, size_t n, float amp)
{
    for (size_t i = 0; i < n; i++)
        x[i] = amp * tu_rng_f(r);
}

double tu_norm_err(const float *a, const float *b, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

void tu_random_seqs(uint32_t V, size_t nseq, size_t T, int32_t **tok,
                    size_t **off)
{
    *tok = malloc(nseq * T * sizeof(int32_t));
    *off = malloc((nseq + 1) * sizeof(size_t));
    assert_non_null(*tok);
    assert_non_null(*off);
    uint64_t s = 12345;
    for (size_t i = 0; i < nseq * T; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        (*tok)[i] = (int32_t)((s >> 33) % V);
    }
    for (size_t i = 0; i <= nseq; i++)
        (*off)[i] = i * T;
}

rt_model *tu_fixture_open(const char *name, size_t nseq, size_t T, char **path,
                          int32_t **tok, size_t **off)
{
    *path = tu_fmt("%s/%s", MC_FIXTURE_DIR, name);
    rt_model *m = NULL;
    assert_int_equal(rt_model_open_hf(*path, &m, NULL), MC_OK);
    tu_random_seqs(m->cfg.vocab_size, nseq, T, tok, off);
    return m;
}

void tu_fixture_close(rt_model *m, char *path, int32_t *tok, size_t *off)
{
    free(tok);
    free(off);
    rt_model_free(m);
    free(path);
}

static void tu_noop_job(void *ctx, int tid, int nth)
{
    (void)ctx;
    (void)tid;
    (void)nth;
}

kn_pool *tu_pool_warm(int n)
{
    kn_pool *p = kn_pool_create(n);
    assert_non_null(p);
    kn_pool_run(p, tu_noop_job, NULL);
    return p;
}

cmp_calib_opts tu_calib_opts_best_q4(uint32_t group, size_t heldout)
{
    cmp_calib_opts o;
    memset(&o, 0, sizeof o);
    o.fmt = KN_W_Q4;
    o.group = group;
    o.method = CMP_QM_BEST;
    o.rotate = 1;
    o.heldout = heldout;
    return o;
}

rt_device tu_backend(void)
{
    const char *b = getenv("MC_TEST_BACKEND");
    rt_device d = RT_DEVICE_CPU;
    if (b && *b && rt_device_parse(b, &d) != MC_OK)
        fail_msg("MC_TEST_BACKEND=%s: expected cpu or cuda", b);
    return d;
}

mc_status tu_session_create(const rt_model *m, const rt_limits *lim,
                            const rt_layout *layout, rt_session **out,
                            mc_error *err)
{
    rt_device d = tu_backend();
    mc_error local;
    if (!err)
        err = &local;
    mc_status st = rt_session_create_on(m, lim, layout, d, out, err);
    if (st == MC_ERR_UNSUPPORTED && d != RT_DEVICE_CPU) {
        char buf[1400];
        printf("[  SKIP    ] %s backend: %s\n", rt_device_name(d),
               mc_error_format(err, buf, sizeof buf));
        skip();
    }
    return st;
}

mcrt *tu_mcrt_open(const char *dir, mcrt_options *o)
{
    o->device = tu_backend() == RT_DEVICE_CUDA ? MCRT_DEVICE_CUDA
                                               : MCRT_DEVICE_CPU;
    mcrt *h = NULL;
    int rc = mcrt_open(dir, o, &h);
    TU_SKIP_IF(rc == MC_ERR_UNSUPPORTED && o->device == MCRT_DEVICE_CUDA,
               mcrt_last_error(NULL));
    assert_int_equal(rc, 0);
    return h;
}

int tu_file_is(const char *path, const void *want, size_t len)
{
    size_t n = 0;
    char *got = tu_read_file(path, &n);
    int same = got && n == len && memcmp(got, want, len) == 0;
    free(got);
    return same;
}

float *tu_prompt_logits(const rt_model *m, const int32_t *ids, uint32_t n,
                        uint32_t chunk)
{
    rt_limits L = {.max_batch = 1, .max_seq = n, .prefill_chunk = chunk,
                   .kv_type = KN_KV_F32, .threads = 2};
    rt_session *s;
    mc_error e;
    assert_int_equal(rt_session_create(m, &L, NULL, &s, &e), MC_OK);
    float *lg = malloc((size_t)n * m->cfg.vocab_size * sizeof(float));
    assert_non_null(lg);
    rt_prompt p = {ids, n};
    float *outs[1] = {lg};
    assert_int_equal(rt_session_logits(s, &p, 1, outs, &e), MC_OK);
    rt_session_free(s);
    return lg;
}

int tu_reset_kernel_switches(void **state)
{
    (void)state;
    kn_set_no_avx512(0);
    kn_set_force_scalar(0);
    kn_set_float_dot(0);
    kn_set_pool_min_values(0);
    return 0;
}
