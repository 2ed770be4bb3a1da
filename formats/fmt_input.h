/*
 * fmt_input.h - opening what the user gave us, and never destroying it.
 *
 * Inputs.  Every file the tools read (model shards, config.json, the
 * shard index, adapters, artifacts, tokenizer.json, --tokens-file,
 * --prompts-file, --calib, ...) is opened by fmt_input_open: O_NONBLOCK, so
 * that opening a FIFO or a device cannot block; fstat; a regular file is
 * required; then O_NONBLOCK is cleared for ordinary reads.  A FIFO given as
 * a model therefore fails at once ("is a FIFO, not a regular file") instead
 * of waiting forever for a writer.
 *
 * Once a program has called fmt_input_begin_run (mcompile and mrun do, in
 * main), every input opened this way is remembered by device and inode in
 * a process-wide table (the "inputs of this run"), and the output guard
 * below compares against it, so a symlink or a second name of an input is
 * recognised as that input.  What a "run" is, only the program knows: a
 * library user (a test, a server) starts one when it means to.
 *
 * Outputs.  fmt_atomic_create and fmt_atomic_dir_create call the guard
 * before they create anything, so every writer of both programs goes
 * through it.  An existing path may be replaced only when
 *   - file output: it is a regular file (not a symbolic link: renaming
 *     over a link replaces the link, not what it points to) that is not
 *     an input of this run, and for the outputs with a recognisable form
 *     (fmt_output_check_ours: GGUF exports, plan pictures, metrics) one
 *     that mcompile wrote; "-" is refused (it means standard output
 *     elsewhere);
 *   - directory output: it is a directory this tool wrote (it holds the
 *     marker file FMT_OUTPUT_MARKER, which fmt_atomic_dir_create writes
 *     into every directory it builds, listing the entries at commit) and
 *     holds nothing the marker does not list, or an empty one, and no
 *     input of this run lies in it (entries compared by device+inode, 4
 *     levels).
 * Devices, FIFOs and sockets are never replaced.  A refusal is
 * MC_ERR_INVALID_ARG naming the path; nothing has been touched.
 *
 * Thread safety: the table has a lock; all functions may be called from
 * any thread.
 */
#ifndef FMT_INPUT_H
#define FMT_INPUT_H

#include <stdio.h>
#include <sys/stat.h>

#include "mc_error.h"

/* Marker file inside every directory output: "mcompile wrote this", then
 * a line FMT_OUTPUT_MARKER_LIST and the names of the entries it wrote,
 * one per line (at most FMT_OUTPUT_MARKER_MAX bytes in all): an entry
 * the list lacks is the user's, and the directory is not replaced. */
#define FMT_OUTPUT_MARKER ".mcompile-output"
#define FMT_OUTPUT_MARKER_LIST "files:"
#define FMT_OUTPUT_MARKER_MAX 65536

/* Open path read-only as described above.  On MC_OK *fd is open (the
 * caller closes it) and *st (if not NULL) holds its fstat.  Errors name
 * path: MC_ERR_NOT_FOUND, MC_ERR_IO (cannot open; not a regular file, with
 * its kind: directory, FIFO, socket, device). */
mc_status fmt_input_open(const char *path, int *fd, struct stat *st,
                         mc_error *err);
/* The same, as a stdio stream opened "rb" (the caller fcloses it). */
mc_status fmt_input_fopen(const char *path, FILE **fp, mc_error *err);

/* Start a run: forget earlier inputs and remember every input opened
 * from now on. */
void fmt_input_begin_run(void);
/* Remember a file as an input of this run (the opens above do it); a no-op
 * before fmt_input_begin_run. */
void fmt_input_note(const struct stat *st);
/* 1 if the device+inode of st belongs to an input of this run. */
int fmt_input_is_input(const struct stat *st);

/* The output guard (see above).  MC_OK when path does not exist or may be
 * replaced. */
mc_status fmt_output_check_file(const char *path, mc_error *err);
mc_status fmt_output_check_dir(const char *path, mc_error *err);
/* fmt_output_check_file, and an existing non-empty file is replaced only
 * if it is one of ours: its first window bytes (at most 64 KiB) start
 * with head and hold mark (either NULL: not checked).  what ("a GGUF
 * file mcompile wrote") completes the refusal's message. */
mc_status fmt_output_check_ours(const char *path, const char *what,
                                const char *head, const char *mark,
                                size_t window, mc_error *err);
/* Whether a marker's text[0..len) lists name: 1 listed, 0 not (the marker
 * has a list), -1 the marker has no list (written before lists: it
 * allows every entry).  Pure: the fuzz target's entry (fuzz_marker.c). */
int fmt_output_marker_lists(const char *text, size_t len, const char *name);
/* 1 if paths a and b name the same file, existing or not (two outputs of
 * one run: another spelling, a link, a hard link). */
int fmt_output_same(const char *a, const char *b);

/* "a FIFO", "a directory", ... for messages about st's file type. */
const char *fmt_input_kind(const struct stat *st);

#endif /* FMT_INPUT_H */
