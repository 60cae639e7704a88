/* Unit tests for trainer/checkpoint.c: round trip of tensors and metadata;
 * every kind of mismatch and damage refused with its message while the file
 * stays byte for byte as it was; a writer SIGKILLed at random moments never
 * leaves a checkpoint that fails to load or mixes two versions; weight files
 * (--init/--save) with conversions and PyTorch's missing-counter rule. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/errors.h"
#include "trainer/checkpoint.h"
#include "trainer/data/sampler.h"

static char tmpdir[256];
static char err[2048];

static int setup_dir(void **state)
{
    (void)state;
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(tmpdir, sizeof(tmpdir), "%s/cddp-ckpt-XXXXXX", base);
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_dir(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *in_tmp(const char *name)
{
    static char p[8][400]; /* a ring: each test uses fewer than 8 paths */
    static int k;
    k = (k + 1) % 8;
    snprintf(p[k], sizeof(p[k]), "%s/%s", tmpdir, name);
    return p[k];
}

/* A miniature ResNet state_dict: conv1, bn1 (5 entries), fc with K classes. */
struct model {
    float conv[4 * 3 * 3 * 3], bnw[4], bnb[4], rm[4], rv[4], fcw[3 * 4], fcb[3];
    int64_t nbt;
    float mconv[4 * 3 * 3 * 3], mbnw[4], mbnb[4], mfcw[3 * 4], mfcb[3];
    struct trn_ckpt_tensor t[8], m[5];
    size_t nt, nm;
};

static void model_init(struct model *x, int classes, float v)
{
    memset(x, 0, sizeof(*x));
    float *arrays[] = {x->conv, x->bnw,   x->bnb,  x->rm,   x->rv,   x->fcw,
                       x->fcb,  x->mconv, x->mbnw, x->mbnb, x->mfcw, x->mfcb};
    size_t sizes[] = {108, 4, 4, 4, 4, 12, 3, 108, 4, 4, 12, 3};
    for (size_t a = 0; a < 12; a++)
        for (size_t i = 0; i < sizes[a]; i++)
            arrays[a][i] = v + (float)a + (float)i * 0.25f;
    x->nbt = (int64_t)v * 1000 + 7;
    struct trn_ckpt_tensor t[] = {
        {"conv1.weight", TRN_ST_F32, 4, {4, 3, 3, 3}, x->conv},
        {"bn1.weight", TRN_ST_F32, 1, {4}, x->bnw},
        {"bn1.bias", TRN_ST_F32, 1, {4}, x->bnb},
        {"bn1.running_mean", TRN_ST_F32, 1, {4}, x->rm},
        {"bn1.running_var", TRN_ST_F32, 1, {4}, x->rv},
        {"bn1.num_batches_tracked", TRN_ST_I64, 0, {0}, &x->nbt},
        {"fc.weight", TRN_ST_F32, 2, {classes, 4}, x->fcw},
        {"fc.bias", TRN_ST_F32, 1, {classes}, x->fcb},
    };
    struct trn_ckpt_tensor m[] = {
        {"conv1.weight", TRN_ST_F32, 4, {4, 3, 3, 3}, x->mconv},
        {"bn1.weight", TRN_ST_F32, 1, {4}, x->mbnw},
        {"bn1.bias", TRN_ST_F32, 1, {4}, x->mbnb},
        {"fc.weight", TRN_ST_F32, 2, {classes, 4}, x->mfcw},
        {"fc.bias", TRN_ST_F32, 1, {classes}, x->mfcb},
    };
    memcpy(x->t, t, sizeof(t));
    memcpy(x->m, m, sizeof(m));
    x->nt = 8;
    x->nm = 5;
}

/* Compares the tensors' contents (the pointers differ). */
static bool same_values(const struct model *a, const struct model *b)
{
    return memcmp(a->conv, b->conv, offsetof(struct model, t) - offsetof(struct model, conv)) == 0;
}

