/* hostname.h: this machine's names, as Python's socket module gives them. */
#ifndef CDDP_COMMON_HOSTNAME_H
#define CDDP_COMMON_HOSTNAME_H

#include <stdbool.h>
#include <stddef.h>

/* socket.getfqdn(): gethostname(), resolved, then the first of the reverse
 * lookup's name and aliases that contains a dot, else that name; the plain
 * host name when lookups fail. Can block on DNS: call it off the hot path. */
void cddp_fqdn(char *out, size_t len);

/* Whether host names this machine (torchrun's _matches_machine_hostname,
 * made sturdier): "localhost"; an address, or a name resolving to one, that
 * is a loopback address or an address of one of this machine's interfaces;
 * gethostname() or the FQDN (case-insensitive). Can block on DNS. */
bool cddp_host_is_local(const char *host);

#endif
