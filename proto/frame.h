/*
 * frame.h: the wire framing of every cddp protocol message.
 *
 * A frame is a 4-byte big-endian payload length followed by the payload,
 * one JSON object (see proto/msg.h). Payloads are at most PROTO_FRAME_MAX
 * bytes; a header announcing more is refused before any of the body is
 * read, so a peer cannot make us buffer more than one maximum frame.
 *
 * No I/O here: the caller reads bytes from wherever it likes and feeds them
 * to a decoder, which hands back whole payloads.
 */
#ifndef CDDP_PROTO_FRAME_H
#define CDDP_PROTO_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "common/strutil.h"

#define PROTO_FRAME_HEADER 4u
#define PROTO_FRAME_MAX (1u << 20) /* 1 MiB of payload */

/* Writes the 4-byte header for a payload of len bytes. */
static inline void proto_frame_header(uint32_t len, unsigned char out[4])
{
    out[0] = (unsigned char)(len >> 24);
    out[1] = (unsigned char)(len >> 16);
    out[2] = (unsigned char)(len >> 8);
    out[3] = (unsigned char)len;
}

static inline uint32_t proto_frame_length(const unsigned char in[4])
{
    return (uint32_t)in[0] << 24 | (uint32_t)in[1] << 16 | (uint32_t)in[2] << 8 | (uint32_t)in[3];
}

/* Appends header + payload to out (which must allow the size). 0, CDDP_ETOOBIG or -ENOMEM. */
int proto_frame_append(struct cddp_buf *out, const void *payload, size_t len);

/* An incremental decoder: bytes in, whole payloads out. */
struct proto_decoder {
    struct cddp_buf buf; /* the partial frame, header included */
    uint32_t max;        /* largest payload accepted */
};

/* Called for each whole payload; the pointer is valid only during the call.
 * A nonzero return stops the decoder, which returns that value. */
typedef int (*proto_frame_cb)(void *arg, const char *payload, size_t len);

/* max_payload: at most PROTO_FRAME_MAX (larger values are clamped). */
void proto_decoder_init(struct proto_decoder *d, uint32_t max_payload);
void proto_decoder_free(struct proto_decoder *d);

/* Feeds len bytes. Whole frames are handed to cb straight from data when
 * possible (no copy); only a trailing partial frame is buffered. Returns 0,
 * CDDP_ETOOBIG when a header announces more than max (the stream is then
 * unusable and the connection should be closed), -ENOMEM, or cb's nonzero
 * return. */
int proto_decoder_feed(struct proto_decoder *d, const void *data, size_t len, proto_frame_cb cb,
                       void *arg);

/* Bytes of a partial frame held back (0 between frames). */
static inline size_t proto_decoder_pending(const struct proto_decoder *d)
{
    return d->buf.len;
}

/* The payload length the last refused header announced (for error messages). */
uint32_t proto_decoder_announced(const struct proto_decoder *d);

#endif