static struct trn_ckpt_meta sample_meta(long step)
{
    struct trn_ckpt_meta m = {
        .arch = "resnet18",
        .num_classes = 3,
        .seed = UINT64_MAX,
        .epoch = 2,
        .step = step,
        .epoch_offset = 384,
        .world_size = 4,
        .batch_size = 32,
        .dataset_len = 60000,
        .shuffle = true,
        .optimizer_steps = step,
        .lr = 0.1 / 3,
        .momentum = 0.9,
        .weight_decay = 1e-4,
        .lr_schedule = "cosine",
        .lr_total_steps = 4096,
    };
    return m;
}

static size_t slurp(const char *path, uint8_t **out)
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

static void spit(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

static int load(const char *path, struct model *x, const char *arch, struct trn_ckpt_meta *m)
{
    return trn_ckpt_load(path, arch, x->t, x->nt, x->m, x->nm, m, err, sizeof(err));
}

static void test_round_trip(void **state)
{
    (void)state;
    static struct model a, b;
    model_init(&a, 3, 1.0f);
    model_init(&b, 3, 50.0f);
    struct trn_ckpt_meta m = sample_meta(123), got;
    const char *path = in_tmp("rt.safetensors");
    assert_int_equal(trn_ckpt_save(path, a.t, a.nt, a.m, a.nm, &m, err, sizeof(err)), 0);
    assert_false(same_values(&a, &b));
    int rc = load(path, &b, "resnet18", &got);
    if (rc)
        fail_msg("%s", err);
    assert_true(same_values(&a, &b));
    assert_int_equal(b.nbt, 1007);
    assert_string_equal(got.arch, "resnet18");
    assert_int_equal(got.num_classes, 3);
    assert_true(got.seed == UINT64_MAX);
    assert_int_equal(got.epoch, 2);
    assert_int_equal(got.step, 123);
    assert_int_equal(got.epoch_offset, 384);
    assert_int_equal(got.world_size, 4);
    assert_int_equal(got.batch_size, 32);
    assert_int_equal(got.dataset_len, 60000);
    assert_true(got.shuffle && !got.drop_last);
    assert_int_equal(got.optimizer_steps, 123);
    assert_true(got.lr == m.lr); /* %.17g round-trips doubles exactly */
    assert_true(got.momentum == 0.9 && got.weight_decay == 1e-4);
    assert_string_equal(got.lr_schedule, "cosine");
    assert_int_equal(got.lr_total_steps, 4096);

    /* Torchvision's layout: the state_dict keys first, in order, F32 and I64
     * scalars; then the momentum buffers under their prefix. */
    struct trn_st_file f;
    assert_int_equal(trn_st_open(path, &f, err, sizeof(err)), 0);
    assert_int_equal(f.n_tensors, 13);
    assert_string_equal(f.tensors[0].name, "conv1.weight");
    assert_string_equal(f.tensors[5].name, "bn1.num_batches_tracked");
    assert_int_equal(f.tensors[5].dtype, TRN_ST_I64);
    assert_int_equal(f.tensors[5].ndim, 0);
    assert_string_equal(f.tensors[8].name, "optimizer.momentum_buffer.conv1.weight");
    assert_string_equal(trn_st_meta_get(&f, "format"), "pt");
    assert_string_equal(trn_st_meta_get(&f, "cddp.checkpoint"), "1");
    trn_st_close(&f);

    assert_int_equal(load(in_tmp("none.safetensors"), &b, "resnet18", &got), CDDP_ENOTFOUND);
}

/* Loads that must fail, each leaving the file byte for byte as it was. */
static void expect_refused(const char *path, struct model *x, const char *arch, int code,
                           const char *msg)
{
    uint8_t *before, *after;
    size_t nb = slurp(path, &before);
    struct trn_ckpt_meta m;
    int rc = load(path, x, arch, &m);
    if (rc != code || strstr(err, msg) == NULL || strstr(err, path) == NULL ||
        strchr(err, '\n') != NULL)
        fail_msg("rc %d err '%s'; want %d '%s'", rc, err, code, msg);
    size_t na = slurp(path, &after);
    assert_int_equal(na, nb);
    assert_memory_equal(before, after, nb);
    free(before);
    free(after);
}

/* The image with one byte of its header changed at `at` bytes into the
 * first `needle` is written to `path` (the image itself is left as it was),
 * and refused as expect_refused() says. */
static void edit_refused(const char *path, uint8_t *img, size_t n, const char *needle, size_t at,
                         char c, struct model *x, int code, const char *msg)
{
    char *p = strstr((char *)img + 8, needle);
    assert_non_null(p);
    char was = p[at];
    p[at] = c;
    spit(path, img, n);
    p[at] = was;
    expect_refused(path, x, "resnet18", code, msg);
}

static void test_mismatches(void **state)
{
    (void)state;
    static struct model a, b;
    model_init(&a, 3, 1.0f);
    struct trn_ckpt_meta m = sample_meta(5);
    const char *path = in_tmp("mm.safetensors");
    assert_int_equal(trn_ckpt_save(path, a.t, a.nt, a.m, a.nm, &m, err, sizeof(err)), 0);

    model_init(&b, 3, 0.0f);
    expect_refused(path, &b, "resnet50", CDDP_EMISMATCH,
                   "checkpoint of resnet18, but this run trains resnet50");
    model_init(&b, 5, 0.0f); /* another number of classes */
    expect_refused(path, &b, "resnet18", CDDP_EMISMATCH,
                   "fc.weight is F32 [3, 4] in the file, F32 [5, 4] in the model");
    model_init(&b, 3, 0.0f);
    b.nt = 7; /* the model has no fc.bias: the file's is unexpected */
    expect_refused(path, &b, "resnet18", CDDP_EMISMATCH, "unexpected keys: \"fc.bias\"");
    model_init(&b, 3, 0.0f);
    b.t[2].name = "bn1.shift"; /* a key the file lacks, and one it has in excess */
    expect_refused(path, &b, "resnet18", CDDP_EMISMATCH,
                   "missing keys: \"bn1.shift\"; unexpected keys: \"bn1.bias\"");
    model_init(&b, 3, 0.0f);
    b.nm = 4; /* momentum for fc.bias in the file only */
    expect_refused(path, &b, "resnet18", CDDP_EMISMATCH,
                   "unexpected keys: \"optimizer.momentum_buffer.fc.bias\"");
    model_init(&b, 3, 0.0f);
    b.t[5].dtype = TRN_ST_F32; /* a dtype the checkpoint does not have */
    expect_refused(path, &b, "resnet18", CDDP_EMISMATCH, "bn1.num_batches_tracked is I64 []");

    /* A weights file is not a checkpoint. */
    const char *wpath = in_tmp("weights.safetensors");
    assert_int_equal(trn_weights_save(wpath, "resnet18", 3, a.t, a.nt, err, sizeof(err)), 0);
    model_init(&b, 3, 0.0f);
    expect_refused(wpath, &b, "resnet18", CDDP_ECORRUPT, "not a cddp-train checkpoint");
}

/* Damage: every truncation, a flipped bit in the data, a bad header byte,
 * metadata edited by hand. */
static void test_damage(void **state)
{
    (void)state;
    static struct model a, b;
    model_init(&a, 3, 1.0f);
    struct trn_ckpt_meta m = sample_meta(5);
    const char *good = in_tmp("good.safetensors"), *bad = in_tmp("bad.safetensors");
    assert_int_equal(trn_ckpt_save(good, a.t, a.nt, a.m, a.nm, &m, err, sizeof(err)), 0);
    uint8_t *img;
    size_t n = slurp(good, &img);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | img[i];

    for (size_t cut = 0; cut < n; cut += (cut < 8 + hlen ? 97 : 13)) {
        spit(bad, img, cut);
        model_init(&b, 3, 0.0f);
        struct trn_ckpt_meta got;
        uint8_t *before, *after;
        size_t nb = slurp(bad, &before);
        int rc = load(bad, &b, "resnet18", &got);
        if (rc == 0)
            fail_msg("a checkpoint cut to %zu of %zu bytes loaded", cut, n);
        assert_non_null(strstr(err, bad));
        assert_int_equal(slurp(bad, &after), nb);
        assert_memory_equal(before, after, nb);
        free(before);
        free(after);
    }

    /* One flipped bit in each tensor's data: the checksum catches it. */
    for (size_t off = 8 + hlen; off < n; off += 61) {
        img[off] ^= 0x10;
        spit(bad, img, n);
        img[off] ^= 0x10;
        model_init(&b, 3, 0.0f);
        expect_refused(bad, &b, "resnet18", CDDP_ECORRUPT, "corrupt: the data's CRC-32");
    }

    /* The header's JSON broken. */
    img[8] = '[';
    spit(bad, img, n);
    img[8] = '{';
    expect_refused(bad, &b, "resnet18", CDDP_ECORRUPT, "does not start with '{'");

    /* Metadata edited: same length, so the file stays valid safetensors. */
    char *hdr = (char *)img + 8;
    edit_refused(bad, img, n, "\"cddp.checkpoint\":\"1\"", 19, '7', &b, CDDP_EMISMATCH,
                 "format version '7'");
    edit_refused(bad, img, n, "\"epoch\":\"2\"", 9, 'x', &b, CDDP_ECORRUPT,
                 "metadata 'epoch' is 'x'");
    edit_refused(bad, img, n, "\"sampler.shuffle\":\"1\"", 19, '2', &b, CDDP_ECORRUPT,
                 "'sampler.shuffle' = 2 is out of range");
    edit_refused(bad, img, n, "\"optimizer.lr_schedule\":\"cosine\"", 25, 'x', &b, CDDP_ECORRUPT,
                 "'optimizer.lr_schedule' is 'xosine'");
    /* Written before --lr-schedule existed (the keys renamed away): constant. */
    char *p = strstr(hdr, "\"optimizer.lr_schedule\"");
    assert_non_null(p);
    char *q = strstr(hdr, "\"optimizer.lr_total_steps\"");
    assert_non_null(q);
    p[21] = 'X'; /* "optimizer.lr_schedulX" */
    q[24] = 'X'; /* "optimizer.lr_total_stepX" */
    spit(bad, img, n);
    p[21] = 'e';
    q[24] = 's';
    model_init(&b, 3, 0.0f);
    struct trn_ckpt_meta old;
    assert_int_equal(load(bad, &b, "resnet18", &old), 0);
    assert_string_equal(old.lr_schedule, "constant");
    assert_int_equal(old.lr_total_steps, 0);
    edit_refused(bad, img, n, "\"data_crc32\":\"", 14, 'z', &b, CDDP_ECORRUPT,
                 "'data_crc32' is missing or malformed");
    free(img);
}

/* A child writes checkpoints in a loop (every tensor filled with the step
 * number) and is SIGKILLed at a random moment after its first checkpoint has
 * landed. Every time, the checkpoint on disk loads and is one whole version:
 * all its values agree with its step, which is from this round. */
static void test_killed_writer(void **state)
{
    (void)state;
    enum { N = 1 << 19, ROUNDS = 12 }; /* 2 MiB tensors: a write takes long enough to be hit */
    char path[400], tmp[410];
    snprintf(path, sizeof(path), "%s", in_tmp("kill.safetensors"));
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    float *w = malloc(N * sizeof(float)), *mw = malloc(N * sizeof(float));
    float *back = malloc(N * sizeof(float)), *mback = malloc(N * sizeof(float));
    struct trn_ckpt_meta m = sample_meta(0), got;
    srand((unsigned)time(NULL));
    int hit_tmp = 0;
    for (int round = 0; round < ROUNDS; round++) {
        int ready[2];
        assert_int_equal(pipe(ready), 0);
        long first = (long)round * 100000;
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(ready[0]);
            for (long step = first;; step++) {
                for (size_t i = 0; i < N; i++)
                    w[i] = (float)step, mw[i] = -(float)step;
                struct trn_ckpt_tensor t = {"fc.weight", TRN_ST_F32, 1, {N}, w};
                struct trn_ckpt_tensor mt = {"fc.weight", TRN_ST_F32, 1, {N}, mw};
                m.step = step;
                if (trn_ckpt_save(path, &t, 1, &mt, 1, &m, err, sizeof(err)) != 0)
                    _exit(3);
                if (step == first && write(ready[1], "x", 1) != 1)
                    _exit(4);
            }
        }
        close(ready[1]);
        struct pollfd pfd = {.fd = ready[0], .events = POLLIN};
        int pr = poll(&pfd, 1, 30000); /* bounded: the first save, even under ASan on a busy box */
        char c;
        bool landed = pr == 1 && read(ready[0], &c, 1) == 1;
        close(ready[0]);
        if (landed) {
            struct timespec ts = {0, (long)(rand() % 25) * 1000000L};
            nanosleep(&ts, NULL);
        }
        kill(pid, SIGKILL);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(landed);
        assert_true(WIFSIGNALED(status)); /* killed, not failed */
        hit_tmp += access(tmp, F_OK) == 0;
        struct trn_ckpt_tensor t = {"fc.weight", TRN_ST_F32, 1, {N}, back};
        struct trn_ckpt_tensor mt = {"fc.weight", TRN_ST_F32, 1, {N}, mback};
        int rc = trn_ckpt_load(path, "resnet18", &t, 1, &mt, 1, &got, err, sizeof(err));
        if (rc)
            fail_msg("round %d: the checkpoint left by a killed writer does not load: %s", round,
                     err);
        assert_true(got.step >= first);
        for (size_t i = 0; i < N; i += 4099)
            assert_true(back[i] == (float)got.step && mback[i] == -(float)got.step);
        assert_true(back[N - 1] == (float)got.step && mback[N - 1] == -(float)got.step);
    }
    print_message("killed writer: %d of %d kills left a half-written temporary file\n", hit_tmp,
                  ROUNDS);
    free(w);
    free(mw);
    free(back);
    free(mback);
}

