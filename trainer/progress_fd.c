/* progress_fd.c: the progress line per step to cddprun; see progress_fd.h. */
#include "trainer/progress_fd.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/strutil.h" /* cddp_parse_long, cddp_buf */
#include "proto/progress.h" /* progress_format_line */

void trn_progress_fd_open(struct trn_progress_fd *p)
{
    const char *v = getenv("CDDP_PROGRESS_FD");
    long fd;
    p->fd = -1;
    if (v && cddp_parse_long(v, 0, 1 << 20, &fd) == 0 && fcntl((int)fd, F_GETFD) != -1) {
        p->fd = (int)fd;
        fcntl(p->fd, F_SETFL, fcntl(p->fd, F_GETFL) | O_NONBLOCK);
    }
}

/* (any line fits in 256 bytes) */
void trn_progress_fd_report(struct trn_progress_fd *p, const struct progress_line *l)
{
    if (p->fd < 0)
        return;
    struct cddp_buf line;
    cddp_buf_init(&line, 256);
    if (progress_format_line(&line, l) == 0 && write(p->fd, line.data, line.len) < 0 &&
        errno != EAGAIN && errno != EINTR)
        p->fd = -1; /* the agent went away: stop reporting */
    cddp_buf_free(&line);
}

int trn_progress_fd_blame(struct trn_progress_fd *p, const int *ranks, int n, long gen)
{
    char lines[PROGRESS_BLAMES_KEPT * 64];
    if (p->fd < 0 || n <= 0 || n > PROGRESS_BLAMES_KEPT)
        return -1;
    size_t at = 0;
    for (int i = 0; i < n; i++)
        at += (size_t)snprintf(lines + at, sizeof(lines) - at, "{\"blame\":%d,\"blame_gen\":%ld}\n",
                               ranks[i], gen);
    return write(p->fd, lines, at) == (ssize_t)at ? 0 : -1;
}
