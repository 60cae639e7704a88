/*
 * unit_util.h: small helpers the cmocka tests share (include after
 * <cmocka.h>). Header-only: each test is its own executable.
 */
#ifndef CDDP_TESTS_UNIT_UTIL_H
#define CDDP_TESTS_UNIT_UTIL_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

/* The first 64 KiB of a file, NUL-terminated, in a static buffer (the next
 * call overwrites it); NULL when it cannot be opened. */
static inline char *unit_slurp(const char *path)
{
    static char buf[1 << 16];
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

/* A loopback TCP port that was free a moment ago (bind 0, close). */
static inline int unit_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sin);
    assert_int_equal(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sin, &len), 0);
    close(fd);
    return ntohs(sin.sin_port);
}

#endif