static void test_weights(void **state)
{
    (void)state;
    static struct model a, b;
    model_init(&a, 3, 1.0f);
    const char *path = in_tmp("w.safetensors");
    assert_int_equal(trn_weights_save(path, "resnet18", 3, a.t, a.nt, err, sizeof(err)), 0);
    model_init(&b, 3, 9.0f);
    assert_int_equal(trn_weights_load(path, b.t, b.nt, err, sizeof(err)), 0);
    assert_memory_equal(a.conv, b.conv, sizeof(a.conv));
    assert_memory_equal(a.fcb, b.fcb, sizeof(a.fcb));
    assert_int_equal(b.nbt, a.nbt);

    /* A checkpoint is accepted as weights (its momentum ignored). */
    struct trn_ckpt_meta m = sample_meta(1);
    const char *ck = in_tmp("ck.safetensors");
    assert_int_equal(trn_ckpt_save(ck, a.t, a.nt, a.m, a.nm, &m, err, sizeof(err)), 0);
    model_init(&b, 3, 9.0f);
    assert_int_equal(trn_weights_load(ck, b.t, b.nt, err, sizeof(err)), 0);
    assert_memory_equal(a.fcw, b.fcw, sizeof(a.fcw));

    /* Strict: a model with more classes, or an extra key, is refused. */
    model_init(&b, 5, 0.0f);
    assert_int_equal(trn_weights_load(path, b.t, b.nt, err, sizeof(err)), CDDP_EMISMATCH);
    assert_non_null(strstr(err, "fc.bias is F32 [3] in the file, F32 [5] in the model"));
    model_init(&b, 3, 0.0f);
    b.nt = 6;
    assert_int_equal(trn_weights_load(path, b.t, b.nt, err, sizeof(err)), CDDP_EMISMATCH);
    assert_non_null(strstr(err, "unexpected keys: \"fc.weight\", \"fc.bias\""));

    /* F16 / BF16 / F64 are converted; a state_dict without any counter (from
     * before PyTorch had them) loads with counters 0. */
    uint16_t h[4] = {0x3C00, 0xC000, 0x0001, 0x7BFF};  /* 1, -2, 2^-24, 65504 */
    uint16_t bf[4] = {0x3F80, 0xC040, 0x0000, 0x8000}; /* 1, -3, 0, -0 */
    double d[4] = {0.5, -0.25, 1e-3, 3.0};
    float f32[4] = {1, 2, 3, 4};
    struct trn_st_tensor st[] = {
        {.name = "a", .dtype = TRN_ST_F16, .ndim = 1, .shape = {4}, .data = h},
        {.name = "b", .dtype = TRN_ST_BF16, .ndim = 1, .shape = {4}, .data = bf},
        {.name = "c", .dtype = TRN_ST_F64, .ndim = 1, .shape = {4}, .data = d},
        {.name = "d", .dtype = TRN_ST_F32, .ndim = 1, .shape = {4}, .data = f32},
    };
    const char *conv = in_tmp("conv.safetensors");
    assert_int_equal(trn_st_save(conv, st, 4, NULL, 0, err, sizeof(err)), 0);
    float ga[4], gb[4], gc[4], gd[4];
    int64_t counter = 99;
    struct trn_ckpt_tensor want[] = {
        {"a", TRN_ST_F32, 1, {4}, ga},
        {"b", TRN_ST_F32, 1, {4}, gb},
        {"c", TRN_ST_F32, 1, {4}, gc},
        {"d", TRN_ST_F32, 1, {4}, gd},
        {"bn.num_batches_tracked", TRN_ST_I64, 0, {0}, &counter},
    };
    int rc = trn_weights_load(conv, want, 5, err, sizeof(err));
    if (rc)
        fail_msg("%s", err);
    assert_true(ga[0] == 1.0f && ga[1] == -2.0f && ga[2] == 0x1p-24f && ga[3] == 65504.0f);
    assert_true(gb[0] == 1.0f && gb[1] == -3.0f && gb[2] == 0.0f && gb[3] == 0.0f);
    assert_true(gc[0] == 0.5f && gc[1] == -0.25f && gc[2] == 1e-3f && gc[3] == 3.0f);
    assert_memory_equal(gd, f32, sizeof(f32));
    assert_int_equal(counter, 0);
    /* ... but a model file missing one weight is refused, counters or not. */
    want[4].name = "e";
    assert_int_equal(trn_weights_load(conv, want, 5, err, sizeof(err)), CDDP_EMISMATCH);
    assert_non_null(strstr(err, "missing keys: \"e\""));
}

