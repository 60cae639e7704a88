/* Unit tests for trainer/safetensors.c: round trips, the exact header the
 * writer produces, every validation the reader does, truncation, atomic save
 * (a writer killed mid-write leaves the old file), the writer lock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/errors.h"
#include "trainer/safetensors.h"

static char tmpdir[256];

static int setup_dir(void **state)
{
    (void)state;
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(tmpdir, sizeof(tmpdir), "%s/cddp-st-XXXXXX", base);
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_dir(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void path_in_tmp(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", tmpdir, name);
}

static size_t file_bytes(const char *path, uint8_t **out)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *out = malloc((size_t)n + 1);
    assert_int_equal(fread(*out, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    return (size_t)n;
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

/* A file image: the 8-byte length, json as is, then data_len zero bytes. */
static uint8_t *image(const char *json, size_t data_len, size_t *len)
{
    size_t h = strlen(json);
    *len = 8 + h + data_len;
    uint8_t *b = calloc(1, *len);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(((uint64_t)h >> (8 * i)) & 0xFF);
    memcpy(b + 8, json, h);
    return b;
}

static int decode_json(const char *json, size_t data_len, struct trn_st_file *f, char *err,
                       size_t errlen)
{
    size_t len;
    uint8_t *b = image(json, data_len, &len);
    int rc = trn_st_decode(b, len, len, f, err, errlen);
    free(b);
    return rc;
}

static void test_round_trip(void **state)
{
    (void)state;
    float w[2 * 3 * 2 * 2];
    for (int i = 0; i < 24; i++)
        w[i] = (float)i * 0.5f - 3.0f;
    int64_t nbt = 1234567890123LL;
    uint16_t half[3] = {0x3C00, 0xC000, 0x7BFF};
    uint8_t bytes[5] = {1, 2, 3, 4, 5};
    struct trn_st_tensor t[] = {
        {.name = "conv1.weight", .dtype = TRN_ST_F32, .ndim = 4, .shape = {2, 3, 2, 2}, .data = w},
        {.name = "bn1.num_batches_tracked", .dtype = TRN_ST_I64, .ndim = 0, .data = &nbt},
        {.name = "h.bf16", .dtype = TRN_ST_BF16, .ndim = 1, .shape = {3}, .data = half},
        {.name = "h.f16", .dtype = TRN_ST_F16, .ndim = 2, .shape = {1, 3}, .data = half},
        {.name = "empty", .dtype = TRN_ST_F32, .ndim = 2, .shape = {0, 7}, .data = NULL},
        {.name = "caf\xc3\xa9 \"q\"\n", .dtype = TRN_ST_U8, .ndim = 1, .shape = {5}, .data = bytes},
    };
    struct trn_st_meta meta[] = {{"format", "cddp"}, {"note", "tab\there \\ \x01 \xe2\x82\xac"}};
    char path[512], err[512];
    path_in_tmp(path, sizeof(path), "rt.safetensors");
    assert_int_equal(trn_st_save(path, t, 6, meta, 2, err, sizeof(err)), 0);

    struct trn_st_file f;
    int rc = trn_st_open(path, &f, err, sizeof(err));
    if (rc)
        fail_msg("open: %s", err);
    assert_int_equal(f.n_tensors, 6);
    assert_int_equal(f.n_meta, 2);
    assert_int_equal(f.data_start % 8, 0);
    assert_string_equal(trn_st_meta_get(&f, "note"), meta[1].value);
    assert_string_equal(trn_st_meta_get(&f, "format"), "cddp");
    assert_null(trn_st_meta_get(&f, "nope"));
    for (int i = 0; i < 6; i++) {
        const struct trn_st_tensor *g = &f.tensors[i]; /* header order is the caller's */
        assert_string_equal(g->name, t[i].name);
        assert_ptr_equal(trn_st_find(&f, t[i].name), g);
        assert_int_equal(g->dtype, t[i].dtype);
        assert_int_equal(g->ndim, t[i].ndim);
        assert_memory_equal(g->shape, t[i].shape, sizeof(uint64_t) * (size_t)t[i].ndim);
        uint8_t buf[128];
        assert_true(g->nbytes <= sizeof(buf));
        assert_int_equal(trn_st_read(&f, g, buf, err, sizeof(err)), 0);
        if (g->nbytes)
            assert_memory_equal(buf, t[i].data, g->nbytes);
    }
    assert_int_equal(f.tensors[1].numel, 1);
    assert_int_equal(f.tensors[1].nbytes, 8);
    assert_int_equal(f.tensors[4].nbytes, 0);
    assert_null(trn_st_find(&f, "conv1"));
    uint32_t crc;
    assert_int_equal(trn_st_data_crc32(&f, &crc, err, sizeof(err)), 0);
    assert_int_equal(crc, trn_st_tensors_crc32(t, 6));
    trn_st_close(&f);

    char tmp[600];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    assert_int_equal(access(tmp, F_OK), -1); /* the temporary file is gone */
}

