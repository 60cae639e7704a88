/* Unit tests for trainer/data/: dataset specs, synthetic (determinism,
 * distribution, threads), idx (values, gzip, splits, every malformed file
 * named), folder (order, labels, splits, corrupt and unsupported images). The
 * fixtures are written here: IDX bytes by hand, JPEGs with libjpeg-turbo.
 * Bit-exact agreement with torchvision's preprocessing is
 * tests/compat/test_datasets_torchvision.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>
#include <zlib.h>

#include "common/errors.h"
#include "trainer/data/dataset.h"
#include "trainer/data/idx.h"

static char tmpdir[256];
static char err[1024];

static int setup_dir(void **state)
{
    (void)state;
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(tmpdir, sizeof(tmpdir), "%s/cddp-ds-XXXXXX", base);
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_dir(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void mkdirs(const char *rel)
{
    char p[1024];
    snprintf(p, sizeof(p), "%s/%s", tmpdir, rel);
    for (char *s = p + strlen(tmpdir) + 1; *s; s++) {
        if (*s == '/') {
            *s = '\0';
            mkdir(p, 0755);
            *s = '/';
        }
    }
    mkdir(p, 0755);
}

static void write_file(const char *rel, const void *p, size_t n)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, rel);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

static void write_gz(const char *rel, const void *p, size_t n)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, rel);
    gzFile g = gzopen(path, "wb");
    assert_non_null(g);
    assert_int_equal(gzwrite(g, p, (unsigned)n), (int)n);
    assert_int_equal(gzclose(g), Z_OK);
}

static size_t read_back(const char *rel, uint8_t *buf, size_t cap)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, rel);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

static const char *in_tmp(const char *rel)
{
    static char p[400];
    snprintf(p, sizeof(p), "%s/%s", tmpdir, rel);
    return p;
}

/* An IDX image file: n images of h x w with pixel (i, y, x) = (i*31 + y*7 + x) % 256. */
static size_t idx_images(uint8_t *b, uint32_t n, uint32_t h, uint32_t w)
{
    uint8_t hdr[16] = {0, 0, 8, 3};
    uint32_t d[3] = {n, h, w};
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++)
            hdr[4 + 4 * i + k] = (uint8_t)(d[i] >> (24 - 8 * k));
    memcpy(b, hdr, 16);
    size_t o = 16;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t y = 0; y < h; y++)
            for (uint32_t x = 0; x < w; x++)
                b[o++] = (uint8_t)((i * 31 + y * 7 + x) % 256);
    return o;
}

static size_t idx_labels(uint8_t *b, uint32_t n, const uint8_t *labels)
{
    uint8_t hdr[8] = {0,         0, 8, 1, (uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8),
                      (uint8_t)n};
    memcpy(b, hdr, 8);
    memcpy(b + 8, labels, n);
    return 8 + n;
}

static void test_spec_errors(void **state)
{
    (void)state;
    struct trn_dataset *d;
    struct trn_dataset_opts o = {0};
    assert_int_equal(trn_dataset_open("imagenet", &o, &d, err, sizeof(err)), CDDP_ECONFIG);
    assert_non_null(strstr(err, "unknown dataset"));
    assert_int_equal(trn_dataset_open("idx:", &o, &d, err, sizeof(err)), CDDP_ECONFIG);
    assert_int_equal(trn_dataset_open("folder:", &o, &d, err, sizeof(err)), CDDP_ECONFIG);
    assert_null(d);
}

