/*
 * fmt_model.h - a Hugging Face checkpoint as a set of safetensors files.
 *
 * Opens any of: a model directory (config.json + model.safetensors, or
 * model.safetensors.index.json + shards), a single .safetensors file with
 * config.json beside it, or an index.json.  For sharded checkpoints the
 * index is validated: weight_map values are plain file names inside the
 * model directory (no '/', no "..", no absolute paths), every listed shard
 * opens and validates, every tensor in the map exists in its shard, no
 * tensor appears in two shards, and no shard holds a tensor missing from
 * the map; metadata.total_size, when present, is checked against the sum
 * of tensor bytes.  Shards are mapped lazily? No: all are opened (mapped)
 * at open, which costs address space, not memory.
 *
 * Also writes indexes: fmt_model_write_index() for sharded outputs.
 */
#ifndef FMT_MODEL_H
#define FMT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "fmt_safetensors.h"
#include "mc_error.h"

typedef struct fmt_model fmt_model;

mc_status fmt_model_open(const char *path, fmt_model **out, mc_error *err);
void fmt_model_close(fmt_model *m); /* NULL is a no-op */

/* Directory holding config.json and the shards (borrowed). */
const char *fmt_model_dir(const fmt_model *m);
/* Path of config.json (borrowed). */
const char *fmt_model_config_path(const fmt_model *m);
/* 1 if opened through model.safetensors.index.json. */
int fmt_model_is_sharded(const fmt_model *m);

size_t fmt_model_shard_count(const fmt_model *m);
/* File name of shard i (as in the index, or "model.safetensors"). */
const char *fmt_model_shard_name(const fmt_model *m, size_t i);
const fmt_st_file *fmt_model_shard(const fmt_model *m, size_t i);

/* Total number of tensors over all shards, and the i-th: shard order, then
 * data-offset order inside a shard.  *shard (if non-NULL) gets its shard. */
size_t fmt_model_tensor_count(const fmt_model *m);
const fmt_st_tensor *fmt_model_tensor(const fmt_model *m, size_t i,
                                      size_t *shard);
/* Tensor by name over all shards, or NULL. */
const fmt_st_tensor *fmt_model_find(const fmt_model *m, const char *name,
                                    size_t *shard);
/* Sum of all tensor bytes. */
uint64_t fmt_model_total_bytes(const fmt_model *m);

/* Write model.safetensors.index.json into dir: total_size and a weight_map
 * of names[i] -> shard_names[i] (n entries), keys sorted, atomically. */
mc_status fmt_model_write_index(const char *dir, uint64_t total_size,
                                const char *const *names,
                                const char *const *shard_names, size_t n,
                                mc_error *err);

/* ---- the sharded index on its own --------------------------------------
 * model.safetensors.index.json parsed from memory, without opening shards
 * (fmt_model_open uses it; so does the index fuzz target).  Checks: valid
 * UTF-8 JSON object without duplicate keys; "weight_map" an object of
 * tensor name -> shard file name, not empty; every shard name a plain file
 * name ending in ".safetensors" (no '/', '\\', NUL, not "." or ".."), so
 * it cannot escape the model directory; "metadata" (optional) an object
 * whose "total_size" (optional) is a non-negative integer (an integral
 * real below 2^53 is accepted too: some writers emit 1.4e10).  Other keys
 * are ignored.  name is used in errors; byte offsets are into text. */
typedef struct fmt_model_index fmt_model_index;

mc_status fmt_model_parse_index(const char *text, size_t len, const char *name,
                                fmt_model_index **out, mc_error *err);
void fmt_model_index_free(fmt_model_index *ix); /* NULL is a no-op */
/* 1 and *total if metadata.total_size is present, else 0. */
int fmt_model_index_total_size(const fmt_model_index *ix, uint64_t *total);
/* Distinct shard names, sorted (borrowed). */
size_t fmt_model_index_shard_count(const fmt_model_index *ix);
const char *fmt_model_index_shard_name(const fmt_model_index *ix, size_t i);
/* Tensors of weight_map sorted by name; *shard gets its shard's index in
 * the sorted shard list.  Returns NULL if i is out of range. */
size_t fmt_model_index_tensor_count(const fmt_model_index *ix);
const char *fmt_model_index_tensor(const fmt_model_index *ix, size_t i,
                                   size_t *shard);
/* 1 if name is a shard file name the index rules accept. */
int fmt_model_shard_name_ok(const char *name);

#endif /* FMT_MODEL_H */