/* The exact bytes: compact JSON, metadata first, padded with spaces to 8. */
static void test_exact_header(void **state)
{
    (void)state;
    float x[2] = {1, 2};
    int64_t n = 7;
    struct trn_st_tensor t[] = {
        {.name = "a", .dtype = TRN_ST_F32, .ndim = 1, .shape = {2}, .data = x},
        {.name = "b", .dtype = TRN_ST_I64, .ndim = 0, .data = &n},
    };
    struct trn_st_meta m[] = {{"k", "v"}};
    uint8_t *h;
    size_t len;
    char err[256];
    assert_int_equal(trn_st_encode_header(t, 2, m, 1, &h, &len, err, sizeof(err)), 0);
    const char *want = "{\"__metadata__\":{\"k\":\"v\"},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"b\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[8,16]}}";
    size_t wl = strlen(want), padded = (wl + 7) / 8 * 8;
    assert_int_equal(len, 8 + padded);
    assert_int_equal(h[0] | (h[1] << 8), padded);
    assert_memory_equal(h + 8, want, wl);
    for (size_t i = 8 + wl; i < len; i++)
        assert_int_equal(h[i], ' ');
    free(h);

    /* No metadata: no "__metadata__" key at all. */
    assert_int_equal(trn_st_encode_header(t, 1, NULL, 0, &h, &len, err, sizeof(err)), 0);
    assert_memory_equal(h + 8, "{\"a\":", 5);
    free(h);
}

struct bad_case {
    const char *json;
    size_t data_len;
    int code;
    const char *msg; /* a substring of the error */
};