static void test_synthetic(void **state)
{
    (void)state;
    struct trn_dataset *d, *t;
    struct trn_dataset_opts o = {
        .seed = 42, .num_samples = 500, .image_size = 16, .num_classes = 10};
    assert_int_equal(trn_dataset_open("synthetic", &o, &d, err, sizeof(err)), 0);
    o.split = TRN_SPLIT_TEST;
    assert_int_equal(trn_dataset_open("synthetic", &o, &t, err, sizeof(err)), 0);
    assert_int_equal(d->len, 500);
    assert_int_equal(d->channels, 3);
    assert_int_equal(d->height, 16);
    assert_int_equal(d->num_classes, 10);
    size_t per = trn_dataset_sample_size(d);
    float *a = malloc(per * sizeof(float)), *b = malloc(per * sizeof(float));
    int32_t la, lb;
    int counts[10] = {0};
    double sum = 0, sq = 0;
    for (size_t i = 0; i < d->len; i++) {
        assert_int_equal(trn_dataset_get(d, i, a, &la, err, sizeof(err)), 0);
        assert_true(la >= 0 && la < 10);
        counts[la]++;
        for (size_t k = 0; k < per; k++)
            sum += a[k], sq += (double)a[k] * a[k];
    }
    double n = (double)(d->len * per), mean = sum / n, sd = sqrt(sq / n - mean * mean);
    assert_true(fabs(mean) < 0.01); /* 384,000 draws: the standard error is 0.0016 */
    assert_true(fabs(sd - 1.0) < 0.01);
    for (int c = 0; c < 10; c++)
        assert_true(counts[c] > 20 && counts[c] < 80); /* about 50 each */

    /* The same sample twice, in any order; another index or split differs. */
    assert_int_equal(trn_dataset_get(d, 7, a, &la, err, sizeof(err)), 0);
    assert_int_equal(trn_dataset_get(d, 3, b, &lb, err, sizeof(err)), 0);
    assert_memory_not_equal(a, b, per * sizeof(float));
    assert_int_equal(trn_dataset_get(d, 7, b, &lb, err, sizeof(err)), 0);
    assert_memory_equal(a, b, per * sizeof(float));
    assert_int_equal(la, lb);
    assert_int_equal(trn_dataset_get(t, 7, b, &lb, err, sizeof(err)), 0);
    assert_memory_not_equal(a, b, per * sizeof(float));

    /* The images do not depend on the number of classes (its own stream). */
    struct trn_dataset *d2;
    o.split = TRN_SPLIT_TRAIN;
    o.num_classes = 3;
    assert_int_equal(trn_dataset_open("synthetic", &o, &d2, err, sizeof(err)), 0);
    assert_int_equal(trn_dataset_get(d2, 7, b, &lb, err, sizeof(err)), 0);
    assert_memory_equal(a, b, per * sizeof(float));
    free(a);
    free(b);
    trn_dataset_close(d);
    trn_dataset_close(t);
    trn_dataset_close(d2);

    struct trn_dataset_opts bad = {.image_size = -1};
    assert_int_equal(trn_dataset_open("synthetic", &bad, &d, err, sizeof(err)), CDDP_ECONFIG);
}

struct worker {
    const struct trn_dataset *d;
    size_t from, to;
    float *out;
    int32_t *labels;
    int rc;
};

static void *work(void *arg)
{
    struct worker *w = arg;
    char e[256];
    size_t per = trn_dataset_sample_size(w->d);
    for (size_t i = w->from; i < w->to && w->rc == 0; i++)
        w->rc = trn_dataset_get(w->d, i, w->out + i * per, &w->labels[i], e, sizeof(e));
    return NULL;
}

/* Four threads filling one batch give what one thread gives (run under TSan/ASan too). */
static void check_threads(const struct trn_dataset *d, size_t n)
{
    size_t per = trn_dataset_sample_size(d);
    float *one = malloc(n * per * sizeof(float)), *four = malloc(n * per * sizeof(float));
    int32_t *l1 = malloc(n * sizeof(int32_t)), *l4 = malloc(n * sizeof(int32_t));
    uint32_t *idx = malloc(n * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++)
        idx[i] = (uint32_t)i;
    assert_int_equal(trn_dataset_get_batch(d, idx, n, one, l1, err, sizeof(err)), 0);
    pthread_t th[4];
    struct worker w[4];
    for (int k = 0; k < 4; k++) {
        w[k] = (struct worker){d, n * (size_t)k / 4, n * (size_t)(k + 1) / 4, four, l4, 0};
        assert_int_equal(pthread_create(&th[k], NULL, work, &w[k]), 0);
    }
    for (int k = 0; k < 4; k++) {
        pthread_join(th[k], NULL);
        assert_int_equal(w[k].rc, 0);
    }
    assert_memory_equal(one, four, n * per * sizeof(float));
    assert_memory_equal(l1, l4, n * sizeof(int32_t));
    free(one);
    free(four);
    free(l1);
    free(l4);
    free(idx);
}

