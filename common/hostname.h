/* hostname.h: this machine's names, as Python's socket module gives them. */
#ifndef CDDP_COMMON_HOSTNAME_H
#define CDDP_COMMON_HOSTNAME_H

#include <stddef.h>

/* socket.getfqdn(): gethostname(), resolved, then the first of the reverse
 * lookup's name and aliases that contains a dot, else that name; the plain
 * host name when lookups fail. Can block on DNS: call it off the hot path. */
void cddp_fqdn(char *out, size_t len);

#endif