static void test_decode_rejects(void **state)
{
    (void)state;
#define T(name, rest) "\"" name "\":{\"dtype\":\"F32\",\"shape\":" rest
    static const struct bad_case cases[] = {
        {" {}", 0, CDDP_ECORRUPT, "does not start with '{'"},
        {"[]", 0, CDDP_ECORRUPT, "does not start with '{'"},
        {"{", 0, CDDP_ECORRUPT, "expected a string"},
        {"{" T("a", "[1],\"data_offsets\":[0,4]}"), 4, CDDP_ECORRUPT, "expected ',' or '}'"},
        {"{" T("a", "[1],\"data_offsets\":[0,4]}}x"), 4, CDDP_ECORRUPT, "after the JSON"},
        {"{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, CDDP_ECORRUPT,
         "unknown dtype 'F33'"},
        {"{" T("a", "[3],\"data_offsets\":[0,8]}}"), 8, CDDP_ECORRUPT, "needs 12 bytes"},
        {"{" T("a", "[3],\"data_offsets\":[0,12]}}"), 8, CDDP_EIO_SHORT, "run past the end"},
        {"{" T("a", "[2],\"data_offsets\":[0,8]},") T("b", "[2],\"data_offsets\":[4,12]}}"), 12,
         CDDP_ECORRUPT, "overlap"},
        {"{" T("a", "[1],\"data_offsets\":[0,4]},") T("b", "[1],\"data_offsets\":[8,12]}}"), 12,
         CDDP_ECORRUPT, "hole of 4 bytes"},
        {"{" T("a", "[1],\"data_offsets\":[4,8]}}"), 8, CDDP_ECORRUPT, "hole of 4 bytes"},
        {"{" T("a", "[1],\"data_offsets\":[0,4]}}"), 8, CDDP_ECORRUPT, "cover 4 bytes"},
        {"{}", 4, CDDP_ECORRUPT, "cover 0 bytes"},
        {"{" T("a", "[1],\"data_offsets\":[0,4]},") T("a", "[1],\"data_offsets\":[4,8]}}"), 8,
         CDDP_ECORRUPT, "duplicate tensor name 'a'"},
        {"{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, CDDP_ECORRUPT,
         "duplicate __metadata__ key 'k'"},
        {"{\"__metadata__\":{},\"__metadata__\":{}}", 0, CDDP_ECORRUPT, "duplicate __metadata__"},
        {"{\"__metadata__\":{\"k\":1}}", 0, CDDP_ECORRUPT, "values must be strings"},
        {"{\"__metadata__\":[]}", 0, CDDP_ECORRUPT, "must be an object"},
        {"{" T("a", "[-1],\"data_offsets\":[0,4]}}"), 4, CDDP_ECORRUPT, "negative"},
        {"{" T("a", "[1.0],\"data_offsets\":[0,4]}}"), 4, CDDP_ECORRUPT, "expected an integer"},
        {"{" T("a", "[1e0],\"data_offsets\":[0,4]}}"), 4, CDDP_ECORRUPT, "expected an integer"},
        {"{" T("a", "[01],\"data_offsets\":[0,4]}}"), 4, CDDP_ECORRUPT, "leading zero"},
        {"{" T("a", "[18446744073709551616],\"data_offsets\":[0,4]}}"), 4, CDDP_ECORRUPT,
         "64 bits"},
        {"{" T("a", "[4294967296,4294967296,4294967296],\"data_offsets\":[0,4]}}"), 4,
         CDDP_ECORRUPT, "overflows"},
        {"{" T("a", "[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}"), 4, CDDP_ECORRUPT,
         "too many dimensions"},
        {"{" T("a", "[1],\"data_offsets\":[0,4],\"extra\":1}}"), 4, CDDP_ECORRUPT,
         "unknown field 'extra'"},
        {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, CDDP_ECORRUPT,
         "missing \"shape\""},
        {"{" T("a", "[1]}}"), 4, CDDP_ECORRUPT, "missing \"data_offsets\""},
        {"{" T("a", "[1],\"data_offsets\":[0]}}"), 4, CDDP_ECORRUPT, "two integers"},
        {"{" T("a", "[1],\"data_offsets\":[0,4,8]}}"), 4, CDDP_ECORRUPT, "two integers"},
        {"{" T("a", "[1],\"data_offsets\":[4,0]}}"), 4, CDDP_ECORRUPT, "end before they begin"},
        {"{" T("a", "[1],\"shape\":[1],\"data_offsets\":[0,4]}}"), 4, CDDP_ECORRUPT,
         "duplicate \"shape\""},
        {"{\"a\":{}}", 0, CDDP_ECORRUPT, "empty tensor entry"},
        {"{\"a\":[]}", 0, CDDP_ECORRUPT, "expected '{'"},
        {"{" T("", "[1],\"data_offsets\":[0,4]}}"), 4, CDDP_ECORRUPT, "empty tensor name"},
        {"{" T("\xff", "[1],\"data_offsets\":[0,4]}}"), 4, CDDP_ECORRUPT, "invalid UTF-8"},
        {"{" T("\xc0\xaf", "[1],\"data_offsets\":[0,4]}}"), 4, CDDP_ECORRUPT, "invalid UTF-8"},
        {"{" T("\xed\xa0\x80", "[1],\"data_offsets\":[0,4]}}"), 4, CDDP_ECORRUPT, "invalid UTF-8"},
        {"{" T("\\ud800", "[1],\"data_offsets\":[0,4]}}"), 4, CDDP_ECORRUPT, "surrogate"},
        {"{" T("\\udc00", "[1],\"data_offsets\":[0,4]}}"), 4, CDDP_ECORRUPT, "surrogate"},
        {"{" T("\\u0000", "[1],\"data_offsets\":[0,4]}}"), 4, CDDP_ECORRUPT, "NUL"},
        {"{" T("\\x", "[1],\"data_offsets\":[0,4]}}"), 4, CDDP_ECORRUPT, "bad escape"},
        {"{" T("\\u12g4", "[1],\"data_offsets\":[0,4]}}"), 4, CDDP_ECORRUPT, "bad hex"},
        {"{\"a\nb\":{}}", 0, CDDP_ECORRUPT, "control character"},
        {"{\"a", 0, CDDP_ECORRUPT, "unterminated string"},
    };
#undef T
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct trn_st_file f;
        char err[512] = "";
        int rc = decode_json(cases[i].json, cases[i].data_len, &f, err, sizeof(err));
        if (rc != cases[i].code || strstr(err, cases[i].msg) == NULL)
            fail_msg("case %zu (%s): rc %d, err '%s'; want %d, '%s'", i, cases[i].json, rc, err,
                     cases[i].code, cases[i].msg);
        assert_null(f.tensors); /* a failed decode holds nothing */
        assert_null(f.strings);
        trn_st_close(&f);
    }
}