static void test_synthetic_threads(void **state)
{
    (void)state;
    struct trn_dataset *d;
    struct trn_dataset_opts o = {.seed = 1, .num_samples = 64, .image_size = 8};
    assert_int_equal(trn_dataset_open("synthetic", &o, &d, err, sizeof(err)), 0);
    check_threads(d, 64);
    trn_dataset_close(d);
}

static void make_idx_dir(const char *dir, bool gz)
{
    static uint8_t img[16 + 5 * 4 * 3], lab[8 + 5], lab4[8 + 4];
    static const uint8_t labels[5] = {3, 0, 7, 3, 1};
    mkdirs(dir);
    size_t ni = idx_images(img, 5, 4, 3), nl = idx_labels(lab, 5, labels);
    size_t nl4 = idx_labels(lab4, 4, labels);
    char p[512];
    const char *prefixes[2] = {"train", "t10k"};
    for (int s = 0; s < 2; s++) {
        snprintf(p, sizeof(p), "%s/%s-images-idx3-ubyte%s", dir, prefixes[s], gz ? ".gz" : "");
        (gz ? write_gz : write_file)(p, img, ni);
        snprintf(p, sizeof(p), "%s/%s-labels-idx1-ubyte%s", dir, prefixes[s], gz ? ".gz" : "");
        (gz ? write_gz : write_file)(p, s == 0 ? lab : lab4, s == 0 ? nl : nl4); /* t10k: 4 */
    }
}

static void test_idx_values(void **state)
{
    (void)state;
    char spec[512];
    make_idx_dir("idx-plain", false);
    make_idx_dir("idx-gz", true);
    struct trn_dataset *p, *g;
    struct trn_dataset_opts o = {0};
    snprintf(spec, sizeof(spec), "idx:%s", in_tmp("idx-plain"));
    assert_int_equal(trn_dataset_open(spec, &o, &p, err, sizeof(err)), 0);
    snprintf(spec, sizeof(spec), "idx:%s", in_tmp("idx-gz"));
    assert_int_equal(trn_dataset_open(spec, &o, &g, err, sizeof(err)), 0);
    assert_int_equal(p->len, 5);
    assert_int_equal(p->channels, 3);
    assert_int_equal(p->height, 4); /* rows, then columns: non-square on purpose */
    assert_int_equal(p->width, 3);
    assert_int_equal(p->num_classes, 8); /* 1 + the largest label */
    float a[3 * 4 * 3], b[3 * 4 * 3];
    int32_t la, lb;
    for (size_t i = 0; i < 5; i++) {
        assert_int_equal(trn_dataset_get(p, i, a, &la, err, sizeof(err)), 0);
        assert_int_equal(trn_dataset_get(g, i, b, &lb, err, sizeof(err)), 0);
        assert_memory_equal(a, b, sizeof(a));
        assert_int_equal(la, lb);
        for (int y = 0; y < 4; y++) {
            for (int x = 0; x < 3; x++) {
                float v = (float)((i * 31 + (size_t)y * 7 + (size_t)x) % 256) / 255.0f;
                v = (v - 0.2860f) / 0.3530f;
                for (int c = 0; c < 3; c++)
                    assert_true(a[c * 12 + y * 3 + x] == v);
            }
        }
    }
    assert_int_equal(la, 1);
    trn_dataset_close(p);
    trn_dataset_close(g);

    o.limit = 2;
    assert_int_equal(trn_dataset_open(spec, &o, &g, err, sizeof(err)), 0);
    assert_int_equal(g->len, 2);
    assert_int_equal(g->num_classes, 8); /* from the whole file, not the first 2 */
    trn_dataset_close(g);
    o.limit = 99; /* more than there are: all of them */
    assert_int_equal(trn_dataset_open(spec, &o, &g, err, sizeof(err)), 0);
    assert_int_equal(g->len, 5);
    trn_dataset_close(g);

    /* The test split reads t10k-*, whose labels file is one short here. */
    o.limit = 0;
    o.split = TRN_SPLIT_TEST;
    assert_int_equal(trn_dataset_open(spec, &o, &g, err, sizeof(err)), CDDP_EMISMATCH);
    assert_non_null(strstr(err, "t10k-images-idx3-ubyte.gz holds 5 images"));
    assert_non_null(strstr(err, "holds 4 labels"));
}

