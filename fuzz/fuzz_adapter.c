/* fuzz_adapter.c - a whole PEFT adapter directory, as `mcompile merge BASE
 * --lora DIR` reads it: fmt_peft_open (module pairing, ranks, selection,
 * finiteness) and then cmp_merge_open + cmp_merge_tensor_f32 against a
 * small generated base model (shapes, fan_in_fan_out, DoRA, replacements,
 * the untied lm_head).  Any input must give a status or a merged tensor,
 * never a crash, a leak or a broken invariant of the adapter's accessors.
 *
 * Input layout (little-endian):
 *   offset 0   u32 N                       length of the config
 *   offset 4   N bytes                     adapter_config.json
 *   offset 4+N rest of the input           adapter_model.safetensors
 * An input shorter than 4 bytes, or with N > size - 4, is skipped.  Seeds:
 * fuzz/corpus/adapter/ (scripts/make-adapter-seeds.py packs the generated
 * fixture adapters).
 *
 * Base model: MC_FUZZ_BASE (environment) names a model directory used for
 * every input; otherwise base_model_name_or_path of the parsed config picks
 * one of the fixtures below under MC_FIXTURE_DIR (defined by
 * fuzz/CMakeLists.txt), and anything else gets fixtures/llama.  Choosing by
 * the config lets the seeds reach the biased, tied (qwen2), BF16 and
 * sharded bases without a selector byte the mutator would have to learn.
 * When no base opens, only fmt_peft_open is exercised.  A base given by
 * MC_FUZZ_BASE must hold finite weights (merged values are checked).
 *
 * The two files are written into one temporary directory per process
 * (made on the first input, removed at exit); bases are opened once and
 * kept, so an input costs two small writes and the parse and merge. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmp_merge.h"
#include "fmt_dtype.h"
#include "fmt_model.h"
#include "fmt_peft.h"
#include "mc_error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Merged tensors larger than this (elements) are not computed: the fixture
 * tensors are at most 64 x 256, and a fuzzed shape must not cost seconds. */
#define MAX_MERGE_ELEMS ((uint64_t)1 << 22)

/* Fixture bases an adapter may name (fixtures/gen_fixtures.c); adapters of
 * fixtures/gen_adapters.c target llama, llama-bias, qwen2 and mistral. */
static const char *const k_bases[] = {
    "llama", "llama-bias", "qwen2", "mistral",
    "llama-bf16", "llama-f16", "llama-sharded",
};
#define N_BASES (sizeof k_bases / sizeof k_bases[0])

static char g_dir[64];              /* temporary adapter directory, or "" */
static char g_cfg_path[96], g_st_path[96];
static fmt_model *g_base[N_BASES];  /* opened on first use; NULL if absent */
static int g_tried[N_BASES];
static fmt_model *g_env_base;       /* MC_FUZZ_BASE */
static int g_env_tried;

static void cleanup(void)
{
    for (size_t i = 0; i < N_BASES; i++)
        fmt_model_close(g_base[i]);
    fmt_model_close(g_env_base);
    if (g_dir[0]) {
        unlink(g_cfg_path);
        unlink(g_st_path);
        rmdir(g_dir);
    }
}

/* Make the temporary directory once; 0 if it cannot be made. */
static int setup(void)
{
    if (g_dir[0])
        return 1;
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !tmp[0] || strlen(tmp) > 24)
        tmp = "/tmp";
    char dir[sizeof g_dir];
    snprintf(dir, sizeof dir, "%s/mc_fuzz_adapter.XXXXXX", tmp);
    if (!mkdtemp(dir))
        return 0;
    memcpy(g_dir, dir, sizeof g_dir);
    snprintf(g_cfg_path, sizeof g_cfg_path, "%s/adapter_config.json", g_dir);
    snprintf(g_st_path, sizeof g_st_path, "%s/adapter_model.safetensors",
             g_dir);
    atexit(cleanup);
    return 1;
}

