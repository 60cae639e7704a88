/* errors.c: names and messages for the codes in errors.h. */
#include "common/errors.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *cddp_strerror(int err)
{
    switch (err) {
    case 0:
        return "success";
#define XX(name, num, msg)                                                                         \
    case num:                                                                                      \
        return msg;
        CDDP_ERRORS(XX)
#undef XX
    default:
        break;
    }
    if (err < 0 && err > -4000)
        return strerror(-err);
    return "unknown error";
}

const char *cddp_err_name(int err)
{
    switch (err) {
    case 0:
        return "OK";
#define XX(name, num, msg)                                                                         \
    case num:                                                                                      \
        return #name;
        CDDP_ERRORS(XX)
#undef XX
    default:
        break;
    }
    if (err < 0 && err > -4000) {
        const char *n = strerrorname_np(-err);
        return n ? n : "EUNKNOWN";
    }
    return "EUNKNOWN";
}

int cddp_fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return code;
}
