/* errname.c: the error names on the wire (docs/protocol.md, "Errors"):
 * see proto_error_name in msg.h. */
#include "proto/msg.h"

#include <string.h>

#include "common/errors.h"

const char *proto_error_name(int code)
{
    return cddp_err_name(code);
}

int proto_error_code(const char *name)
{
    if (strcmp(name, "OK") == 0)
        return 0;
#define XX(n, num, msg)                                                                            \
    if (strcmp(name, #n) == 0)                                                                     \
        return num;
    CDDP_ERRORS(XX)
#undef XX
    for (int e = 1; e < 200; e++) {
        const char *n = strerrorname_np(e);
        if (n && strcmp(n, name) == 0)
            return -e;
    }
    return CDDP_EPEER;
}
