/* cmp_merge_write.c - streaming the merged model into a directory that
 * mirrors the input: same shard files and tensor order, index rewritten,
 * config and tokenizer files copied (contract in cmp_merge.h). */
#include "cmp_merge_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cmp_par.h"
#include "fmt_atomic.h"
#include "fmt_input.h"
#include "fmt_json_strict.h"
#include "mc_alloc.h"

/* Output is produced this many bytes of float32 rows at a time. */
#define CHUNK_BYTES (4u << 20)

/* dir + "/" + name into out (PATH_MAX); 0 if too long. */
static int path_join(char *out, const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    if (a + b + 2 > PATH_MAX)
        return 0;
    memcpy(out, dir, a);
    out[a] = '/';
    memcpy(out + a + 1, name, b + 1);
    return 1;
}

/* Files copied from the base directory besides config.json. */
static int is_side_file(const char *name)
{
    static const char *const exact[] = {
        "generation_config.json", "special_tokens_map.json",
        "added_tokens.json",      "vocab.json",
        "vocab.txt",              "merges.txt",
        "chat_template.json",     "chat_template.jinja",
        "tokenizer.model",        "tokenizer.json",
        "tokenizer_config.json",
    };
    for (size_t i = 0; i < sizeof exact / sizeof *exact; i++)
        if (strcmp(name, exact[i]) == 0)
            return 1;
    return strncmp(name, "tokenizer", 9) == 0 && name[9] != '\0';
}

/* Absolute form of path; for a path that does not exist yet, its parent's
 * real path plus the last component.  0 on failure. */
static int resolve(const char *path, char out[PATH_MAX])
{
    if (realpath(path, out))
        return 1;
    char tmp[PATH_MAX], tmp2[PATH_MAX], parent[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    snprintf(tmp2, sizeof tmp2, "%s", path);
    size_t l = strlen(tmp);
    while (l > 1 && tmp[l - 1] == '/') {
        l--;
        tmp[l] = tmp2[l] = '\0';
    }
    if (!realpath(dirname(tmp), parent))
        return 0;
    const char *base = basename(tmp2);
    if (strcmp(base, ".") == 0 || strcmp(base, "..") == 0)
        return 0;
    int n = snprintf(out, PATH_MAX, "%s/%s",
                     strcmp(parent, "/") ? parent : "", base);
    return n > 0 && n < PATH_MAX;
}

/* 1 if a is b or lies below it. */
static int inside(const char *a, const char *b)
{
    size_t lb = strlen(b);
    return strncmp(a, b, lb) == 0 && (a[lb] == '\0' || a[lb] == '/');
}

static mc_status check_out_dir(const cmp_merge *m, const char *out_dir,
                               mc_error *err)
{
    char out[PATH_MAX], in[PATH_MAX];
    if (!resolve(out_dir, out))
        return mc_fail(err, MC_ERR_IO, out_dir, NULL, -1,
                       "cannot resolve the output path (does its parent "
                       "directory exist?)");
    for (size_t k = 0; k <= m->n_adapters; k++) {
        const char *p = k == m->n_adapters ? fmt_model_dir(m->base)
                                           : fmt_peft_dir(m->adapters[k]);
        if (!p || !realpath(p, in))
            continue;
        if (inside(out, in) || inside(in, out))
            return mc_fail(err, MC_ERR_INVALID_ARG, out_dir, NULL, -1,
                           "output directory %s %s input %s: refusing to "
                           "overwrite an input", out,
                           strcmp(out, in) == 0 ? "is the"
                           : inside(out, in)    ? "lies inside the"
                                                : "contains the",
                           in);
    }
    return MC_OK;
}

static mc_status copy_file(const char *src, const char *dst, uint64_t *bytes,
                           mc_error *err)
{
    int in;
    mc_status ost = fmt_input_open(src, &in, NULL, err); /* FIFOs: no hang */
    if (ost != MC_OK)
        return ost;
    fmt_atomic_file *f;
    mc_status st = fmt_atomic_create(dst, &f, err);
    if (st) {
        close(in);
        return st;
    }
    char buf[65536];
    for (;;) {
        ssize_t r = read(in, buf, sizeof buf);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            st = mc_fail(err, MC_ERR_IO, src, NULL, -1, "read failed: %s",
                         strerror(errno));
            break;
        }
        if (r == 0)
            break;
        if ((st = fmt_atomic_write(f, buf, (size_t)r, err)))
            break;
        *bytes += (uint64_t)r;
    }
    close(in);
    if (st) {
        fmt_atomic_abort(f);
        return st;
    }
    return fmt_atomic_commit(f, err);
}