static int write_file(const char *path, const uint8_t *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return 0;
    int ok = fwrite(p, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static fmt_model *open_or_null(const char *dir)
{
    fmt_model *m = NULL;
    mc_error e;
    return fmt_model_open(dir, &m, &e) == MC_OK ? m : NULL;
}

/* The base for an adapter whose config names base_model (borrowed). */
static const fmt_model *pick_base(const char *base_model)
{
    const char *env = getenv("MC_FUZZ_BASE");
    if (env && env[0]) {
        if (!g_env_tried) {
            g_env_tried = 1;
            g_env_base = open_or_null(env);
        }
        return g_env_base;
    }
#ifdef MC_FIXTURE_DIR
    size_t k = 0; /* llama unless the config names another fixture */
    for (size_t i = 0; i < N_BASES; i++)
        if (strcmp(base_model, k_bases[i]) == 0)
            k = i;
    if (!g_tried[k]) {
        char dir[4096];
        g_tried[k] = 1;
        snprintf(dir, sizeof dir, "%s/%s", MC_FIXTURE_DIR, k_bases[k]);
        g_base[k] = open_or_null(dir);
    }
    return g_base[k];
#else
    (void)base_model;
    return NULL;
#endif
}

/* What fmt_peft.h promises of an opened adapter; abort() if broken. */
static void check_adapter(const fmt_peft_adapter *a)
{
    const fmt_peft_config *c = fmt_peft_get_config(a);
    size_t n = fmt_peft_module_count(a);
    if (!c || !fmt_peft_dir(a) || strcmp(fmt_peft_dir(a), g_dir) != 0)
        abort();
    for (size_t i = 0; i < n; i++) {
        const fmt_peft_module *m = fmt_peft_module_at(a, i);
        if (!m || !m->A || !m->B || fmt_peft_find_module(a, m->name) != m)
            abort();
        if (i > 0 && strcmp(fmt_peft_module_at(a, i - 1)->name, m->name) >= 0)
            abort(); /* sorted, no duplicates */
        if (m->A->ndim != 2 || m->B->ndim != 2 || m->r == 0 ||
            m->A->shape[0] != m->r || m->B->shape[1] != m->r)
            abort(); /* A rows == B cols == r */
        if (!(m->alpha > 0) || !(m->scaling > 0))
            abort();
        if (m->magnitude && (!c->use_dora || m->magnitude->ndim != 1 ||
                             m->magnitude->shape[0] != m->B->shape[0]))
            abort();
        if (m->b_bias && (!c->lora_bias || m->b_bias->ndim != 1 ||
                          m->b_bias->shape[0] != m->B->shape[0]))
            abort();
    }
    if (fmt_peft_module_at(a, n) != NULL)
        abort();
    for (size_t i = 0; i < fmt_peft_replace_count(a); i++) {
        const fmt_peft_replace *r = fmt_peft_replace_at(a, i);
        if (!r || !r->tensor || !r->t)
            abort();
        if (i > 0 &&
            strcmp(fmt_peft_replace_at(a, i - 1)->tensor, r->tensor) >= 0)
            abort();
    }
}

/* Element count of a shape, or UINT64_MAX past MAX_MERGE_ELEMS. */
static uint64_t elems(int ndim, const uint64_t *shape)
{
    uint64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] != 0 && n > MAX_MERGE_ELEMS / shape[d])
            return UINT64_MAX;
        n *= shape[d];
    }
    return n;
}

/* Merge the adapter in g_dir into base and compute every touched tensor. */
static void merge(const fmt_model *base)
{
    cmp_adapter_spec spec = {g_dir, 1.0};
    cmp_merge *m = NULL;
    mc_error e;
    if (cmp_merge_open(base, &spec, 1, &m, &e) != MC_OK) {
        if (m || e.message[0] == '\0')
            abort(); /* a failure must say why and hand nothing out */
        return;
    }
    size_t n = cmp_merge_tensor_count(m);
    if (n < fmt_model_tensor_count(base))
        abort(); /* the merged model has every base tensor */
    for (size_t i = 0; i < n; i++) {
        const char *name = cmp_merge_tensor_name(m, i);
        fmt_dtype dt;
        int ndim = 0, touched = 0;
        uint64_t shape[FMT_ST_MAX_DIMS];
        if (!name || !cmp_merge_tensor_info(m, name, &dt, &ndim, shape,
                                            &touched))
            abort(); /* every listed tensor answers info */
        if (!touched || ndim < 0 || ndim > FMT_ST_MAX_DIMS)
            continue;
        uint64_t k = elems(ndim, shape);
        if (k > MAX_MERGE_ELEMS)
            continue;
        float *out = malloc(k ? (size_t)k * sizeof *out : 1);
        if (!out)
            continue;
        /* Open has matched every shape, so computing may only run out of
         * memory or overflow float32 (a zero DoRA norm, huge adapters);
         * a success is finite (the base's values are). */
        mc_status st = cmp_merge_tensor_f32(m, name, out, &e);
        if (st != MC_OK && st != MC_ERR_NOMEM && st != MC_ERR_NONFINITE)
            abort();
        if (st != MC_OK && e.message[0] == '\0')
            abort();
        for (uint64_t j = 0; st == MC_OK && j < k; j++)
            if (!isfinite(out[j]))
                abort();
        free(out);
    }
    cmp_merge_close(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4 || !setup())
        return 0;
    uint32_t n = (uint32_t)data[0] | (uint32_t)data[1] << 8 |
                 (uint32_t)data[2] << 16 | (uint32_t)data[3] << 24;
    if (n > size - 4)
        return 0;
    if (!write_file(g_cfg_path, data + 4, n) ||
        !write_file(g_st_path, data + 4 + n, size - 4 - n))
        return 0;

    fmt_peft_adapter *a = NULL;
    mc_error e;
    if (fmt_peft_open(g_dir, &a, &e) != MC_OK) {
        if (a || e.message[0] == '\0')
            abort();
        return 0;
    }
    check_adapter(a);
    const fmt_model *base = pick_base(fmt_peft_get_config(a)->base_model);
    /* cmp_merge_open opens the directory again; ours is not needed. */
    fmt_peft_close(a);
    if (base)
        merge(base);
    return 0;
}
