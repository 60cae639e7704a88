/* Unit tests for common/sock.c: connecting with retries, whole sends and
 * receives with deadlines, over real loopback sockets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/errors.h"
#include "common/sock.h"

/* A listening socket on 127.0.0.1 and a free port. */
static int listen_lo(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(fd, 4), 0);
    socklen_t len = sizeof(a);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

static void test_connect_send_recv(void **state)
{
    (void)state;
    int port, lfd = listen_lo(&port);
    int fd = -1;
    char err[256] = "";
    assert_int_equal(
        cddp_tcp_connect("127.0.0.1", port, cddp_mono_ms() + 2000, &fd, err, sizeof(err)), 0);
    int sfd = accept(lfd, NULL, NULL);
    assert_true(sfd >= 0);
    /* 4 MiB: more than the socket buffers hold, so send waits for the reader. */
    size_t n = 4u << 20;
    char *out = malloc(n), *in = malloc(n);
    assert_non_null(out);
    assert_non_null(in);
    for (size_t i = 0; i < n; i++)
        out[i] = (char)(i * 7 + 3);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int rc = cddp_send_all(fd, out, n, cddp_mono_ms() + 10000);
        _exit(rc == 0 ? 0 : 1);
    }
    close(fd);
    fcntl(sfd, F_SETFL, O_NONBLOCK);
    assert_int_equal(cddp_recv_all(sfd, in, n, cddp_mono_ms() + 10000), 0);
    assert_memory_equal(in, out, n);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* The writer is gone: a reset. */
    char c;
    assert_int_equal(cddp_recv_all(sfd, &c, 1, cddp_mono_ms() + 50),
                     CDDP_ERR_FROM_ERRNO(ECONNRESET));
    free(out);
    free(in);
    close(sfd);
    close(lfd);
}

static void test_recv_deadline(void **state)
{
    (void)state;
    int port, lfd = listen_lo(&port);
    int fd = -1;
    char err[256];
    assert_int_equal(
        cddp_tcp_connect_once("127.0.0.1", port, cddp_mono_ms() + 2000, &fd, err, sizeof(err)), 0);
    int sfd = accept(lfd, NULL, NULL);
    assert_true(sfd >= 0);
    char buf[8];
    uint64_t t0 = cddp_mono_ms();
    assert_int_equal(cddp_recv_all(fd, buf, sizeof(buf), t0 + 100), CDDP_ETIMEOUT);
    assert_true(cddp_mono_ms() - t0 >= 100);
    /* Part of it, then the deadline: still a timeout. */
    assert_int_equal(write(sfd, "abc", 3), 3);
    assert_int_equal(cddp_recv_all(fd, buf, sizeof(buf), cddp_mono_ms() + 100), CDDP_ETIMEOUT);
    assert_int_equal(cddp_wait_fd(fd, POLLOUT, cddp_mono_ms() + 100), 0);
    close(fd);
    close(sfd);
    close(lfd);
}

static void test_connect_refused(void **state)
{
    (void)state;
    int port, lfd = listen_lo(&port);
    close(lfd); /* nothing listens there now */
    int fd = -1;
    char err[256] = "";
    uint64_t t0 = cddp_mono_ms();
    int rc = cddp_tcp_connect("127.0.0.1", port, t0 + 300, &fd, err, sizeof(err));
    assert_int_equal(rc, CDDP_ERR_FROM_ERRNO(ECONNREFUSED));
    assert_true(cddp_mono_ms() - t0 >= 300); /* retried until the deadline */
    assert_non_null(strstr(err, "cannot connect to 127.0.0.1 port"));
    assert_non_null(strstr(err, "(kept trying for"));
    assert_int_equal(fd, -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_connect_send_recv),
        cmocka_unit_test(test_recv_deadline),
        cmocka_unit_test(test_connect_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
