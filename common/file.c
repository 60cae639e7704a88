/* file.c: see file.h. */
#include "common/file.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/strutil.h"

#define PATH_LEN 4096

int cddp_write_all(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n > 0) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : n;
        ssize_t w = write(fd, p, chunk);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return CDDP_ERR_FROM_ERRNO(errno);
        if (w == 0)
            return CDDP_ERR_FROM_ERRNO(EIO);
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int cddp_fsync_dir_of(const char *path)
{
    char dir[PATH_LEN];
    const char *slash = strrchr(path, '/');
    if (slash == NULL) {
        cddp_strlcpy(dir, ".", sizeof(dir));
    } else if (slash == path) {
        cddp_strlcpy(dir, "/", sizeof(dir));
    } else {
        size_t n = (size_t)(slash - path);
        if (n >= sizeof(dir))
            return CDDP_ERR_FROM_ERRNO(ENAMETOOLONG);
        memcpy(dir, path, n);
        dir[n] = '\0';
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return CDDP_ERR_FROM_ERRNO(errno);
    int rc = fsync(fd) == 0 ? 0 : CDDP_ERR_FROM_ERRNO(errno);
    close(fd);
    return rc;
}

static int failed(char *err, size_t errlen, int rc, const char *what, const char *path)
{
    return err ? cddp_fail(err, errlen, rc, "%s%s: %s", what, path, cddp_strerror(rc)) : rc;
}

int cddp_file_commit(int fd, const char *tmp, const char *path, bool *renamed, char *err,
                     size_t errlen)
{
    if (renamed != NULL)
        *renamed = false;
    if (fsync(fd) != 0)
        return failed(err, errlen, CDDP_ERR_FROM_ERRNO(errno), "fsync ", tmp);
    if (rename(tmp, path) != 0) {
        int rc = CDDP_ERR_FROM_ERRNO(errno);
        return err ? cddp_fail(err, errlen, rc, "rename %s -> %s: %s", tmp, path, cddp_strerror(rc))
                   : rc;
    }
    if (renamed != NULL)
        *renamed = true;
    int rc = cddp_fsync_dir_of(path);
    return rc ? failed(err, errlen, rc, "fsync of the directory of ", path) : 0;
}

int cddp_write_file_atomic(const char *path, const void *data, size_t len, mode_t mode, char *err,
                           size_t errlen)
{
    char tmp[PATH_LEN + 32];
    int n = snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof(tmp))
        return failed(err, errlen, CDDP_ERR_FROM_ERRNO(ENAMETOOLONG), "", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0)
        return failed(err, errlen, CDDP_ERR_FROM_ERRNO(errno), "", tmp);
    int rc = cddp_write_all(fd, data, len);
    if (rc)
        failed(err, errlen, rc, "write ", tmp);
    bool renamed = false;
    if (rc == 0)
        rc = cddp_file_commit(fd, tmp, path, &renamed, err, errlen);
    close(fd); /* after fsync, close has nothing left to report */
    if (rc && !renamed)
        unlink(tmp);
    return rc;
}
