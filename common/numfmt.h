/*
 * numfmt.h: numbers as text for the writers that must not depend on the
 * locale or pay for printf on every value (jsonw.c, status/prom.c).
 *
 * Semantics: integers (|v| < 2^53, not -0) are written with digits only,
 * without printf; other finite values as the shortest of %.15g, %.16g and
 * %.17g that reads back as the same double. Non-finite values are the
 * caller's business (JSON writes null, Prometheus NaN and +Inf), so they
 * are refused here. Limits: buf must hold 32 bytes for any finite value;
 * the result is NUL-terminated and cut to len - 1 when buf is shorter.
 * Pure: no allocation, no state, safe from any thread.
 */
#ifndef CDDP_COMMON_NUMFMT_H
#define CDDP_COMMON_NUMFMT_H

#include <stddef.h>

/* Writes finite v into buf (len > 0) and returns the length written; 0 for
 * NaN or an infinity (buf then holds ""). */
size_t cddp_format_double(double v, char *buf, size_t len);

#endif
