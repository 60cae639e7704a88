/* Unit tests for trainer/resume.c: a run's checkpoint written and resumed,
 * on a real ResNet-18 (10 classes) and sampler. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trainer/resume.h"

#include "cpu_backend_fixture.h"

static char tmpdir[256];

static int setup(void **state)
{
    if (cpu_backend_setup(state) != 0)
        return -1;
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(tmpdir, sizeof(tmpdir), "%s/cddp-resume-XXXXXX", base);
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        return -1;
    return cpu_backend_teardown(state);
}

/* One run's pieces: flags, model, its state table, a sampler, a schedule. */
struct fixture {
    struct trn_config cfg;
    struct trn_resnet model;
    struct trn_ckpt_tensor *table;
    struct trn_sampler sampler;
    struct trn_lr_schedule sched;
    struct trn_resume k;
    char path[300];
};

static void fixture_open(struct fixture *f, uint64_t seed, float fill)
{
    memset(f, 0, sizeof(*f));
    trn_flags_defaults(&f->cfg);
    snprintf(f->path, sizeof(f->path), "%s/ck.safetensors", tmpdir);
    f->cfg.arch = "resnet18";
    f->cfg.batch_size = 4;
    f->cfg.seed = (long)seed;
    f->cfg.checkpoint = f->path;
    char err[256];
    assert_int_equal(
        trn_resnet_create(&f->model, &be, trn_arch_find("resnet18"), 10, err, sizeof(err)), 0);
    trn_resnet_init(&f->model, seed, false);
    for (size_t i = 0; i < f->model.num_params; i++)
        f->model.momentum[i] = fill + (float)(i % 7);
    f->table = trn_state_table(&f->model);
    assert_int_equal(trn_sampler_init(&f->sampler, 12, 1, 0, true, false, seed), 0);
    f->sched = trn_lr_schedule_make(TRN_LR_COSINE, 0.01, 3, 2, 0);
    trn_resume_init(&f->k, &f->cfg, &f->model, f->table, &f->sampler, &f->sched);
}

static void fixture_close(struct fixture *f)
{
    trn_resume_free(&f->k);
    free(f->table);
    trn_sampler_free(&f->sampler);
    trn_resnet_free(&f->model);
}

static void test_state_table_is_the_state_dict(void **state)
{
    (void)state;
    struct fixture f;
    fixture_open(&f, 1, 0);
    assert_int_equal(f.model.n_state, 122); /* torchvision's resnet18 */
    assert_string_equal(f.table[0].name, "conv1.weight");
    assert_int_equal(f.table[0].ndim, 4);
    assert_int_equal(f.table[0].shape[0], 64);
    assert_ptr_equal(f.table[0].data, f.model.params);
    /* one momentum buffer per parameter, named as it */
    size_t params = 0;
    for (size_t i = 0; i < f.model.n_state; i++)
        params += f.model.state[i].kind == TRN_STATE_PARAM;
    assert_int_equal(f.k.n_mom, params);
    assert_string_equal(f.k.momentum[0].name, "conv1.weight");
    assert_ptr_equal(f.k.momentum[0].data, f.model.momentum);
    fixture_close(&f);
}

static void test_nothing_to_resume(void **state)
{
    (void)state;
    struct fixture f;
    char err[4096];
    struct trn_resume_point at = {.resumed = true, .epoch = 9};
    fixture_open(&f, 1, 0);
    unlink(f.path);
    assert_int_equal(trn_resume_load(&f.k, 0, &at, err, sizeof(err)), 0); /* no file */
    assert_false(at.resumed);
    assert_int_equal(at.epoch, 0);
    f.k.path = NULL; /* no --checkpoint */
    assert_int_equal(trn_resume_load(&f.k, 0, &at, err, sizeof(err)), 0);
    assert_int_equal(trn_resume_save(&f.k, 0, 1, 3, 0, err, sizeof(err)), 0);
    assert_int_equal(access(f.path, F_OK), -1);
    fixture_close(&f);
}