/* Each broken file: open fails with the file's name and the problem. */
static void test_idx_errors(void **state)
{
    (void)state;
    static uint8_t img[16 + 5 * 4 * 3], lab[8 + 5], buf[4096];
    static const uint8_t labels[5] = {1, 2, 3, 4, 5};
    size_t ni = idx_images(img, 5, 4, 3), nl = idx_labels(lab, 5, labels);
    struct trn_dataset *d;
    struct trn_dataset_opts o = {0};
    char spec[512];
    snprintf(spec, sizeof(spec), "idx:%s", in_tmp("bad"));

    assert_int_equal(trn_dataset_open(spec, &o, &d, err, sizeof(err)), CDDP_ENOTFOUND);
    assert_non_null(strstr(err, "bad: no such directory"));
    mkdirs("bad");
    assert_int_equal(trn_dataset_open(spec, &o, &d, err, sizeof(err)), CDDP_ENOTFOUND);
    assert_non_null(strstr(err, "train-images-idx3-ubyte[.gz]: no such file"));
    write_file("bad/train-images-idx3-ubyte", img, ni);
    assert_int_equal(trn_dataset_open(spec, &o, &d, err, sizeof(err)), CDDP_ENOTFOUND);
    assert_non_null(strstr(err, "train-labels-idx1-ubyte[.gz]: no such file"));
    write_file("bad/train-labels-idx1-ubyte", lab, nl);
    assert_int_equal(trn_dataset_open(spec, &o, &d, err, sizeof(err)), 0);
    trn_dataset_close(d);

    struct {
        size_t len;
        size_t at;
        uint8_t byte; /* written at `at` unless len is short */
        int code;
        const char *msg;
    } cases[] = {
        {ni - 1, 0, 0, CDDP_EIO_SHORT, "truncated: the header declares 5 items of 12 bytes"},
        {10, 0, 0, CDDP_EIO_SHORT, "shorter than the 16-byte IDX header"},
        {2, 0, 0, CDDP_EIO_SHORT, "shorter than the 4-byte IDX magic"},
        {ni, 0, 1, CDDP_ECORRUPT, "not an IDX file"},
        {ni, 2, 0x0D, CDDP_ECORRUPT, "element type 0x0d is not supported"},
        {ni, 3, 2, CDDP_ECORRUPT, "has 2 dimensions, expected 3"},
        {ni, 11, 0, CDDP_ECORRUPT, "dimension 1 is 0"},
        {ni + 3, 0, 0, CDDP_ECORRUPT, "3 unexpected bytes after the 5 items"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memcpy(buf, img, ni);
        memset(buf + ni, 0, 8);
        if (cases[i].len >= ni)
            buf[cases[i].at] = cases[i].byte;
        write_file("bad/train-images-idx3-ubyte", buf, cases[i].len);
        int rc = trn_dataset_open(spec, &o, &d, err, sizeof(err));
        if (rc != cases[i].code || !strstr(err, cases[i].msg) ||
            !strstr(err, "bad/train-images-idx3-ubyte"))
            fail_msg("case %zu: rc %d err '%s'", i, rc, err);
    }
    write_file("bad/train-images-idx3-ubyte", img, ni);

    /* gzip: cut short, and a flipped byte in the compressed stream. */
    unlink(in_tmp("bad/train-labels-idx1-ubyte"));
    write_gz("bad/train-labels-idx1-ubyte.gz", lab, nl);
    size_t gl = read_back("bad/train-labels-idx1-ubyte.gz", buf, sizeof(buf));
    write_file("bad/train-labels-idx1-ubyte.gz", buf, gl - 6);
    assert_int_equal(trn_dataset_open(spec, &o, &d, err, sizeof(err)), CDDP_EIO_SHORT);
    assert_non_null(strstr(err, "train-labels-idx1-ubyte.gz: truncated gzip data"));
    buf[gl - 5] ^= 0xFF; /* inside the CRC-32 of the uncompressed data */
    write_file("bad/train-labels-idx1-ubyte.gz", buf, gl);
    assert_int_equal(trn_dataset_open(spec, &o, &d, err, sizeof(err)), CDDP_ECORRUPT);
    assert_non_null(strstr(err, "train-labels-idx1-ubyte.gz: corrupt gzip data"));
}

static void test_idx_decode(void **state)
{
    (void)state;
    struct trn_idx_array a;
    uint8_t one[9] = {0, 0, 8, 1, 0, 0, 0, 1, 42};
    assert_int_equal(trn_idx_decode(one, 9, 1, &a, err, sizeof(err)), 0);
    assert_int_equal(a.count, 1);
    assert_int_equal(a.item, 1);
    assert_int_equal(a.data[0], 42);
    uint8_t empty[8] = {0, 0, 8, 1, 0, 0, 0, 0};
    assert_int_equal(trn_idx_decode(empty, 8, 1, &a, err, sizeof(err)), 0);
    assert_int_equal(a.count, 0);
    /* 0xFFFFFFFF items of 0xFFFFFFFF x 0xFFFFFFFF bytes: refused without overflow */
    uint8_t huge[16] = {0, 0, 8, 3, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255};
    assert_int_equal(trn_idx_decode(huge, 16, 3, &a, err, sizeof(err)), CDDP_EIO_SHORT);
}

static void jpeg(const char *rel, int w, int h, int subsamp, int gray, uint8_t seed)
{
    uint8_t *px = malloc((size_t)w * (size_t)h * 3);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++)
                px[(y * w + x) * 3 + c] = (uint8_t)(seed + x * 5 + y * 3 + c * 60);
    tjhandle tj = tjInitCompress();
    unsigned char *out = NULL;
    unsigned long len = 0;
    assert_int_equal(
        tjCompress2(tj, px, w, 0, h, TJPF_RGB, &out, &len, gray ? TJSAMP_GRAY : subsamp, 90, 0), 0);
    write_file(rel, out, len);
    tjFree(out);
    tjDestroy(tj);
    free(px);
}

