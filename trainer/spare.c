/*
 * spare.c: cddp-train as a warm spare; see spare.h and docs/distributed.md,
 * "Warm spares".
 */
#include "trainer/spare.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"     /* cddp_mono_ns */
#include "common/exitcodes.h" /* CDDP_EXIT_USAGE */
#include "common/log.h"       /* log_info, cddp_log_set_tag */
#include "common/strutil.h"   /* cddp_parse_long */
#include "trainer/cma.h"      /* trn_cma_prepare */
#include "trainer/fatal.h"    /* trn_refuse, trn_malloc */
#include "trainer/resnet.h"   /* trn_resnet_forward, trn_resnet_backward */
#include "trainer/run.h"      /* struct run */

enum {
    SPARE_MAX_MSG = 256 * 1024, /* more than the agent sends (192 KiB) */
    SPARE_MAX_FDS = 16,
    SPARE_HIGH_FD = 64, /* received fds wait here before they are placed */
};

static uint64_t spare_t0;

bool trn_spare_begin(struct run *r)
{
    const char *v = getenv("CDDP_SPARE");
    if (v == NULL || strcmp(v, "1") != 0)
        return false;
    spare_t0 = cddp_mono_ns();
    cddp_log_set_tag("spare");
    long world = 1;
    const char *w = getenv("WORLD_SIZE");
    if (w == NULL || cddp_parse_long(w, 1, 1 << 24, &world) != 0)
        trn_refuse(CDDP_EXIT_USAGE, "CDDP_SPARE=1: WORLD_SIZE='%s' is not a world size",
                   w ? w : "");
    r->world = (int)world;
    r->in_place = true;
    r->generation = 1; /* a replacement: no initialisation (the weights come from a peer) */
    return true;
}

void trn_spare_warm_up(struct run *r)
{
    if (r->be.device != TRN_DEVICE_CPU)
        return;
    uint64_t t0 = cddp_mono_ns();
    int n = (int)r->cfg.batch_size;
    float *x = trn_calloc((size_t)n * 3 * (size_t)r->height * (size_t)r->width, sizeof(float));
    int32_t *labels = trn_calloc((size_t)n, sizeof(int32_t));
    trn_resnet_forward(&r->model, x, labels, n, r->height, r->width, true);
    trn_resnet_backward(&r->model, 1.0f, false);
    /* The pages the state transfer writes, faulted in now rather than
     * while the group waits for it (the parameters and momentum are read
     * from a peer's memory or arrive point to point: inplace.c, give;
     * cma.h, trn_cma_prepare). */
    trn_cma_prepare(r->model.params, r->model.num_params * sizeof(float));
    trn_cma_prepare(r->model.momentum, r->model.num_params * sizeof(float));
    free(labels);
    free(x);
    log_debug("T6222", "spare: warmed up (one forward and backward of %d images) in %.3f s", n,
              (double)(cddp_mono_ns() - t0) * 1e-9);
}

/* "1,2,3": where each received fd goes. The count, or -1. */
static int parse_targets(const char *s, int *where, int max)
{
    int n = 0;
    while (*s) {
        char *end;
        long t = strtol(s, &end, 10);
        if (end == s || t < 0 || t >= SPARE_HIGH_FD || n == max)
            return -1;
        where[n++] = (int)t;
        s = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end != '\0')
            return -1;
    }
    return n;
}

/* The environment becomes the message's entries (NUL-separated "K=V"),
 * but CDDP_SPARE_FDS, which says where the fds go. The count of targets,
 * or -1 for a malformed message. */
static int take_environment(char *msg, size_t len, int *where, int max)
{
    int ntargets = 0;
    if (len == 0 || msg[len - 1] != '\0')
        return -1;
    clearenv();
    for (size_t i = 0; i < len;) {
        char *e = msg + i;
        i += strlen(e) + 1;
        if (strncmp(e, "CDDP_SPARE_FDS=", 15) == 0) {
            ntargets = parse_targets(e + 15, where, max);
            if (ntargets < 0)
                return -1;
        } else if (strchr(e, '=') != NULL) {
            putenv(e); /* (msg stays allocated for the process' life) */
        }
    }
    return ntargets;
}

void trn_spare_wait(struct run *r)
{
    (void)r;
    long fd = -1;
    const char *v = getenv("CDDP_SPARE_FD");
    if (v == NULL || cddp_parse_long(v, 0, 1 << 20, &fd) != 0 || fcntl((int)fd, F_GETFD) == -1)
        trn_refuse(CDDP_EXIT_USAGE, "CDDP_SPARE=1: CDDP_SPARE_FD='%s' is not an open fd",
                   v ? v : "");
    log_info("T6220", "spare: ready after %.3f s, waiting for a rank to take over",
             (double)(cddp_mono_ns() - spare_t0) * 1e-9);
    char *msg = trn_malloc(SPARE_MAX_MSG);
    union {
        char buf[CMSG_SPACE(sizeof(int) * SPARE_MAX_FDS)];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = msg, .iov_len = SPARE_MAX_MSG};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof(ctl)};
    ssize_t n;
    do
        n = recvmsg((int)fd, &mh, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n == 0)
        exit(0); /* the agent let it go unused */
    if (n < 0)
        trn_refuse(CDDP_EXIT_FAILURE, "spare: reading the assignment: %s", strerror(errno));
    int fds[SPARE_MAX_FDS], nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int j = 0; j < k && nfds < SPARE_MAX_FDS; j++)
            memcpy(&fds[nfds++], CMSG_DATA(c) + (size_t)j * sizeof(int), sizeof(int));
    }
    int where[SPARE_MAX_FDS];
    int ntargets = take_environment(msg, (size_t)n, where, SPARE_MAX_FDS);
    if (ntargets < 0 || ntargets != nfds || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)))
        trn_refuse(CDDP_EXIT_USAGE, "spare: a malformed assignment (%zd bytes, %d fds)", n, nfds);
    /* Every fd out of the way first, so placing one cannot close another. */
    fflush(stdout);
    fflush(stderr);
    for (int k = 0; k < nfds; k++) {
        int high = fcntl(fds[k], F_DUPFD_CLOEXEC, SPARE_HIGH_FD);
        close(fds[k]);
        fds[k] = high;
    }
    bool sock_kept = false;
    for (int k = 0; k < nfds; k++) {
        if (fds[k] < 0 || dup2(fds[k], where[k]) < 0)
            trn_refuse(CDDP_EXIT_FAILURE, "spare: placing fd %d: %s", where[k], strerror(errno));
        sock_kept = sock_kept || where[k] == (int)fd;
        close(fds[k]);
    }
    if (!sock_kept)
        close((int)fd);
    unsetenv("CDDP_SPARE");
    unsetenv("CDDP_SPARE_FD");
    const char *rank = getenv("RANK");
    log_info("T6221", "spare: taking over rank %s (local rank %s, generation %s) after %.3f s",
             rank ? rank : "?", getenv("LOCAL_RANK") ? getenv("LOCAL_RANK") : "?",
             getenv("CDDP_GENERATION") ? getenv("CDDP_GENERATION") : "?",
             (double)(cddp_mono_ns() - spare_t0) * 1e-9);
}

void trn_spare_check(const struct run *r)
{
    if (!r->in_place || r->generation < 1)
        trn_refuse(CDDP_EXIT_USAGE,
                   "spare: the assignment is not a replacement re-forming in place "
                   "(CDDP_RESTART_SCOPE=worker, CDDP_GENERATION >= 1, WORLD_SIZE > 1)");
}
