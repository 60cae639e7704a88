/* errorfile.c: see errorfile.h. */
#include "proto/errorfile.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/strutil.h"

/* cJSON's text, copied so that callers free() it whatever cJSON's hooks. */
static char *print(cJSON *doc)
{
    char *json = doc ? cJSON_PrintUnformatted(doc) : NULL;
    char *out = json ? strdup(json) : NULL;
    cJSON_free(json);
    return out;
}

char *proto_errorfile_build(const char *message, const char *py_callstack, long timestamp,
                            const int *error_code)
{
    char ts[32];
    snprintf(ts, sizeof(ts), "%ld", timestamp);
    cJSON *doc = cJSON_CreateObject();
    cJSON *msg = doc ? cJSON_AddObjectToObject(doc, "message") : NULL;
    cJSON *extra = NULL;
    if (msg != NULL && cJSON_AddStringToObject(msg, "message", message) != NULL)
        extra = cJSON_AddObjectToObject(msg, "extraInfo");
    char *out = NULL;
    if (extra != NULL && cJSON_AddStringToObject(extra, "py_callstack", py_callstack) != NULL &&
        cJSON_AddStringToObject(extra, "timestamp", ts) != NULL &&
        (error_code == NULL || cJSON_AddNumberToObject(msg, "errorCode", *error_code) != NULL))
        out = print(doc);
    cJSON_Delete(doc);
    return out;
}

char *proto_errorfile_set_code(const char *text, int code)
{
    cJSON *doc = cJSON_Parse(text);
    if (doc == NULL)
        return NULL;
    cJSON *msg = cJSON_GetObjectItemCaseSensitive(doc, "message");
    if (cJSON_IsObject(msg) && code != 0) {
        cJSON_DeleteItemFromObjectCaseSensitive(msg, "errorCode");
        cJSON_AddNumberToObject(msg, "errorCode", code);
    }
    char *out = print(doc);
    cJSON_Delete(doc);
    return out;
}

/* Python's int() of a JSON number or numeric string; false if neither. */
static bool json_int(const cJSON *v, long *out)
{
    if (cJSON_IsNumber(v) && isfinite(v->valuedouble)) {
        *out = (long)v->valuedouble;
        return true;
    }
    if (cJSON_IsString(v))
        return cddp_parse_long(v->valuestring, -(1L << 62), 1L << 62, out) == 0;
    return false;
}

int proto_errorfile_parse(const char *text, struct proto_errorfile *out, char *why, size_t whylen)
{
    memset(out, 0, sizeof(*out));
    cJSON *root = cJSON_Parse(text);
    const cJSON *msg = root ? cJSON_GetObjectItemCaseSensitive(root, "message") : NULL;
    const char *bad = NULL;
    if (root == NULL || !cJSON_IsObject(root))
        bad = "<error file is not a JSON object>";
    else if (msg == NULL || !(cJSON_IsString(msg) || cJSON_IsObject(msg)))
        bad = "<error file has no \"message\">";
    if (bad != NULL) {
        cJSON_Delete(root);
        if (why != NULL && whylen > 0)
            cddp_strlcpy(why, bad, whylen);
        return CDDP_EPARSE;
    }
    const char *show;
    const cJSON *ts;
    if (cJSON_IsString(msg)) {
        /* The plain-string format: message as is, top-level "timestamp". */
        show = msg->valuestring;
        ts = cJSON_GetObjectItemCaseSensitive(root, "timestamp");
    } else {
        const cJSON *extra = cJSON_GetObjectItemCaseSensitive(msg, "extraInfo");
        const cJSON *stack = cJSON_GetObjectItemCaseSensitive(extra, "py_callstack");
        const cJSON *text_msg = cJSON_GetObjectItemCaseSensitive(msg, "message");
        show = cJSON_IsString(stack)      ? stack->valuestring
               : cJSON_IsString(text_msg) ? text_msg->valuestring
                                          : "<N/A>";
        ts = cJSON_GetObjectItemCaseSensitive(extra, "timestamp");
        out->structured = true;
    }
    out->has_timestamp = json_int(ts, &out->timestamp);
    out->message = strdup(show);
    cJSON_Delete(root);
    return out->message ? 0 : CDDP_ERR_FROM_ERRNO(ENOMEM);
}

void proto_errorfile_free(struct proto_errorfile *f)
{
    free(f->message);
    f->message = NULL;
}