/* config.json: copied as is, or rewritten (key order kept) when lm_head is
 * untied or the dtype changes. */
static mc_status write_config(const cmp_merge *m, const char *dir,
                              fmt_dtype out_dtype, uint64_t *bytes,
                              mc_error *err)
{
    const char *src = fmt_model_config_path(m->base);
    char dst[PATH_MAX];
    if (!path_join(dst, dir, "config.json"))
        return mc_fail(err, MC_ERR_INVALID_ARG, dir, NULL, -1, "path too long");
    if (!src || access(src, R_OK) != 0)
        return MC_OK; /* a bare .safetensors without config: nothing to copy */
    if (!m->untie && out_dtype == FMT_DT_INVALID)
        return copy_file(src, dst, bytes, err);
    /* The strict loader tells an allocation that failed inside jansson's
     * lexer (which jansson reports as a syntax error) from a bad file. */
    json_t *root = NULL;
    mc_status st = fmt_json_load_file_strict(src, &root, err);
    if (st != MC_OK)
        return st;
    int ok = 1;
    if (m->untie)
        ok = json_object_set_new(root, "tie_word_embeddings", json_false()) == 0;
    if (ok && out_dtype != FMT_DT_INVALID) {
        const char *name = out_dtype == FMT_DT_F32   ? "float32"
                           : out_dtype == FMT_DT_F16 ? "float16"
                                                     : "bfloat16";
        const char *key = json_object_get(root, "dtype") ? "dtype"
                                                         : "torch_dtype";
        ok = json_object_set_new(root, key, json_string(name)) == 0;
    }
    char *text = ok ? json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(17))
                    : NULL;
    json_decref(root);
    if (!text)
        return mc_fail(err, MC_ERR_NOMEM, src, NULL, -1, "out of memory");
    fmt_atomic_file *f;
    size_t len = strlen(text);
    st = fmt_atomic_create(dst, &f, err);
    if (st == MC_OK) {
        if ((st = fmt_atomic_write(f, text, len, err)) == MC_OK &&
            (st = fmt_atomic_write(f, "\n", 1, err)) == MC_OK) {
            st = fmt_atomic_commit(f, err);
            *bytes += len + 1;
        } else {
            fmt_atomic_abort(f);
        }
    }
    json_free_t jfree;
    json_get_alloc_funcs(NULL, &jfree);
    jfree(text);
    return st;
}

static fmt_dtype out_type(const merge_tensor *t, fmt_dtype out_dtype)
{
    if (out_dtype == FMT_DT_INVALID || !fmt_dtype_is_float(t->src->dtype))
        return t->src->dtype;
    return out_dtype;
}

/* Queue tensor t's bytes (dtype dt) for the writer thread: untouched
 * tensors straight from the mapped input, others computed a chunk of rows
 * at a time into the queue's free buffer, summed (t->sum) as written. */
