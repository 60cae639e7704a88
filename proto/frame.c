/* frame.c: see frame.h. */
#include "proto/frame.h"

#include <string.h>

#include "common/errors.h"

int proto_frame_append(struct cddp_buf *out, const void *payload, size_t len)
{
    if (len > PROTO_FRAME_MAX)
        return CDDP_ETOOBIG;
    unsigned char hdr[PROTO_FRAME_HEADER];
    proto_frame_header((uint32_t)len, hdr);
    size_t mark = out->len;
    int rc = cddp_buf_append(out, hdr, sizeof(hdr));
    if (rc == 0)
        rc = cddp_buf_append(out, payload, len);
    if (rc) {
        out->len = mark; /* all or nothing */
        if (out->data)
            out->data[mark] = '\0';
    }
    return rc;
}

void proto_decoder_init(struct proto_decoder *d, uint32_t max_payload)
{
    if (max_payload == 0 || max_payload > PROTO_FRAME_MAX)
        max_payload = PROTO_FRAME_MAX;
    d->max = max_payload;
    cddp_buf_init(&d->buf, (size_t)max_payload + PROTO_FRAME_HEADER);
}

void proto_decoder_free(struct proto_decoder *d)
{
    cddp_buf_free(&d->buf);
}

uint32_t proto_decoder_announced(const struct proto_decoder *d)
{
    if (d->buf.len < PROTO_FRAME_HEADER)
        return 0;
    return proto_frame_length((const unsigned char *)d->buf.data);
}

int proto_decoder_feed(struct proto_decoder *d, const void *data, size_t len, proto_frame_cb cb,
                       void *arg)
{
    const unsigned char *p = data;
    int rc;

    /* First complete a frame begun in an earlier read. */
    while (d->buf.len > 0 && len > 0) {
        size_t want;
        if (d->buf.len < PROTO_FRAME_HEADER) {
            want = PROTO_FRAME_HEADER - d->buf.len;
        } else {
            uint32_t flen = proto_frame_length((const unsigned char *)d->buf.data);
            want = PROTO_FRAME_HEADER + (size_t)flen - d->buf.len;
        }
        size_t take = want < len ? want : len;
        if ((rc = cddp_buf_append(&d->buf, p, take)) != 0)
            return rc;
        p += take;
        len -= take;
        if (d->buf.len < PROTO_FRAME_HEADER)
            return 0;
        uint32_t flen = proto_frame_length((const unsigned char *)d->buf.data);
        if (flen > d->max)
            return CDDP_ETOOBIG; /* the header stays in buf for proto_decoder_announced */
        if (d->buf.len < PROTO_FRAME_HEADER + (size_t)flen)
            continue;
        rc = cb(arg, d->buf.data + PROTO_FRAME_HEADER, flen);
        /* Give back the memory of a large frame: thousands of idle
         * connections should not each keep a megabyte. */
        if (d->buf.cap > 64 * 1024)
            cddp_buf_free(&d->buf);
        else
            cddp_buf_reset(&d->buf);
        if (rc)
            return rc;
    }

    /* Then whole frames straight from the caller's bytes. */
    while (len >= PROTO_FRAME_HEADER) {
        uint32_t flen = proto_frame_length(p);
        if (flen > d->max) {
            if ((rc = cddp_buf_append(&d->buf, p, PROTO_FRAME_HEADER)) != 0)
                return rc;
            return CDDP_ETOOBIG;
        }
        if (len - PROTO_FRAME_HEADER < flen)
            break;
        rc = cb(arg, (const char *)p + PROTO_FRAME_HEADER, flen);
        p += PROTO_FRAME_HEADER + flen;
        len -= PROTO_FRAME_HEADER + flen;
        if (rc)
            return rc;
    }
    if (len > 0) {
        if (len >= PROTO_FRAME_HEADER && proto_frame_length(p) > d->max)
            return CDDP_ETOOBIG;
        if ((rc = cddp_buf_append(&d->buf, p, len)) != 0)
            return rc;
    }
    return 0;
}