static void test_folder(void **state)
{
    (void)state;
    mkdirs("f/zebra/deeper");
    mkdirs("f/apple");
    mkdirs("f/mid");
    jpeg("f/zebra/b.jpg", 40, 30, TJSAMP_420, 0, 1);
    jpeg("f/zebra/A.JPEG", 30, 40, TJSAMP_444, 0, 2);
    jpeg("f/zebra/deeper/a.jpg", 16, 16, TJSAMP_420, 1, 3);
    jpeg("f/apple/x.jpeg", 64, 20, TJSAMP_422, 0, 4);
    jpeg("f/mid/q.jpg", 9, 11, TJSAMP_420, 0, 5);
    write_file("f/mid/readme.txt", "hi", 2);
    char spec[512];
    snprintf(spec, sizeof(spec), "folder:%s", in_tmp("f"));
    struct trn_dataset *d;
    struct trn_dataset_opts o = {.image_size = 8};
    assert_int_equal(trn_dataset_open(spec, &o, &d, err, sizeof(err)), 0);
    assert_int_equal(d->len, 5);
    assert_int_equal(d->num_classes, 3);
    assert_int_equal(d->height, 8);
    assert_int_equal(d->width, 8);
    /* apple (0): x; mid (1): q; zebra (2): A.JPEG, b.jpg, then deeper/a.jpg */
    int32_t want[5] = {0, 1, 2, 2, 2};
    float x[3 * 8 * 8];
    for (size_t i = 0; i < 5; i++) {
        int32_t l;
        assert_int_equal(trn_dataset_get(d, i, x, &l, err, sizeof(err)), 0);
        assert_int_equal(l, want[i]);
        for (size_t k = 0; k < sizeof(x) / sizeof(x[0]); k++)
            assert_true(x[k] >= -2.2f && x[k] <= 2.7f); /* ImageNet-normalised [0, 1] */
    }
    /* The grayscale image gives three equal channels before normalisation. */
    int32_t l;
    assert_int_equal(trn_dataset_get(d, 4, x, &l, err, sizeof(err)), 0);
    float r = x[5] * 0.229f + 0.485f, g = x[64 + 5] * 0.224f + 0.456f;
    assert_true(fabsf(r - g) < 1e-5f);
    check_threads(d, 5);
    trn_dataset_close(d);

    o.limit = 2;
    assert_int_equal(trn_dataset_open(spec, &o, &d, err, sizeof(err)), 0);
    assert_int_equal(d->len, 2);
    trn_dataset_close(d);
    o.limit = 0;

    /* No train/ + val/: no test split. */
    o.split = TRN_SPLIT_TEST;
    assert_int_equal(trn_dataset_open(spec, &o, &d, err, sizeof(err)), CDDP_ENOTFOUND);
    assert_non_null(strstr(err, "no test split"));
    o.split = TRN_SPLIT_TRAIN;

    /* A corrupt image fails when read, naming the file; the others still read. */
    write_file("f/mid/q.jpg", "\xff\xd8\xff\xe0 this is not really a jpeg", 31);
    assert_int_equal(trn_dataset_open(spec, &o, &d, err, sizeof(err)), 0);
    assert_int_equal(trn_dataset_get(d, 1, x, &l, err, sizeof(err)), CDDP_ECORRUPT);
    if (!strstr(err, "f/mid/q.jpg: corrupt"))
        fail_msg("%s", err);
    /* (a header without a frame: libjpeg-turbo sets no size; the message is
     * the same every time, not one read from uninitialised memory) */
    if (!strstr(err, "no image size in its header"))
        fail_msg("%s", err);
    assert_int_equal(trn_dataset_get(d, 0, x, &l, err, sizeof(err)), 0);
    /* A truncated one too (libjpeg-turbo only warns: we stop, as PIL raises). */
    uint8_t buf[8192];
    size_t n = read_back("f/zebra/b.jpg", buf, sizeof(buf));
    write_file("f/mid/q.jpg", buf, n / 2);
    assert_int_equal(trn_dataset_get(d, 1, x, &l, err, sizeof(err)), CDDP_ECORRUPT);
    assert_non_null(strstr(err, "f/mid/q.jpg: corrupt JPEG"));
    trn_dataset_close(d);

    /* A PNG among the JPEGs is refused at open; an empty class too. */
    write_file("f/mid/p.png", "\x89PNG", 4);
    assert_int_equal(trn_dataset_open(spec, &o, &d, err, sizeof(err)), CDDP_ECONFIG);
    assert_non_null(strstr(err, "f/mid/p.png: only JPEG images are supported"));
    unlink(in_tmp("f/mid/p.png"));
    mkdirs("f/empty");
    assert_int_equal(trn_dataset_open(spec, &o, &d, err, sizeof(err)), CDDP_ENOTFOUND);
    assert_non_null(strstr(err, "f/empty has no JPEG images"));
    snprintf(spec, sizeof(spec), "folder:%s", in_tmp("nowhere"));
    assert_int_equal(trn_dataset_open(spec, &o, &d, err, sizeof(err)), CDDP_ENOTFOUND);
    assert_non_null(strstr(err, "nowhere: no such directory"));
}