static mc_status write_tensor(cmp_merge *m, merge_queue *q, merge_tensor *t,
                              fmt_dtype dt, uint64_t rows_per_chunk,
                              mc_error *err)
{
    mc_status st = MC_OK;
    if (t->n_ops == 0 && dt == t->src->dtype) {
        const unsigned char *d = t->src->data;
        for (uint64_t off = 0; off < t->src->nbytes && st == MC_OK;
             off += CHUNK_BYTES) {
            uint64_t k = t->src->nbytes - off < CHUNK_BYTES
                             ? t->src->nbytes - off
                             : CHUNK_BYTES;
            st = cmp_merge_queue_push_(q, d + off, (size_t)k, NULL, d + off,
                                       k, err);
        }
        return st;
    }
    uint64_t rows, cols;
    cmp_merge_dims_(t->src, &rows, &cols);
    size_t es = fmt_dtype_size(dt), ies = fmt_dtype_size(t->src->dtype);
    cmp_merge_wsum_init_(&t->sum);
    for (uint64_t r0 = 0; r0 < rows && st == MC_OK; r0 += rows_per_chunk) {
        uint64_t n = rows - r0 < rows_per_chunk ? rows - r0 : rows_per_chunk;
        size_t k = (size_t)(n * cols);
        void *obuf = cmp_merge_queue_buffer_(q);
        if ((st = cmp_merge_rows_(m, t, r0, n, dt, obuf, err)))
            break;
        if (dt == FMT_DT_F16)
            for (size_t j = 0; j < k; j++) {
                uint16_t h;
                memcpy(&h, (unsigned char *)obuf + 2 * j, 2);
                if ((h & 0x7c00) == 0x7c00) {
                    cmp_merge_release_(m);
                    return mc_fail(err, MC_ERR_NONFINITE, NULL, t->name, -1,
                                   "merged value at row %llu, column %llu "
                                   "overflows float16; use --dtype bf16 or "
                                   "f32", (unsigned long long)(r0 + j / cols),
                                   (unsigned long long)(j % cols));
                }
            }
        /* input rows are done with once computed */
        cmp_merge_drop_range_((const unsigned char *)t->src->data +
                                  r0 * cols * ies, n * cols * ies);
        st = cmp_merge_queue_push_(q, obuf, k * es, &t->sum, NULL, 0, err);
    }
    cmp_merge_release_(m);
    return st;
}

static mc_status write_shard(cmp_merge *m, const char *dir, size_t shard,
                             fmt_dtype out_dtype, merge_queue *q,
                             uint64_t *bytes, mc_error *err)
{
    const char *name = fmt_model_shard_name(m->base, shard);
    const fmt_st_file *in = fmt_model_shard(m->base, shard);
    char path[PATH_MAX];
    if (!path_join(path, dir, name))
        return mc_fail(err, MC_ERR_INVALID_ARG, dir, NULL, -1, "path too long");
    fmt_st_writer *w;
    mc_status st = fmt_st_writer_create(path, &w, err);
    if (st)
        return st;
    for (size_t i = 0; i < m->n_tensors && st == MC_OK; i++) {
        const merge_tensor *t = &m->tensors[i];
        if (t->shard == shard)
            st = fmt_st_writer_add(w, t->name, out_type(t, out_dtype),
                                   t->src->ndim, t->src->shape, err);
    }
    for (size_t i = 0; st == MC_OK && i < fmt_st_metadata_count(in); i++) {
        const char *k, *v;
        if (fmt_st_metadata_at(in, i, &k, &v) && strcmp(k, "format") != 0)
            st = fmt_st_writer_set_metadata(w, k, v, err);
    }
    if (st == MC_OK)
        st = fmt_st_writer_begin_data(w, err);
    cmp_merge_queue_set_writer_(q, w);
    for (size_t i = 0; i < m->n_tensors && st == MC_OK; i++) {
        merge_tensor *t = &m->tensors[i];
        if (t->shard != shard)
            continue;
        uint64_t rows, cols;
        cmp_merge_dims_(t->src, &rows, &cols);
        uint64_t rpc = cols ? (CHUNK_BYTES / 4) / cols : rows;
        /* whole row blocks for every thread (buffers allow for it) */
        rpc = (rpc + CMP_MERGE_CHUNK_ROWS - 1) / CMP_MERGE_CHUNK_ROWS *
              CMP_MERGE_CHUNK_ROWS;
        st = write_tensor(m, q, t, out_type(t, out_dtype), rpc ? rpc : 1,
                          err);
        m->progress_done +=
            t->src->nelem * fmt_dtype_size(out_type(t, out_dtype));
        if (st == MC_OK && m->progress)
            m->progress(m->progress_done, m->progress_total, m->progress_ctx);
    }
    /* everything queued is written (or failed) before the file is closed */
    mc_status qst = cmp_merge_queue_drain_(q, st ? NULL : err);
    st = st ? st : qst;
    if (st) {
        fmt_st_writer_abort(w);
        return st;
    }
    for (size_t i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].shard == shard && m->tensors[i].n_ops)
            m->tensors[i].hash = cmp_merge_wsum_end_(&m->tensors[i].sum);
    *bytes += fmt_st_writer_total_bytes(w);
    return fmt_st_writer_finish(w, err);
}