static void test_save_then_resume_where_it_stood(void **state)
{
    (void)state;
    struct fixture a, b;
    char err[4096];
    fixture_open(&a, 7, 0.5f);
    a.model.optimizer_steps = 4;
    /* epoch 1, 4 steps in all, one batch of 4 of this rank's samples done */
    int rc = trn_resume_save(&a.k, 0, 1, 4, 4, err, sizeof(err));
    if (rc != 1)
        fail_msg("%s", err);
    assert_int_equal(a.k.last_step, 4);
    /* the same step again: already on disk */
    assert_int_equal(trn_resume_save(&a.k, 0, 1, 4, 4, err, sizeof(err)), 0);

    fixture_open(&b, 7, 9.0f);
    trn_resnet_init(&b.model, 8, true); /* other weights, to be replaced */
    struct trn_resume_point at;
    rc = trn_resume_load(&b.k, 1, &at, err, sizeof(err)); /* rank 1: prints nothing */
    if (rc != 1)
        fail_msg("%s", err);
    assert_true(at.resumed);
    assert_int_equal(at.epoch, 1);
    assert_int_equal(at.step, 4);
    assert_int_equal(at.first_batch, 1);
    assert_int_equal(b.k.last_step, 4);
    assert_int_equal(b.model.optimizer_steps, 4);
    assert_memory_equal(b.model.params, a.model.params, a.model.num_params * sizeof(float));
    assert_memory_equal(b.model.momentum, a.model.momentum, a.model.num_params * sizeof(float));
    assert_memory_equal(b.model.buffers, a.model.buffers, a.model.num_buffers * sizeof(float));

    /* --no-resume: the file is not read */
    b.cfg.no_resume = true;
    assert_int_equal(trn_resume_load(&b.k, 0, &at, err, sizeof(err)), 0);
    assert_false(at.resumed);
    fixture_close(&b);
    fixture_close(&a);
}

static void test_a_checkpoint_of_another_run_is_refused(void **state)
{
    (void)state;
    struct fixture a, b;
    char err[4096];
    fixture_open(&a, 7, 0);
    assert_int_equal(trn_resume_save(&a.k, 0, 0, 1, 4, err, sizeof(err)), 1);
    fixture_open(&b, 8, 0); /* another --seed: another data order */
    struct trn_resume_point at;
    assert_int_equal(trn_resume_load(&b.k, 0, &at, err, sizeof(err)), -1);
    assert_true(strncmp(err, "--checkpoint: ", 14) == 0);
    assert_non_null(strstr(err, b.path));
    assert_non_null(strstr(err, "seed"));
    assert_null(strchr(err, '\n'));
    fixture_close(&b);
    fixture_close(&a);
}

/* Overwrites 64 bytes in the middle of the file (the data: the CRC-32
 * catches it). */
static void damage(const char *path)
{
    FILE *fh = fopen(path, "r+b");
    assert_non_null(fh);
    assert_int_equal(fseek(fh, 0, SEEK_END), 0);
    long size = ftell(fh);
    assert_true(size > 4096);
    assert_int_equal(fseek(fh, size / 2, SEEK_SET), 0);
    static const char junk[64] = "a flipped sector, a bad cable, a neighbour's write";
    assert_int_equal(fwrite(junk, 1, sizeof(junk), fh), sizeof(junk));
    assert_int_equal(fclose(fh), 0);
}

static bool same_file(const char *a, const char *b)
{
    struct stat x, y;
    return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_ino == y.st_ino && x.st_dev == y.st_dev;
}

static void test_a_damaged_checkpoint_falls_back_on_the_previous(void **state)
{
    (void)state;
    struct fixture a, b;
    char err[4096];
    fixture_open(&a, 7, 0.5f);
    char prev[320];
    snprintf(prev, sizeof(prev), "%s.prev", a.path);
    unlink(prev);
    assert_int_equal(trn_resume_save(&a.k, 0, 0, 1, 4, err, sizeof(err)), 1);
    assert_int_equal(access(prev, F_OK), -1); /* nothing to keep yet */
    float *at1 = malloc(a.model.num_params * sizeof(float));
    memcpy(at1, a.model.params, a.model.num_params * sizeof(float));
    struct stat first;
    assert_int_equal(stat(a.path, &first), 0);
    a.model.params[0] += 1.0f; /* a step later */
    assert_int_equal(trn_resume_save(&a.k, 0, 0, 2, 8, err, sizeof(err)), 1);
    struct stat kept;
    assert_int_equal(stat(prev, &kept), 0);
    assert_int_equal(kept.st_ino, first.st_ino); /* the file replaced, not a copy */
    damage(a.path);

    /* Every rank resumes from step 1, the file before the damaged one. */
    fixture_open(&b, 7, 9.0f);
    struct trn_resume_point at;
    int rc = trn_resume_load(&b.k, 1, &at, err, sizeof(err));
    if (rc != 1)
        fail_msg("%s", err);
    assert_int_equal(at.step, 1);
    assert_int_equal(at.first_batch, 1);
    assert_memory_equal(b.model.params, at1, a.model.num_params * sizeof(float));
    /* Its next write replaces the damaged file and leaves PATH.prev alone;
     * the one after that rotates again. */
    assert_int_equal(trn_resume_save(&b.k, 0, 0, 2, 8, err, sizeof(err)), 1);
    assert_int_equal(stat(prev, &kept), 0);
    assert_int_equal(kept.st_ino, first.st_ino);
    struct stat second;
    assert_int_equal(stat(b.path, &second), 0);
    assert_int_equal(trn_resume_save(&b.k, 0, 0, 3, 12, err, sizeof(err)), 1);
    assert_int_equal(stat(prev, &kept), 0);
    assert_int_equal(kept.st_ino, second.st_ino);
    fixture_close(&b);

    /* Another run's checkpoint (--seed) is refused, not skipped for the previous. */
    fixture_open(&b, 8, 0);
    assert_int_equal(trn_resume_load(&b.k, 0, &at, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "seed"));
    fixture_close(&b);
    free(at1);
    fixture_close(&a);
}

