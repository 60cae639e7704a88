/*
 * uuid.h: version 4 (random) UUIDs, the one generator of every program:
 * cddprun's --standalone run id, the agent's run id for an empty
 * --rdzv_id, the file timer's default pipe name.
 *
 * The bytes come from getrandom(2). Should it fail (a kernel without it,
 * or a signal before the entropy pool is ready), one fallback mixes the
 * wall and monotonic clocks, the pid, a process-wide counter and a stack
 * address through splitmix64: not secret, but distinct between calls and
 * between processes, which is all a run id or a pipe name needs.
 *
 * Thread-safe; nothing is allocated.
 */
#ifndef CDDP_COMMON_UUID_H
#define CDDP_COMMON_UUID_H

#include <stddef.h>

/* "xxxxxxxx-xxxx-4xxx-Vxxx-xxxxxxxxxxxx" and its NUL. */
#define CDDP_UUID_STR_SIZE 37
/* 2^128 has 39 decimal digits; and the NUL. */
#define CDDP_UUID_INT_SIZE 40

/* 16 random bytes with the version (4) and variant (RFC 4122) bits set. */
void cddp_uuid4(unsigned char b[16]);

/* Python's str(uuid.uuid4()): lower-case hex in the 8-4-4-4-12 groups. */
void cddp_uuid4_str(char out[CDDP_UUID_STR_SIZE]);

/* Python's str(uuid.uuid4().int): the 128 bits as one decimal number
 * (torchrun's run id for an empty --rdzv_id). Cut to len - 1 characters
 * when len is smaller than CDDP_UUID_INT_SIZE. */
void cddp_uuid4_int(char *out, size_t len);

/* The two forms of given bytes (tests pass known ones). */
void cddp_uuid_format(const unsigned char b[16], char out[CDDP_UUID_STR_SIZE]);
void cddp_uuid_format_int(const unsigned char b[16], char *out, size_t len);

/* What cddp_uuid4 uses when getrandom fails, with the same bits set;
 * public so that the tests can reach it. */
void cddp_uuid4_fallback(unsigned char b[16]);

#endif