static mc_status write_index(const cmp_merge *m, const char *dir,
                             fmt_dtype out_dtype, uint64_t *bytes,
                             mc_error *err)
{
    const char **names = mc_calloc(m->n_tensors + 1, sizeof *names);
    const char **shards = mc_calloc(m->n_tensors + 1, sizeof *shards);
    if (!names || !shards) {
        mc_free(names);
        mc_free(shards);
        return mc_fail(err, MC_ERR_NOMEM, dir, NULL, -1, "out of memory");
    }
    uint64_t total = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const merge_tensor *t = &m->tensors[i];
        names[i] = t->name;
        shards[i] = fmt_model_shard_name(m->base, t->shard);
        total += t->src->nelem * fmt_dtype_size(out_type(t, out_dtype));
    }
    mc_status st = fmt_model_write_index(dir, total, names, shards,
                                         m->n_tensors, err);
    mc_free(names);
    mc_free(shards);
    if (st == MC_OK) {
        char p[PATH_MAX];
        FILE *f = path_join(p, dir, "model.safetensors.index.json")
                      ? fopen(p, "rb")
                      : NULL;
        if (f) {
            fseek(f, 0, SEEK_END);
            long n = ftell(f);
            *bytes += n > 0 ? (uint64_t)n : 0;
            fclose(f);
        }
    }
    return st;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(a, b);
}

/* 1 if name is a file this merge writes itself: a shard of the base (any
 * name: "tokenizer-00001-of-00002.safetensors" is a shard if the index
 * says so), the index or config.json.  Such files are never copied from
 * the base, whatever is_side_file thinks of their names. */
static int is_ours(const cmp_merge *m, const char *name)
{
    if (strcmp(name, "config.json") == 0 ||
        strcmp(name, "model.safetensors.index.json") == 0)
        return 1;
    for (size_t s = 0; s < fmt_model_shard_count(m->base); s++)
        if (strcmp(name, fmt_model_shard_name(m->base, s)) == 0)
            return 1;
    return 0;
}

static mc_status copy_side_files(const cmp_merge *m, const char *dir,
                                 uint64_t *bytes, mc_error *err)
{
    const char *src_dir = fmt_model_dir(m->base);
    char list[64][NAME_MAX + 1];
    size_t n = 0;
    /* Collect, then sort, so the copy order (and any error) is stable. */
    DIR *d = src_dir ? opendir(src_dir) : NULL;
    if (!d)
        return MC_OK;
    struct dirent *e;
    while ((e = readdir(d)) && n < 64)
        if (is_side_file(e->d_name) && !is_ours(m, e->d_name))
            snprintf(list[n++], sizeof list[0], "%s", e->d_name);
    closedir(d);
    qsort(list, n, sizeof list[0], cmp_names);
    for (size_t i = 0; i < n; i++) {
        char s[PATH_MAX], t[PATH_MAX];
        if (!path_join(s, src_dir, list[i]) || !path_join(t, dir, list[i]))
            return mc_fail(err, MC_ERR_INVALID_ARG, dir, NULL, -1,
                           "path too long");
        mc_status st = copy_file(s, t, bytes, err);
        if (st)
            return st;
    }
    return MC_OK;
}

/* Check sums of the tensors of one shard, on all row threads: each takes
 * the next tensor in turn (cmp_merge_verify's second step). */