static void test_damaged_with_nothing_to_fall_back_on_is_one_line(void **state)
{
    (void)state;
    struct fixture a, b;
    char err[4096];
    fixture_open(&a, 7, 0);
    char prev[320];
    snprintf(prev, sizeof(prev), "%s.prev", a.path);
    unlink(prev);
    assert_int_equal(trn_resume_save(&a.k, 0, 0, 1, 4, err, sizeof(err)), 1);
    damage(a.path);
    fixture_open(&b, 7, 0);
    struct trn_resume_point at;
    assert_int_equal(trn_resume_load(&b.k, 0, &at, err, sizeof(err)), -1);
    assert_true(strncmp(err, "--checkpoint: ", 14) == 0);
    assert_non_null(strstr(err, "CRC-32"));
    assert_non_null(strstr(err, "no previous checkpoint"));
    assert_null(strchr(err, '\n'));

    /* Both damaged: both named, one line. */
    assert_int_equal(trn_resume_save(&a.k, 0, 0, 2, 8, err, sizeof(err)), 1);
    damage(a.path);
    damage(prev);
    assert_int_equal(trn_resume_load(&b.k, 0, &at, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "unusable too"));
    assert_non_null(strstr(err, prev));
    assert_null(strchr(err, '\n'));
    fixture_close(&b);
    fixture_close(&a);
}

static void test_another_runs_previous_is_not_kept(void **state)
{
    (void)state;
    struct fixture a, b;
    char err[4096];
    fixture_open(&a, 7, 0);
    char prev[320];
    snprintf(prev, sizeof(prev), "%s.prev", a.path);
    assert_int_equal(trn_resume_save(&a.k, 0, 0, 1, 4, err, sizeof(err)), 1);
    assert_int_equal(trn_resume_save(&a.k, 0, 0, 2, 8, err, sizeof(err)), 1);
    assert_int_equal(access(prev, F_OK), 0);
    /* --no-resume: the first write drops PATH.prev and keeps nothing of the
     * old run, so a damaged PATH can never send this run back to it. */
    fixture_open(&b, 7, 0);
    b.cfg.no_resume = true;
    struct trn_resume_point at;
    assert_int_equal(trn_resume_load(&b.k, 0, &at, err, sizeof(err)), 0);
    assert_int_equal(trn_resume_save(&b.k, 0, 0, 1, 4, err, sizeof(err)), 1);
    assert_int_equal(access(prev, F_OK), -1);
    assert_int_equal(trn_resume_save(&b.k, 0, 0, 2, 8, err, sizeof(err)), 1);
    assert_int_equal(access(prev, F_OK), 0);
    assert_false(same_file(prev, b.path));
    fixture_close(&b);
    fixture_close(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_table_is_the_state_dict),
        cmocka_unit_test(test_nothing_to_resume),
        cmocka_unit_test(test_save_then_resume_where_it_stood),
        cmocka_unit_test(test_a_checkpoint_of_another_run_is_refused),
        cmocka_unit_test(test_a_damaged_checkpoint_falls_back_on_the_previous),
        cmocka_unit_test(test_damaged_with_nothing_to_fall_back_on_is_one_line),
        cmocka_unit_test(test_another_runs_previous_is_not_kept),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