static void test_decode_accepts(void **state)
{
    (void)state;
    struct trn_st_file f;
    char err[512];
    /* Whitespace anywhere JSON allows it, trailing padding, empty tensors at one
     * offset, a scalar, escapes that decode to multi-byte UTF-8, a null metadata. */
    const char *json = "{ \"__metadata__\" : null ,\n"
                       "\"e1\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},"
                       "\"s\":{\"shape\":[],\"data_offsets\":[0,8],\"dtype\":\"I64\"},"
                       "\"e2\":{\"dtype\":\"BF16\",\"shape\":[3,0],\"data_offsets\":[8,8]},"
                       "\"x\\u00e9\\ud83d\\ude00\\/\":{\"dtype\":\"F16\",\"shape\":[2],"
                       "\"data_offsets\":[8,12]}\t}\r\n     ";
    int rc = decode_json(json, 12, &f, err, sizeof(err));
    if (rc)
        fail_msg("decode: %s", err);
    assert_int_equal(f.n_tensors, 4);
    assert_int_equal(f.n_meta, 0);
    assert_string_equal(f.tensors[3].name, "x\xc3\xa9\xf0\x9f\x98\x80/");
    assert_int_equal(f.tensors[1].ndim, 0);
    assert_int_equal(f.tensors[1].numel, 1);
    assert_non_null(trn_st_find(&f, "e2"));
    assert_int_equal(f.fd, -1);
    trn_st_close(&f);

    assert_int_equal(decode_json("{}", 0, &f, err, sizeof(err)), 0);
    assert_int_equal(f.n_tensors, 0);
    trn_st_close(&f);
}

static void test_prefix_checks(void **state)
{
    (void)state;
    struct trn_st_file f;
    char err[512];
    uint8_t b[16] = {0};
    assert_int_equal(trn_st_decode(b, 5, 5, &f, err, sizeof(err)), CDDP_EIO_SHORT);
    assert_non_null(strstr(err, "too short"));
    b[0] = 9; /* header of 9 bytes in a 16-byte file: 8 + 9 > 16 */
    assert_int_equal(trn_st_decode(b, 16, 16, &f, err, sizeof(err)), CDDP_EIO_SHORT);
    assert_non_null(strstr(err, "runs past the end"));
    uint64_t big = TRN_ST_MAX_HEADER + 1;
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(big >> (8 * i));
    assert_int_equal(trn_st_decode(b, 16, UINT64_MAX, &f, err, sizeof(err)), CDDP_ETOOBIG);
    assert_non_null(strstr(err, "100 MB"));
    memset(b, 0xff, 8); /* a huge length must not wrap around in 8 + N */
    assert_int_equal(trn_st_decode(b, 16, 16, &f, err, sizeof(err)), CDDP_ETOOBIG);
}