/* The resume decision over every small configuration: each batch boundary
 * inside an epoch, as written by a run, resumes at exactly that sample of
 * this rank's order; every other position is refused as corrupt; inside an
 * epoch any change of world size, batch size, dataset length, shuffle or
 * drop_last is refused naming it, at an epoch boundary it is accepted (and
 * flagged); another seed is always refused. */
static void test_resume_point(void **state)
{
    (void)state;
    struct trn_ckpt_start st;
    long checked = 0;
    for (int world = 1; world <= 4; world++)
        for (int batch = 1; batch <= 5; batch++)
            for (uint64_t len = (uint64_t)world; len <= 13; len++)
                for (int drop = 0; drop <= 1; drop++) {
                    struct trn_sampler s;
                    assert_int_equal(trn_sampler_init(&s, len, world, world - 1, true, drop, 3), 0);
                    struct trn_ckpt_run run = {.seed = 3,
                                               .world_size = world,
                                               .batch_size = batch,
                                               .dataset_len = len,
                                               .shuffle = true,
                                               .drop_last = drop,
                                               .rank_samples = s.num_samples};
                    struct trn_ckpt_meta m = {.seed = 3,
                                              .epoch = 4,
                                              .world_size = world,
                                              .batch_size = batch,
                                              .dataset_len = len,
                                              .shuffle = true,
                                              .drop_last = drop};
                    /* every position a run writes: b batches into the epoch, summed over ranks */
                    for (uint64_t off = 0; off <= (s.num_samples + 1) * (uint64_t)world; off++) {
                        m.epoch_offset = off;
                        uint64_t per = off / (uint64_t)world;
                        bool boundary = off % (uint64_t)world == 0 && per % (uint64_t)batch == 0 &&
                                        per < s.num_samples;
                        int rc = trn_ckpt_resume_point(&m, &run, &st, err, sizeof(err));
                        if (boundary) {
                            if (rc)
                                fail_msg("w%d b%d len %d off %d: %s", world, batch, (int)len,
                                         (int)off, err);
                            assert_int_equal(st.epoch, 4);
                            assert_int_equal(st.rank_offset, per);
                            assert_false(st.resized);
                        } else {
                            assert_int_equal(rc, CDDP_ECORRUPT);
                            assert_non_null(strstr(err, "not a batch boundary"));
                        }
                        checked++;
                    }
                    /* each setting changed, mid-epoch and at the boundary */
                    for (int change = 0; change < 5; change++) {
                        struct trn_ckpt_run r = run;
                        const char *named[] = {"world size", "--batch-size", "training samples",
                                               "--no-shuffle", "drop_last"};
                        if (change == 0)
                            r.world_size++;
                        else if (change == 1)
                            r.batch_size++;
                        else if (change == 2)
                            r.dataset_len++;
                        else if (change == 3)
                            r.shuffle = false;
                        else
                            r.drop_last = !drop;
                        m.epoch_offset = (uint64_t)world * (uint64_t)batch;
                        if (m.epoch_offset / (uint64_t)world < s.num_samples) {
                            assert_int_equal(trn_ckpt_resume_point(&m, &r, &st, err, sizeof(err)),
                                             CDDP_EMISMATCH);
                            assert_non_null(strstr(err, named[change]));
                            assert_non_null(strstr(err, "--no-resume"));
                        }
                        m.epoch_offset = 0;
                        assert_int_equal(trn_ckpt_resume_point(&m, &r, &st, err, sizeof(err)), 0);
                        assert_true(st.resized && st.epoch == 4 && st.rank_offset == 0);
                    }
                    trn_sampler_free(&s);
                }
    print_message("resume point: %ld positions checked\n", checked);

    /* Another seed, at a boundary or not; damaged counts. */
    struct trn_ckpt_meta m = sample_meta(9);
    struct trn_ckpt_run run = {.seed = 1,
                               .world_size = 4,
                               .batch_size = 32,
                               .dataset_len = 60000,
                               .shuffle = true,
                               .rank_samples = 15000};
    assert_int_equal(trn_ckpt_resume_point(&m, &run, &st, err, sizeof(err)), CDDP_EMISMATCH);
    assert_non_null(strstr(err, "--seed 18446744073709551615, this run has --seed 1"));
    m.seed = 1;
    assert_int_equal(trn_ckpt_resume_point(&m, &run, &st, err, sizeof(err)), 0);
    assert_int_equal(st.rank_offset, 96);
    m.world_size = 0;
    assert_int_equal(trn_ckpt_resume_point(&m, &run, &st, err, sizeof(err)), CDDP_ECORRUPT);
    /* two settings at once: both named, in one line */
    m = sample_meta(9);
    m.seed = 1;
    run.world_size = 2;
    run.shuffle = false;
    assert_int_equal(trn_ckpt_resume_point(&m, &run, &st, err, sizeof(err)), CDDP_EMISMATCH);
    assert_non_null(strstr(err, "world size 4, this run 2; shuffled, this run --no-shuffle"));
    assert_null(strchr(err, '\n'));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip), cmocka_unit_test(test_mismatches),
        cmocka_unit_test(test_damage),     cmocka_unit_test(test_killed_writer),
        cmocka_unit_test(test_weights),    cmocka_unit_test(test_resume_point),
    };
    return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
