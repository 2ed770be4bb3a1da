/*
 * rt_artifact.h - loading an mcompile artifact (formats/fmt_artifact.h)
 * into the runtime's rt_model (rt_model.h).
 *
 * The artifact is mapped read-only; every kn_matrix is a view into its
 * section (raw sections) or into ONE owned buffer that all zstd sections
 * are stream-decompressed into, once, at load (sized from the manifest).
 * Norms and biases are copied into model->owned as float32 (rt_model's
 * invariant).  The stored plan comes back as model->plan, read and
 * checked by rt_plan_from_json (rt_plan.h): the layout is rebuilt from the stored limits and must equal the stored
 * buffers (offset and size of every buffer, arena size) and totals, so a
 * session on the artifact places its KV cache and activations exactly
 * where the compiler planned them.
 *
 * Checks: header, trailer, table and manifest checksums and the manifest
 * schema on every open (fmt_art_open); every section checksum before use
 * unless RT_ART_NO_VERIFY (XXH3 runs at memory speed, so the default is to
 * verify); each tensor's format, shape and part sizes against kn_quant.h.
 * Errors name the artifact, the tensor and the byte offset.
 */
#ifndef RT_ARTIFACT_H
#define RT_ARTIFACT_H

#include <stddef.h>
#include <stdint.h>

#include "mc_error.h"
#include "rt_model.h"

#define RT_ART_NO_VERIFY 1u  /* skip the section checksums (cheap checks only) */
#define RT_ART_ROWS 2u       /* keep every matrix in the row layout: for a
                              * caller of the float path (kn_matmul, e.g.
                              * `mcompile eval`), whose SIMD kernels read
                              * rows only; panels would take the scalar
                              * reference there, ~10x slower */

/* Open path as an artifact (verifying every section).  *out owned by the
 * caller (rt_model_free). */
mc_status rt_model_open_artifact(const char *path, rt_model **out,
                                 mc_error *err);
mc_status rt_model_open_artifact_ex(const char *path, unsigned flags,
                                    rt_model **out, mc_error *err);

/* 1 if path starts with the artifact magic. */
int rt_artifact_is(const char *path);

/* The tokenizer.json text embedded in the artifact m was loaded from
 * (borrowed; not NUL-terminated), or NULL when m is not an artifact or has
 * no tokenizer. */
const char *rt_artifact_tokenizer(const rt_model *m, size_t *len);

#endif /* RT_ARTIFACT_H */