/* Every truncation of a valid file is refused, never read as something else. */
static void test_every_truncation_fails(void **state)
{
    (void)state;
    float x[3] = {1, 2, 3};
    int64_t n = 5;
    struct trn_st_tensor t[] = {
        {.name = "w", .dtype = TRN_ST_F32, .ndim = 1, .shape = {3}, .data = x},
        {.name = "n", .dtype = TRN_ST_I64, .ndim = 0, .data = &n},
    };
    struct trn_st_meta m[] = {{"arch", "resnet18"}};
    char path[512], cut[512], err[512];
    path_in_tmp(path, sizeof(path), "full.safetensors");
    path_in_tmp(cut, sizeof(cut), "cut.safetensors");
    assert_int_equal(trn_st_save(path, t, 2, m, 1, err, sizeof(err)), 0);
    uint8_t *all;
    size_t len = file_bytes(path, &all);
    for (size_t k = 0; k < len; k++) {
        write_bytes(cut, all, k);
        struct trn_st_file f;
        int rc = trn_st_open(cut, &f, err, sizeof(err));
        if (rc == 0)
            fail_msg("a file cut to %zu of %zu bytes was accepted", k, len);
        assert_non_null(strstr(err, cut)); /* the message names the file */
    }
    free(all);
}

static void test_read_after_shrink(void **state)
{
    (void)state;
    float x[256] = {0};
    struct trn_st_tensor t = {
        .name = "w", .dtype = TRN_ST_F32, .ndim = 1, .shape = {256}, .data = x};
    char path[512], err[512];
    path_in_tmp(path, sizeof(path), "shrink.safetensors");
    assert_int_equal(trn_st_save(path, &t, 1, NULL, 0, err, sizeof(err)), 0);
    struct trn_st_file f;
    assert_int_equal(trn_st_open(path, &f, err, sizeof(err)), 0);
    assert_int_equal(truncate(path, (off_t)(f.data_start + 100)), 0);
    float back[256];
    assert_int_equal(trn_st_read(&f, &f.tensors[0], back, err, sizeof(err)), CDDP_EIO_SHORT);
    assert_non_null(strstr(err, "shrank"));
    trn_st_close(&f);
}

static void test_writer_rejects(void **state)
{
    (void)state;
    float x = 1;
    uint8_t *h;
    size_t len;
    char err[256];
    struct trn_st_tensor dup[] = {
        {.name = "a", .dtype = TRN_ST_F32, .ndim = 0, .data = &x},
        {.name = "a", .dtype = TRN_ST_F32, .ndim = 0, .data = &x},
    };
    assert_int_equal(trn_st_encode_header(dup, 2, NULL, 0, &h, &len, err, sizeof(err)),
                     CDDP_ECORRUPT);
    assert_non_null(strstr(err, "duplicate tensor name 'a'"));
    struct trn_st_tensor bad[] = {
        {.name = "__metadata__", .dtype = TRN_ST_F32, .ndim = 0, .data = &x},
        {.name = "\xff", .dtype = TRN_ST_F32, .ndim = 0, .data = &x},
        {.name = "", .dtype = TRN_ST_F32, .ndim = 0, .data = &x},
        {.name = "nodata", .dtype = TRN_ST_F32, .ndim = 1, .shape = {2}, .data = NULL},
        {.name = "dims", .dtype = TRN_ST_F32, .ndim = 9, .data = &x},
        {.name = "dtype", .dtype = TRN_ST_NUM_DTYPES, .ndim = 0, .data = &x},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(trn_st_encode_header(&bad[i], 1, NULL, 0, &h, &len, err, sizeof(err)),
                         CDDP_ECORRUPT);
        assert_null(h);
    }
    struct trn_st_meta m[] = {{"k", "1"}, {"k", "2"}};
    assert_int_equal(trn_st_encode_header(dup, 1, m, 2, &h, &len, err, sizeof(err)), CDDP_ECORRUPT);
    assert_non_null(strstr(err, "duplicate metadata key"));
}

static void save_fill(const char *path, float v, size_t n)
{
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = v;
    struct trn_st_tensor t = {.name = "w", .dtype = TRN_ST_F32, .ndim = 1, .shape = {n}, .data = x};
    char err[512];
    int rc = trn_st_save(path, &t, 1, NULL, 0, err, sizeof(err));
    free(x);
    if (rc)
        fail_msg("save: %s", err);
}

/* A writer killed by the kernel in the middle of writing (SIGXFSZ from a file
 * size limit) leaves the old file byte for byte; the next save cleans up. */
