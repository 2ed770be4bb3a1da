/* fmt_model_index.c - model.safetensors.index.json: parse from memory
 * (structure and shard names, no shard opened) and write atomically.
 * See fmt_model.h. */
#include "fmt_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_atomic.h"
#include "fmt_json_strict.h"
#include "mc_alloc.h"
#include "mc_checked.h"

struct fmt_model_index {
    int has_total;       /* metadata.total_size present */
    uint64_t total;      /* its value (bytes) */
    char **shards;       /* distinct shard file names, sorted */
    size_t nshards;
    char **names;        /* tensor names, sorted */
    size_t *shard_of;    /* names[i] lives in shards[shard_of[i]] */
    size_t n;
};

static const char SUFFIX[] = ".safetensors";

int fmt_model_shard_name_ok(const char *name)
{
    if (!name)
        return 0;
    size_t len = strlen(name), sl = sizeof SUFFIX - 1;
    if (len <= sl || strcmp(name + len - sl, SUFFIX) != 0)
        return 0;
    /* A plain name: no separator of any platform, so no "..", no absolute
     * path; a leading '.' would also hide it and collide with our temps. */
    return name[0] != '.' && !strchr(name, '/') && !strchr(name, '\\');
}

void fmt_model_index_free(fmt_model_index *ix)
{
    if (!ix)
        return;
    for (size_t i = 0; i < ix->nshards; i++)
        mc_free(ix->shards[i]);
    for (size_t i = 0; i < ix->n; i++)
        mc_free(ix->names[i]);
    mc_free(ix->shards);
    mc_free(ix->names);
    mc_free(ix->shard_of);
    mc_free(ix);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_pair(const void *a, const void *b)
{
    /* pairs are (name, shard) laid out as two char* */
    return strcmp(((const char *const *)a)[0], ((const char *const *)b)[0]);
}

/* Offset of the value of top-level key, or of the object's '{'. */
static size_t member_offset(const char *text, size_t len, size_t obj,
                            json_t *o, const char *key)
{
    size_t n = json_object_size(o), i = 0;
    fmt_json_member *mem = mc_malloc_array(n, sizeof *mem);
    if (!mem)
        return obj;
    size_t got = fmt_json_scan_object(text, len, obj, mem, n);
    const char *k;
    json_t *v;
    size_t off = obj;
    json_object_foreach(o, k, v) {
        if (i < got && strcmp(k, key) == 0)
            off = mem[i].value;
        i++;
    }
    mc_free(mem);
    return off;
}

static mc_status parse_total(fmt_model_index *ix, const char *text, size_t len,
                             size_t top, json_t *root, const char *name,
                             mc_error *err)
{
    json_t *meta = json_object_get(root, "metadata");
    if (!meta)
        return MC_OK;
    size_t moff = member_offset(text, len, top, root, "metadata");
    if (!json_is_object(meta))
        return mc_fail(err, MC_ERR_FORMAT, name, "metadata", (int64_t)moff,
                       "metadata is not an object; expected "
                       "{\"total_size\": BYTES}");
    json_t *ts = json_object_get(meta, "total_size");
    if (!ts)
        return MC_OK;
    size_t toff = member_offset(text, len, moff, meta, "total_size");
    if (json_is_integer(ts) && json_integer_value(ts) >= 0) {
        ix->total = (uint64_t)json_integer_value(ts);
    } else if (json_is_real(ts) && json_real_value(ts) >= 0 &&
               json_real_value(ts) < 9007199254740992.0 &&
               json_real_value(ts) == (double)(uint64_t)json_real_value(ts)) {
        ix->total = (uint64_t)json_real_value(ts);
    } else {
        return mc_fail(err, MC_ERR_FORMAT, name, "total_size", (int64_t)toff,
                       "metadata.total_size must be a non-negative integer "
                       "(bytes)");
    }
    ix->has_total = 1;
    return MC_OK;
}

/* weight_map -> sorted names with shard indices. */
static mc_status parse_map(fmt_model_index *ix, const char *text, size_t len,
                           size_t moff, json_t *map, const char *name,
                           mc_error *err)
{
    size_t n = json_object_size(map);
    if (n == 0)
        return mc_fail(err, MC_ERR_FORMAT, name, "weight_map", (int64_t)moff,
                       "weight_map is empty; expected tensor -> shard entries");
    fmt_json_member *mem = mc_malloc_array(n, sizeof *mem);
    const char **pairs = mc_malloc_array(n, 2 * sizeof *pairs);
    const char **sh = mc_malloc_array(n, sizeof *sh);
    ix->names = mc_calloc(n, sizeof *ix->names);
    ix->shard_of = mc_calloc(n, sizeof *ix->shard_of);
    ix->shards = mc_calloc(n, sizeof *ix->shards);
    mc_status st = MC_OK;
    if (!mem || !pairs || !sh || !ix->names || !ix->shard_of || !ix->shards) {
        st = mc_fail(err, MC_ERR_NOMEM, name, NULL, -1, "allocating the index");
        goto out;
    }
    size_t got = fmt_json_scan_object(text, len, moff, mem, n), i = 0;
    const char *key;
    json_t *v;
    json_object_foreach(map, key, v) {
        int64_t off = (int64_t)(i < got ? mem[i].value : moff);
        if (!json_is_string(v)) {
            st = mc_fail(err, MC_ERR_FORMAT, name, key, off,
                         "weight_map value for '%s' is not a string; expected "
                         "a shard file name", key);
            goto out;
        }
        const char *s = json_string_value(v);
        if (!fmt_model_shard_name_ok(s)) {
            st = mc_fail(err, MC_ERR_FORMAT, name, key, off,
                         "shard name '%.200s' for '%s' is not a plain file "
                         "name ending in .safetensors (it must not escape "
                         "the model directory)", s, key);
            goto out;
        }
        pairs[2 * i] = key;
        pairs[2 * i + 1] = s;
        sh[i] = s;
        i++;
    }
    qsort(pairs, n, 2 * sizeof *pairs, cmp_pair);
    qsort(sh, n, sizeof *sh, cmp_str);
    for (size_t k = 0; k < n; k++) {
        if (k > 0 && strcmp(sh[k], sh[k - 1]) == 0)
            continue;
        if (!(ix->shards[ix->nshards] = mc_strdup(sh[k]))) {
            st = mc_fail(err, MC_ERR_NOMEM, name, NULL, -1, "allocating the index");
            goto out;
        }
        ix->nshards++;
    }
    for (size_t k = 0; k < n; k++) {
        if (!(ix->names[k] = mc_strdup(pairs[2 * k]))) {
            st = mc_fail(err, MC_ERR_NOMEM, name, NULL, -1, "allocating the index");
            goto out;
        }
        ix->n++;
        const char *s = pairs[2 * k + 1];
        char **hit = bsearch(&s, ix->shards, ix->nshards, sizeof *ix->shards,
                             cmp_str);
        ix->shard_of[k] = (size_t)(hit - ix->shards);
    }
out:
    mc_free(mem);
    mc_free(pairs);
    mc_free(sh);
    return st;
}

mc_status fmt_model_parse_index(const char *text, size_t len, const char *name,
                                fmt_model_index **out, mc_error *err)
{
    if (!out || (!text && len))
        return mc_fail(err, MC_ERR_INVALID_ARG, name, NULL, -1, "NULL argument");
    *out = NULL;
    json_t *root = NULL;
    mc_status st = fmt_json_load_strict(text ? text : "", len, name, 0, &root,
                                        err);
    if (st != MC_OK)
        return st;
    fmt_model_index *ix = mc_calloc(1, sizeof *ix);
    if (!ix) {
        json_decref(root);
        return mc_fail(err, MC_ERR_NOMEM, name, NULL, -1, "allocating the index");
    }
    size_t top = fmt_json_skip_ws(text, len, 0);
    json_t *map = json_object_get(root, "weight_map");
    size_t moff = map ? member_offset(text, len, top, root, "weight_map") : top;
    if (!map)
        st = mc_fail(err, MC_ERR_FORMAT, name, "weight_map", (int64_t)top,
                     "no \"weight_map\"; expected {\"metadata\": {...}, "
                     "\"weight_map\": {tensor: shard}}");
    else if (!json_is_object(map))
        st = mc_fail(err, MC_ERR_FORMAT, name, "weight_map", (int64_t)moff,
                     "weight_map is not an object; expected {tensor: shard}");
    if (st == MC_OK)
        st = parse_total(ix, text, len, top, root, name, err);
    if (st == MC_OK)
        st = parse_map(ix, text, len, moff, map, name, err);
    json_decref(root);
    if (st != MC_OK) {
        fmt_model_index_free(ix);
        return st;
    }
    *out = ix;
    return MC_OK;
}

int fmt_model_index_total_size(const fmt_model_index *ix, uint64_t *total)
{
    if (!ix || !ix->has_total)
        return 0;
    if (total)
        *total = ix->total;
    return 1;
}

size_t fmt_model_index_shard_count(const fmt_model_index *ix)
{
    return ix ? ix->nshards : 0;
}

const char *fmt_model_index_shard_name(const fmt_model_index *ix, size_t i)
{
    return ix && i < ix->nshards ? ix->shards[i] : NULL;
}

size_t fmt_model_index_tensor_count(const fmt_model_index *ix)
{
    return ix ? ix->n : 0;
}

const char *fmt_model_index_tensor(const fmt_model_index *ix, size_t i,
                                   size_t *shard)
{
    if (!ix || i >= ix->n)
        return NULL;
    if (shard)
        *shard = ix->shard_of[i];
    return ix->names[i];
}

/* ---- writing ------------------------------------------------------------ */

static int cmp_idx(const void *a, const void *b, void *ctx)
{
    const char *const *names = ctx;
    return strcmp(names[*(const size_t *)a], names[*(const size_t *)b]);
}

static mc_status check_write_args(const char *path, const char *const *names,
                                  const char *const *shard_names, size_t n,
                                  mc_error *err)
{
    if (n == 0 || !names || !shard_names)
        return mc_fail(err, MC_ERR_INVALID_ARG, path, NULL, -1,
                       "an index needs at least one tensor");
    for (size_t i = 0; i < n; i++) {
        if (!names[i] || !names[i][0] ||
            !fmt_utf8_valid((const unsigned char *)names[i], strlen(names[i]), NULL))
            return mc_fail(err, MC_ERR_INVALID_ARG, path, NULL, -1,
                           "tensor name %zu is empty or not UTF-8", i);
        if (!fmt_model_shard_name_ok(shard_names[i]) ||
            !fmt_utf8_valid((const unsigned char *)shard_names[i],
                            strlen(shard_names[i]), NULL))
            return mc_fail(err, MC_ERR_INVALID_ARG, path, names[i], -1,
                           "shard name '%s' is not a plain .safetensors file "
                           "name", shard_names[i] ? shard_names[i] : "(null)");
    }
    size_t *ord = mc_malloc_array(n, sizeof *ord);
    if (!ord)
        return mc_fail(err, MC_ERR_NOMEM, path, NULL, -1, "allocating the index");
    for (size_t i = 0; i < n; i++)
        ord[i] = i;
    qsort_r(ord, n, sizeof *ord, cmp_idx, (void *)names);
    mc_status st = MC_OK;
    for (size_t i = 1; i < n && st == MC_OK; i++)
        if (strcmp(names[ord[i]], names[ord[i - 1]]) == 0)
            st = mc_fail(err, MC_ERR_INVALID_ARG, path, names[ord[i]], -1,
                         "tensor '%s' listed twice", names[ord[i]]);
    mc_free(ord);
    return st;
}

mc_status fmt_model_write_index(const char *dir, uint64_t total_size,
                                const char *const *names,
                                const char *const *shard_names, size_t n,
                                mc_error *err)
{
    if (!dir)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, NULL, -1, "NULL directory");
    size_t plen = strlen(dir) + sizeof "/model.safetensors.index.json";
    char *path = mc_malloc(plen);
    if (!path)
        return mc_fail(err, MC_ERR_NOMEM, dir, NULL, -1, "allocating a path");
    snprintf(path, plen, "%s/model.safetensors.index.json", dir);
    mc_status st = check_write_args(path, names, shard_names, n, err);
    if (st == MC_OK && total_size > (uint64_t)INT64_MAX)
        st = mc_fail(err, MC_ERR_OVERFLOW, path, "total_size", -1,
                     "total_size %llu does not fit a JSON integer",
                     (unsigned long long)total_size);
    mc_alloc_install_jansson();
    json_t *root = NULL, *map = NULL, *meta = NULL;
    if (st == MC_OK) {
        root = json_object();
        map = json_object();
        meta = json_object();
        int bad = !root || !map || !meta ||
                  json_object_set_new(meta, "total_size",
                                      json_integer((json_int_t)total_size));
        for (size_t i = 0; i < n && !bad; i++)
            bad = json_object_set_new(map, names[i], json_string(shard_names[i]));
        if (!bad) {
            bad = json_object_set(root, "metadata", meta) ||
                  json_object_set(root, "weight_map", map);
        }
        if (bad)
            st = mc_fail(err, MC_ERR_NOMEM, path, NULL, -1, "building the index");
    }
    char *text = NULL;
    size_t tlen = 0;
    if (st == MC_OK) {
        /* Sorted keys and fixed indent: same inputs, same bytes. */
        size_t flags = JSON_SORT_KEYS | JSON_INDENT(2);
        tlen = json_dumpb(root, NULL, 0, flags);
        text = tlen ? mc_malloc(tlen + 1) : NULL;
        if (!text || json_dumpb(root, text, tlen, flags) != tlen)
            st = mc_fail(err, MC_ERR_NOMEM, path, NULL, -1, "printing the index");
        else
            text[tlen++] = '\n';
    }
    json_decref(meta);
    json_decref(map);
    json_decref(root);
    fmt_atomic_file *f = NULL;
    if (st == MC_OK)
        st = fmt_atomic_create(path, &f, err);
    if (st == MC_OK)
        st = fmt_atomic_write(f, text, tlen, err);
    if (st == MC_OK) {
        st = fmt_atomic_commit(f, err);
        f = NULL;
    }
    fmt_atomic_abort(f);
    mc_free(text);
    mc_free(path);
    return st;
}