static void test_folder_splits(void **state)
{
    (void)state;
    mkdirs("s/train/a");
    mkdirs("s/train/b");
    mkdirs("s/val/a");
    mkdirs("s/val/b");
    jpeg("s/train/a/1.jpg", 12, 12, TJSAMP_420, 0, 1);
    jpeg("s/train/b/1.jpg", 12, 12, TJSAMP_420, 0, 2);
    jpeg("s/train/b/2.jpg", 12, 12, TJSAMP_420, 0, 3);
    jpeg("s/val/a/1.jpg", 12, 12, TJSAMP_420, 0, 4);
    jpeg("s/val/b/1.jpg", 12, 12, TJSAMP_420, 0, 5);
    char spec[512];
    snprintf(spec, sizeof(spec), "folder:%s", in_tmp("s"));
    struct trn_dataset *tr, *te;
    struct trn_dataset_opts o = {.image_size = 4};
    assert_int_equal(trn_dataset_open(spec, &o, &tr, err, sizeof(err)), 0);
    o.split = TRN_SPLIT_TEST;
    assert_int_equal(trn_dataset_open(spec, &o, &te, err, sizeof(err)), 0);
    assert_int_equal(tr->len, 3);
    assert_int_equal(te->len, 2);
    assert_int_equal(tr->num_classes, 2);
    assert_int_equal(te->num_classes, 2);
    trn_dataset_close(tr);
    trn_dataset_close(te);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_errors),
        cmocka_unit_test(test_synthetic),
        cmocka_unit_test(test_synthetic_threads),
        cmocka_unit_test(test_idx_values),
        cmocka_unit_test(test_idx_errors),
        cmocka_unit_test(test_idx_decode),
        cmocka_unit_test(test_folder),
        cmocka_unit_test(test_folder_splits),
    };
    return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
