/* wire.c: see wire.h. */
#include "rendezvous/wire.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "proto/frame.h"

struct wreq {
    uv_write_t req;
    uv_buf_t buf;
    char *data;
};

static void on_written(uv_write_t *req, int status)
{
    (void)status; /* a failed write surfaces as a read error/EOF on the same stream */
    struct wreq *w = (struct wreq *)req;
    free(w->data);
    free(w);
}

int rdzv_wire_write_buf(uv_stream_t *stream, struct cddp_buf *b)
{
    if (b->len == 0)
        return 0;
    /* Try the socket first: usually it takes everything, and then there is
     * no request to allocate and no poll watcher to change (a syscall each
     * with 10,000 peers). Whatever is left goes through uv_write. */
    uv_buf_t buf = uv_buf_init(b->data, (unsigned int)b->len);
    int n = uv_try_write(stream, &buf, 1);
    if (n == (int)b->len) {
        cddp_buf_reset(b);
        return 0;
    }
    if (n < 0 && n != UV_EAGAIN)
        return n;
    if (n < 0)
        n = 0;
    struct wreq *w = malloc(sizeof(*w));
    if (w == NULL)
        return UV_ENOMEM;
    w->data = b->data;
    w->buf = uv_buf_init(b->data + n, (unsigned int)(b->len - (size_t)n));
    int rc = uv_write(&w->req, stream, &w->buf, 1, on_written);
    if (rc) {
        free(w);
        return rc;
    }
    cddp_buf_init(b, b->max);
    return 0;
}

int rdzv_wire_send(uv_stream_t *stream, const struct proto_msg *m)
{
    struct cddp_buf b;
    cddp_buf_init(&b, PROTO_FRAME_HEADER + PROTO_FRAME_MAX);
    int rc = proto_msg_encode(m, &b);
    if (rc == 0)
        rc = rdzv_wire_write_buf(stream, &b);
    cddp_buf_free(&b);
    return rc;
}

int rdzv_wire_send_error(uv_stream_t *stream, int code, const char *message)
{
    struct proto_msg m = {.type = PROTO_ERROR};
    m.error.code = code;
    m.error.message = message;
    return rdzv_wire_send(stream, &m);
}

int rdzv_wire_addr_name(const struct sockaddr *sa, char *buf, size_t len, bool *loopback)
{
    *loopback = false;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        *loopback = (ntohl(in->sin_addr.s_addr) >> 24) == 127;
        return uv_ip4_name(in, buf, len);
    }
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        const unsigned char *a = in6->sin6_addr.s6_addr;
        static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (memcmp(a, mapped, 12) == 0) {
            struct sockaddr_in in = {.sin_family = AF_INET};
            memcpy(&in.sin_addr, a + 12, 4);
            *loopback = a[12] == 127;
            return uv_ip4_name(&in, buf, len);
        }
        *loopback = IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
        return uv_ip6_name(in6, buf, len);
    }
    snprintf(buf, len, "?");
    return UV_EAFNOSUPPORT;
}

int rdzv_wire_addr_port(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return ntohs(((const struct sockaddr_in *)sa)->sin_port);
    if (sa->sa_family == AF_INET6)
        return ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
    return 0;
}

int rdzv_wire_resolve(uv_loop_t *loop, const char *host, int port, bool passive,
                      struct addrinfo **out, char *err, size_t errlen)
{
    struct addrinfo hints;
    char service[16];
    uv_getaddrinfo_t req;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : AI_ADDRCONFIG);
    snprintf(service, sizeof(service), "%d", port);
    if (host && host[0] == '\0')
        host = NULL;
    /* No callback: uv_getaddrinfo runs synchronously. */
    int rc = uv_getaddrinfo(loop, &req, NULL, host, service, &hints);
    if (rc) {
        snprintf(err, errlen, "cannot resolve '%s': %s", host ? host : "*", uv_strerror(rc));
        return rc;
    }
    *out = req.addrinfo;
    return 0;
}

bool rdzv_wire_token_equal(const char *expected, const char *given)
{
    size_t el = strlen(expected), gl = strlen(given);
    unsigned char diff = el != gl;
    /* Always walks the whole expected token, whatever was given. */
    for (size_t i = 0; i < el; i++) {
        unsigned char g = i < gl ? (unsigned char)given[i] : 0;
        diff |= (unsigned char)expected[i] ^ g;
    }
    return diff == 0 && el == gl;
}
