/* Unit tests for trainer/resume.c: a run's checkpoint written and resumed,
 * on a real ResNet-18 (10 classes) and sampler. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_table_is_the_state_dict),
        cmocka_unit_test(test_nothing_to_resume),
        cmocka_unit_test(test_save_then_resume_where_it_stood),
        cmocka_unit_test(test_a_checkpoint_of_another_run_is_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
