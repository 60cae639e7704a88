/*
 * errors.h: the project's error codes.
 *
 * Functions return 0 on success or a negative code. System errors are
 * returned as -errno (CDDP_ERR_FROM_ERRNO); the project's own errors live in
 * one X-macro table below, so the enum, cddp_strerror() and cddp_err_name()
 * never drift apart. Codes are never renumbered or removed: add new ones at
 * the end of the table.
 */
#ifndef CDDP_COMMON_ERRORS_H
#define CDDP_COMMON_ERRORS_H

#include <errno.h>
#include <stddef.h>

#define CDDP_ERR_FROM_ERRNO(e) (-(e))

/* XX(name, number, message): numbers are below -4000 so they never collide with -errno. */
#define CDDP_ERRORS(XX)                                                                            \
    XX(EPARSE, -4001, "malformed value")                                                           \
    XX(ERANGE_ARG, -4002, "value out of range")                                                    \
    XX(ETOOBIG, -4003, "input exceeds its size limit")                                             \
    XX(EPROTO_VERSION, -4004, "unsupported protocol version")                                      \
    XX(EPROTO_TYPE, -4005, "unknown message type")                                                 \
    XX(EPROTO_FIELD, -4006, "missing or mistyped message field")                                   \
    XX(ETOKEN, -4007, "join token refused")                                                        \
    XX(ECLOSED, -4008, "rendezvous closed")                                                        \
    XX(ETIMEOUT, -4009, "timed out")                                                               \
    XX(ENOTFOUND, -4010, "not found")                                                              \
    XX(EEXISTS, -4011, "already exists")                                                           \
    XX(ESTATE, -4012, "operation not valid in this state")                                         \
    XX(EPEER, -4013, "peer failed")                                                                \
    XX(ECONFIG, -4014, "invalid configuration")                                                    \
    XX(EIO_SHORT, -4015, "truncated input")                                                        \
    XX(ECORRUPT, -4016, "corrupt input")                                                           \
    XX(EMISMATCH, -4017, "input does not match what was expected")

enum cddp_error {
#define XX(name, num, msg) CDDP_##name = (num),
    CDDP_ERRORS(XX)
#undef XX
};

/* Human-readable message for a code (project code or -errno). Never NULL. */
const char *cddp_strerror(int err);

/* Writes a one-line reason into err (as snprintf: truncated to errlen) and
 * returns code, for setup paths that fill a caller's error buffer:
 *     return cddp_fail(err, errlen, CDDP_EPARSE, "%s: empty address", name); */
int cddp_fail(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Symbolic name ("EPARSE", "ECONNREFUSED", ...). Never NULL. */
const char *cddp_err_name(int err);

#endif