typedef struct verify_job {
    const fmt_st_tensor **o;  /* [n] tensors to read back */
    uint64_t *got;            /* [n] their check sums */
    size_t n;
    _Atomic size_t next;      /* next tensor to take */
} verify_job;

static void verify_worker(void *ctx, int tid, int nth)
{
    verify_job *j = ctx;
    (void)tid;
    (void)nth;
    for (;;) {
        size_t k = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (k >= j->n)
            break;
        wsum sum;
        cmp_merge_wsum_init_(&sum);
        const unsigned char *p = j->o[k]->data;
        uint64_t nb = j->o[k]->nbytes;
        for (uint64_t off = 0; off < nb; off += CHUNK_BYTES) {
            uint64_t c = nb - off < CHUNK_BYTES ? nb - off : CHUNK_BYTES;
            cmp_merge_wsum_add_(&sum, p + off, (size_t)c);
            cmp_merge_drop_range_(p + off, c);
        }
        j->got[k] = cmp_merge_wsum_end_(&sum);
    }
}

/* Read the written shards back (dir: the merge's directory, written by
 * cmp_merge_write with out_dtype): every tensor of the merge is there with
 * its shape and output dtype, and every tensor an adapter changed has
 * exactly the bytes computed for it (check sum).  This is what makes the
 * report true: a later step that replaced a shard (once, copying a
 * side file named like one) cannot pass unnoticed.  The check sums of a
 * shard are computed on all row threads (the read-back ran on one core
 * after everything else: 0.16 s of 2 GiB, the other core idle); the
 * first failure in tensor order is the one reported, as before. */
mc_status cmp_merge_verify_(const cmp_merge *m, const char *dir,
                            fmt_dtype out_dtype, mc_error *err)
{
    size_t cap = m->n_tensors ? m->n_tensors : 1;
    const fmt_st_tensor **o = mc_calloc(cap, sizeof *o);
    uint64_t *got = mc_calloc(cap, sizeof *got);
    size_t *idx = mc_calloc(cap, sizeof *idx);
    mc_status st = MC_OK;
    if (!o || !got || !idx)
        st = mc_fail(err, MC_ERR_NOMEM, dir, NULL, -1, "out of memory");
    for (size_t s = 0; st == MC_OK && s < fmt_model_shard_count(m->base); s++) {
        char path[PATH_MAX];
        if (!path_join(path, dir, fmt_model_shard_name(m->base, s))) {
            st = mc_fail(err, MC_ERR_INVALID_ARG, dir, NULL, -1,
                         "path too long");
            break;
        }
        fmt_st_file *f = NULL;
        if ((st = fmt_st_open(path, &f, err)))
            break;
        /* 1: shapes and dtypes, up to the first that is wrong */
        size_t n = 0, bad = SIZE_MAX;
        for (size_t i = 0; i < m->n_tensors; i++) {
            const merge_tensor *t = &m->tensors[i];
            if (t->shard != s)
                continue;
            const fmt_st_tensor *x = fmt_st_find(f, t->name);
            if (!x || x->dtype != out_type(t, out_dtype) ||
                x->nelem != t->src->nelem) {
                bad = i;
                break;
            }
            if (t->n_ops) {
                o[n] = x;
                idx[n++] = i;
            }
        }
        /* 2: the check sums of the changed tensors before it */
        verify_job job = {o, got, n, 0};
        if (n > 1 && m->threads > 1)
            cmp_par_spawn(m->threads, verify_worker, &job);
        else
            verify_worker(&job, 0, 1);
        /* 3: the first failure in tensor order */
        for (size_t k = 0; k < n; k++)
            if (got[k] != m->tensors[idx[k]].hash) {
                st = mc_fail(err, MC_ERR_IO, path, m->tensors[idx[k]].name,
                             -1, "merged output is not what was written: "
                             "the tensor's bytes differ from the merged "
                             "values (another file replaced this shard?)");
                break;
            }
        if (st == MC_OK && bad != SIZE_MAX) {
            const fmt_st_tensor *x = fmt_st_find(f, m->tensors[bad].name);
            st = mc_fail(err, MC_ERR_IO, path, m->tensors[bad].name, -1,
                         "merged output is not what was written: the "
                         "tensor is %s (another file replaced this "
                         "shard?)", x ? "of another dtype or size"
                                      : "missing");
        }
        fmt_st_close(f);
    }
    mc_free(o);
    mc_free(got);
    mc_free(idx);
    return st;
}

