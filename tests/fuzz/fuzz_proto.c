/*
 * fuzz_proto.c: libFuzzer target for the protocol decoder (proto/frame.c,
 * proto/msg.c).
 *
 * The first input byte picks a mode. Odd: the rest is one payload for
 * proto_msg_decode. Even: the rest is a byte stream for the frame decoder,
 * split into two reads at a point taken from the same byte, and each frame
 * is decoded. Every message that decodes must encode again, and the
 * encoding must be a fixed point: encode(decode(encode(m))) == encode(m).
 * Anything else (a crash, a leak, UB, a broken round trip) is a finding.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "proto/frame.h"
#include "proto/msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_roundtrip(const struct proto_msg *m)
{
    int rc;
    char *a = proto_msg_to_json(m, &rc);
    if (a == NULL) {
        /* Decoded messages are always encodable, except for memory. */
        if (rc != CDDP_ERR_FROM_ERRNO(ENOMEM)) {
            fprintf(stderr, "decoded %s but cannot encode it: %s\n", proto_type_name(m->type),
                    cddp_err_name(rc));
            abort();
        }
        return;
    }
    struct proto_msg m2;
    char err[256];
    if (proto_msg_decode(a, strlen(a), &m2, err, sizeof(err)) != 0) {
        fprintf(stderr, "own encoding does not decode: %s\n%s\n", err, a);
        abort();
    }
    char *b = proto_msg_to_json(&m2, &rc);
    if (b == NULL || strcmp(a, b) != 0) {
        fprintf(stderr, "encoding is not a fixed point:\n%s\n%s\n", a, b ? b : "(null)");
        abort();
    }
    free(b);
    free(a);
    proto_msg_free(&m2);
}

static int on_frame(void *arg, const char *payload, size_t len)
{
    (void)arg;
    struct proto_msg m;
    char err[256];
    if (proto_msg_decode(payload, len, &m, err, sizeof(err)) == 0) {
        check_roundtrip(&m);
        proto_msg_free(&m);
    } else if (err[0] == '\0') {
        fprintf(stderr, "decode failed without saying why\n");
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t mode = data[0];
    data++;
    size--;
    if (mode & 1) {
        on_frame(NULL, (const char *)data, size);
        return 0;
    }
    struct proto_decoder d;
    proto_decoder_init(&d, (mode & 2) ? 4096 : 0);
    size_t cut = size ? (size_t)(mode >> 2) % (size + 1) : 0;
    int rc = proto_decoder_feed(&d, data, cut, on_frame, NULL);
    if (rc == 0)
        proto_decoder_feed(&d, data + cut, size - cut, on_frame, NULL);
    proto_decoder_free(&d);
    return 0;
}
