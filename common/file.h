/*
 * file.h: writing files whole, and replacing them atomically.
 *
 * cddp_write_all() writes every byte (retrying short writes and EINTR).
 *
 * cddp_write_file_atomic() replaces path with data so that a reader, or
 * the machine after a crash, sees the old file or the new one, never a
 * part: it writes a temporary file in the same directory (path.tmp.<pid>,
 * so the rename stays on one filesystem and two processes never share
 * one), fsyncs it, renames it over path and fsyncs the directory, so the
 * rename itself is durable. On failure the temporary file is removed and
 * path is as it was (a failed directory fsync is reported although the
 * new file is in place). Torchrun's error files and the trainer's
 * checkpoints go through here.
 *
 * cddp_file_commit() is the second half alone, for a writer that makes its
 * own temporary file (trainer/safetensors.c writes under a lock it holds
 * until the rename): fsync fd, rename tmp to path, fsync the directory.
 * It neither closes fd nor removes tmp.
 *
 * Every function returns 0 or a negative code (-errno; -ENAMETOOLONG for a
 * path past 4096 bytes); where an err buffer is taken it gets one line naming the
 * step and the file that failed. No allocation; thread-safe as the system
 * calls are.
 */
#ifndef CDDP_COMMON_FILE_H
#define CDDP_COMMON_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

int cddp_write_all(int fd, const void *buf, size_t n);

/* Creates path with mode (before the umask) or replaces it. */
int cddp_write_file_atomic(const char *path, const void *data, size_t len, mode_t mode, char *err,
                           size_t errlen);

/* *renamed (may be NULL) says whether the rename was done: then only the
 * directory's fsync failed, and tmp is no longer there to remove. */
int cddp_file_commit(int fd, const char *tmp, const char *path, bool *renamed, char *err,
                     size_t errlen);

/* fsync of the directory that holds path ("." when path has no slash). */
int cddp_fsync_dir_of(const char *path);

#endif