mc_status cmp_merge_write(cmp_merge *m, const char *out_dir,
                          fmt_dtype out_dtype, cmp_merge_report *report,
                          mc_error *err)
{
    if (!m || !out_dir || !*out_dir)
        return mc_fail(err, MC_ERR_INVALID_ARG, out_dir, NULL, -1,
                       "NULL argument");
    if (out_dtype != FMT_DT_INVALID && !fmt_dtype_is_float(out_dtype))
        return mc_fail(err, MC_ERR_INVALID_ARG, out_dir, NULL, -1,
                       "output dtype must be F32, F16 or BF16");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    mc_status st = check_out_dir(m, out_dir, err);
    if (st)
        return st;
    /* Widest row chunk. */
    uint64_t maxcols = 1;
    for (size_t i = 0; i < m->n_tensors; i++) {
        uint64_t r, c;
        cmp_merge_dims_(m->tensors[i].src, &r, &c);
        maxcols = c > maxcols ? c : maxcols;
    }
    /* CHUNK_BYTES of float rows, rounded up to CMP_MERGE_CHUNK_ROWS rows */
    if (maxcols > (SIZE_MAX / sizeof(float) - CHUNK_BYTES) / CMP_MERGE_CHUNK_ROWS)
        return mc_fail(err, MC_ERR_NOMEM, out_dir, NULL, -1, "out of memory");
    size_t fcap = CHUNK_BYTES / 4 + (size_t)maxcols * CMP_MERGE_CHUNK_ROWS;
    merge_queue *q = NULL;
    fmt_atomic_dir *ad = NULL;
    st = cmp_merge_queue_create_(fcap * sizeof(float), &q, err);
    if (st == MC_OK)
        st = fmt_atomic_dir_create(out_dir, &ad, err);
    uint64_t bytes = 0;
    m->max_abs_delta = 0;
    m->progress_done = m->progress_total = 0;
    for (size_t i = 0; i < m->n_tensors; i++)
        m->progress_total += m->tensors[i].src->nelem *
                             fmt_dtype_size(out_type(&m->tensors[i], out_dtype));
    const char *dir = ad ? fmt_atomic_dir_path(ad) : NULL;
    /* Side files first: even a name is_ours() missed cannot then replace a
     * merged shard, and cmp_merge_verify_() checks the rest. */
    if (st == MC_OK)
        st = copy_side_files(m, dir, &bytes, err);
    for (size_t s = 0; st == MC_OK && s < fmt_model_shard_count(m->base); s++)
        st = write_shard(m, dir, s, out_dtype, q, &bytes, err);
    if (st == MC_OK && fmt_model_is_sharded(m->base))
        st = write_index(m, dir, out_dtype, &bytes, err);
    if (st == MC_OK)
        st = write_config(m, dir, out_dtype, &bytes, err);
    if (st == MC_OK)
        st = cmp_merge_verify_(m, dir, out_dtype, err);
    cmp_merge_queue_free_(q);
    if (st) {
        fmt_atomic_dir_abort(ad);
        return st;
    }
    if ((st = fmt_atomic_dir_commit(ad, err)))
        return st;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (report) {
        memset(report, 0, sizeof *report);
        report->tensors = m->n_tensors;
        for (size_t i = 0; i < m->n_tensors; i++)
            report->tensors_touched +=
                m->tensors[i].n_ops > 0 || m->tensors[i].untied;
        report->adapters = m->n_adapters;
        report->lora_modules = m->lora_modules;
        report->replaced = m->replaced;
        report->untied_lm_head = m->untie;
        report->max_abs_delta = m->max_abs_delta;
        report->bytes_written = bytes;
        report->seconds = (double)(t1.tv_sec - t0.tv_sec) +
                          1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    }
    return MC_OK;
}