static void test_killed_writer_leaves_old_file(void **state)
{
    (void)state;
    char path[512], tmp[600];
    path_in_tmp(path, sizeof(path), "atomic.safetensors");
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    save_fill(path, 1.0f, 1000);
    uint8_t *before, *after;
    size_t nb = file_bytes(path, &before);

    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit rl = {.rlim_cur = 64 * 1024, .rlim_max = 64 * 1024};
        signal(SIGXFSZ, SIG_DFL);
        setrlimit(RLIMIT_FSIZE, &rl);
        save_fill(path, 2.0f, 1 << 20); /* 4 MiB: dies at 64 KiB */
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGXFSZ);
    assert_int_equal(access(tmp, F_OK), 0); /* it died with the temporary file half-written */
    size_t na = file_bytes(path, &after);
    assert_int_equal(na, nb);
    assert_memory_equal(after, before, nb);
    free(after);

    save_fill(path, 3.0f, 10);
    assert_int_equal(access(tmp, F_OK), -1);
    struct trn_st_file f;
    char err[256];
    assert_int_equal(trn_st_open(path, &f, err, sizeof(err)), 0);
    float back[10];
    assert_int_equal(trn_st_read(&f, &f.tensors[0], back, err, sizeof(err)), 0);
    assert_true(back[9] == 3.0f);
    trn_st_close(&f);
    free(before);
}

/* A second writer of the same path is refused while the first holds the lock. */
static void test_concurrent_writer_refused(void **state)
{
    (void)state;
    char path[512], tmp[600], err[512];
    path_in_tmp(path, sizeof(path), "locked.safetensors");
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    save_fill(path, 1.0f, 4);
    int fd = open(tmp, O_WRONLY | O_CREAT, 0644);
    assert_true(fd >= 0);
    assert_int_equal(flock(fd, LOCK_EX), 0);
    float x = 9;
    struct trn_st_tensor t = {.name = "w", .dtype = TRN_ST_F32, .ndim = 0, .data = &x};
    pid_t pid = fork(); /* flock is per open file description: try from another process */
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fd);
        int rc = trn_st_save(path, &t, 1, NULL, 0, err, sizeof(err));
        _exit(rc == CDDP_EEXISTS && strstr(err, "another process") ? 0 : 1);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    close(fd);
    struct trn_st_file f;
    assert_int_equal(trn_st_open(path, &f, err, sizeof(err)), 0);
    assert_int_equal(f.tensors[0].ndim, 1); /* still the first writer's file */
    trn_st_close(&f);
}

static void test_open_errors(void **state)
{
    (void)state;
    struct trn_st_file f;
    char path[512], err[512];
    path_in_tmp(path, sizeof(path), "missing.safetensors");
    assert_int_equal(trn_st_open(path, &f, err, sizeof(err)), -ENOENT);
    assert_non_null(strstr(err, "missing.safetensors"));
    assert_int_equal(trn_st_open(tmpdir, &f, err, sizeof(err)), CDDP_ECORRUPT);
    assert_non_null(strstr(err, "not a regular file"));
    path_in_tmp(path, sizeof(path), "text.safetensors");
    write_bytes(path, "hello, world, this is not safetensors", 37);
    assert_int_equal(trn_st_open(path, &f, err, sizeof(err)), CDDP_ETOOBIG);
    assert_non_null(strstr(err, "not a safetensors file?"));
    save_fill(path, 1.0f, 4);
    char dir[600];
    snprintf(dir, sizeof(dir), "%s/nodir/x.safetensors", tmpdir);
    float x = 1;
    struct trn_st_tensor t = {.name = "w", .dtype = TRN_ST_F32, .ndim = 0, .data = &x};
    assert_int_equal(trn_st_save(dir, &t, 1, NULL, 0, err, sizeof(err)), -ENOENT);
    assert_non_null(strstr(err, "nodir"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_exact_header),
        cmocka_unit_test(test_decode_rejects),
        cmocka_unit_test(test_decode_accepts),
        cmocka_unit_test(test_prefix_checks),
        cmocka_unit_test(test_every_truncation_fails),
        cmocka_unit_test(test_read_after_shrink),
        cmocka_unit_test(test_writer_rejects),
        cmocka_unit_test(test_killed_writer_leaves_old_file),
        cmocka_unit_test(test_concurrent_writer_refused),
        cmocka_unit_test(test_open_errors),
    };
    return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
