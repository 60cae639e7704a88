/* Unit tests for trainer/flags.c: the flags table and what follows from it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trainer/flags.h"

static char err[4096];

/* Parses the NULL-ended flags in ap after a program name. */
static int vparse(struct trn_config *c, va_list ap)
{
    char *argv[64] = {"cddp-train"};
    int argc = 1;
    for (char *a; argc < 63 && (a = va_arg(ap, char *)) != NULL;)
        argv[argc++] = a;
    err[0] = '\0';
    return trn_flags_parse(argc, argv, c, err, sizeof(err));
}

static int parse(struct trn_config *c, ...)
{
    va_list ap;
    va_start(ap, c);
    int rc = vparse(c, ap);
    va_end(ap);
    return rc;
}

static void test_defaults_are_the_seed_scripts(void **state)
{
    (void)state;
    struct trn_config c;
    assert_int_equal(parse(&c, NULL), TRN_FLAGS_RUN);
    assert_string_equal(c.arch, "resnet152");
    assert_string_equal(c.data, "synthetic");
    assert_int_equal(c.num_samples, 50000);
    assert_int_equal(c.image_size, 224);
    assert_int_equal(c.batch_size, 64);
    assert_int_equal(c.epochs, 100);
    assert_true(c.lr == 0.01 && c.momentum == 0.9 && c.weight_decay == 1e-4);
    assert_int_equal(c.lr_schedule, TRN_LR_CONSTANT);
    assert_true(c.shuffle && c.overlap);
    assert_false(c.eval || c.sync_bn || c.drop_last || c.no_resume || c.zero_init_residual);
    assert_int_equal(c.log_every, 50);
    assert_int_equal(c.accum_steps, 1);
    assert_true(c.bucket_cap_mb == 25.0);
    assert_true(c.collective_timeout == 600.0 && c.init_timeout == 300.0);
    assert_int_equal(c.steps, 0);
    assert_int_equal(c.num_classes, 0);
    assert_null(c.checkpoint);
    assert_int_equal(c.fault.kind, TRN_FAULT_NONE);

    struct trn_config d;
    trn_flags_defaults(&d);
    assert_memory_equal(&c, &d, sizeof(c));
}

static void test_every_kind_sets_its_field(void **state)
{
    (void)state;
    struct trn_config c;
    assert_int_equal(parse(&c, "--arch", "resnet18", "--batch-size=4", "--lr", "0.5",
                           "--lr-schedule", "cosine", "--no-shuffle", "--sync-bn", "--fault",
                           "crash@step=3,rank=1", "--checkpoint", "ck.safetensors", "--ckpt-every",
                           "2", NULL),
                     TRN_FLAGS_RUN);
    assert_string_equal(c.arch, "resnet18");
    assert_int_equal(c.batch_size, 4);
    assert_true(c.lr == 0.5);
    assert_int_equal(c.lr_schedule, TRN_LR_COSINE);
    assert_false(c.shuffle);
    assert_true(c.sync_bn);
    assert_int_equal(c.fault.kind, TRN_FAULT_CRASH);
    assert_int_equal(c.fault.step, 3);
    assert_int_equal(c.fault.rank, 1);
    assert_string_equal(c.checkpoint, "ck.safetensors");
    assert_int_equal(c.ckpt_every, 2);
    /* the last of a repeated flag wins */
    assert_int_equal(parse(&c, "--epochs", "3", "--epochs", "5", NULL), TRN_FLAGS_RUN);
    assert_int_equal(c.epochs, 5);
}

static void test_help_and_version(void **state)
{
    (void)state;
    struct trn_config c;
    assert_int_equal(parse(&c, "--help", NULL), TRN_FLAGS_HELP);
    assert_int_equal(parse(&c, "--batch-size", "2", "--version", NULL), TRN_FLAGS_VERSION);
}

/* Each refusal is one line that starts with the flag. */
static void refused(const char *want, ...)
{
    struct trn_config c;
    va_list ap;
    va_start(ap, want);
    int rc = vparse(&c, ap);
    va_end(ap);
    assert_int_equal(rc, TRN_FLAGS_BAD);
    if (strcmp(err, want) != 0)
        fail_msg("got '%s', want '%s'", err, want);
    assert_null(strchr(err, '\n'));
}

static void test_bad_flags_name_themselves(void **state)
{
    (void)state;
    refused("--batch-size: expected an integer in [1, 65536], got '12x'", "--batch-size", "12x",
            NULL);
    refused("--seed: expected an integer in [0, 4611686018427387904], got '-1'", "--seed", "-1",
            NULL);
    refused("--lr: expected a number in [0, 1e+06], got 'fast'", "--lr", "fast", NULL);
    refused("--momentum: expected a number in [0, 1], got '1.5'", "--momentum", "1.5", NULL);
    refused("--lr-schedule: 'linear' is not constant or cosine", "--lr-schedule", "linear", NULL);
    refused("--arch: unknown architecture 'resnet19' (one of resnet18, resnet34, resnet50, "
            "resnet101, resnet152)",
            "--arch", "resnet19", NULL);
    refused("--lr: needs a value", "--lr", NULL);
    refused("--no-such-flag: unknown option (see --help)", "--no-such-flag=3", NULL);
    refused("stray: unexpected argument (options start with --; see --help)", "stray", NULL);
    refused("--eval-logits: needs --eval", "--eval-logits", "x.safetensors", NULL);
    refused("--eval-limit: needs --eval", "--eval-limit", "10", NULL);
    refused("--ckpt-every: needs --checkpoint", "--ckpt-every", "2", NULL);
    refused("--no-resume: needs --checkpoint", "--no-resume", NULL);
    refused("--checkpoint: needs a file name", "--checkpoint=", NULL);
    refused("--checkpoint: 'w' is also the --save or --eval-logits file", "--checkpoint", "w",
            "--save", "w", NULL);
    /* --fault's own parser names the flag */
    struct trn_config c;
    assert_int_equal(parse(&c, "--fault", "explode@step=1", NULL), TRN_FLAGS_BAD);
    assert_true(strncmp(err, "--fault 'explode@step=1': ", 26) == 0);
}

static void test_table_is_consistent(void **state)
{
    (void)state;
    size_t n;
    const struct trn_flag *t = trn_flags_table(&n);
    assert_true(n > 30);
    for (size_t i = 0; i < n; i++) {
        const struct trn_flag *f = &t[i];
        assert_non_null(f->help);
        assert_non_null(f->group);
        assert_true(f->offset < sizeof(struct trn_config));
        assert_true((f->arg == NULL) == (f->kind == TRN_FLAG_ON || f->kind == TRN_FLAG_OFF));
        for (size_t j = 0; j < i; j++) {
            assert_string_not_equal(f->name, t[j].name);
            if (strcmp(t[j].group, f->group) == 0)
                assert_true(j + 1 == i || strcmp(t[j + 1].group, f->group) == 0); /* contiguous */
        }
        if (f->kind == TRN_FLAG_PARSED) /* the digest cannot show such a value */
            assert_int_equal(f->agree, TRN_AGREE_NO);
        if (f->kind == TRN_FLAG_LONG && f->def.l != 0) /* 0: not given */
            assert_true(f->def.l >= (long)f->min && f->def.l <= (long)f->max);
        if (f->kind == TRN_FLAG_CHOICE)
            assert_non_null(f->choices);
        if (f->needs) {
            bool found = false;
            for (size_t j = 0; j < n; j++)
                found |= strcmp(t[j].name, f->needs) == 0;
            assert_true(found);
        }
    }
}

static void test_usage_lists_every_flag(void **state)
{
    (void)state;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    trn_flags_usage(f);
    fclose(f);
    size_t n;
    const struct trn_flag *t = trn_flags_table(&n);
    for (size_t i = 0; i < n; i++) {
        char want[64];
        snprintf(want, sizeof(want), "\n  --%s%s", t[i].name, t[i].arg ? " " : "");
        if (!strstr(text, want))
            fail_msg("--help lacks %s", want + 1);
    }
    assert_non_null(strstr(text, "--batch-size N          images per step (64)\n"));
    assert_non_null(strstr(text, "--weight-decay X        SGD weight decay (1e-4)\n"));
    assert_non_null(strstr(text, "(OMP_NUM_THREADS, else all cores)"));
    assert_non_null(strstr(text, "from\n                          --lr to 0"));
    assert_non_null(strstr(text, "--help, --version"));
    free(text);
}

/* The digest of the NULL-ended flags. */
static void digest(char *buf, size_t len, ...)
{
    struct trn_config c;
    va_list ap;
    va_start(ap, len);
    int rc = vparse(&c, ap);
    va_end(ap);
    assert_int_equal(rc, TRN_FLAGS_RUN);
    int n = trn_flags_digest(&c, buf, len);
    assert_int_equal((size_t)n, strlen(buf));
}

static void test_digest_holds_what_ranks_must_agree_on(void **state)
{
    (void)state;
    char base[1024], other[1024];
    digest(base, sizeof(base), NULL);
    assert_true(strncmp(base, "--arch resnet152 --seed 0 --lr 0.01 ", 36) == 0);
    assert_non_null(strstr(base, " --batch-size 64 "));
    assert_non_null(strstr(base, " --lr-schedule constant "));
    assert_null(strstr(base, "--no-shuffle"));
    assert_null(strstr(base, "--checkpoint"));

    /* what may differ between ranks leaves it as it is */
    digest(other, sizeof(other), "--threads", "3", "--init-timeout", "9", "--log-every", "1",
           "--fault", "hang@step=1,rank=1", "--save", "w", "--zero-init-residual", NULL);
    assert_string_equal(base, other);
    /* a path: whether it is given, not where */
    char a[1024], b[1024];
    digest(a, sizeof(a), "--checkpoint", "/a/ck", NULL);
    digest(b, sizeof(b), "--checkpoint", "/b/ck", NULL);
    assert_string_equal(a, b);
    assert_string_not_equal(a, base);
    assert_non_null(strstr(a, " --checkpoint"));

    /* every value that must agree changes it */
    static const char *const must[][2] = {
        {"--arch", "resnet18"}, {"--batch-size", "8"},   {"--epochs", "2"},
        {"--steps", "5"},       {"--seed", "1"},         {"--lr", "0.1"},
        {"--momentum", "0"},    {"--weight-decay", "0"}, {"--lr-schedule", "cosine"},
        {"--data", "idx"},      {"--accum-steps", "2"},  {"--bucket-cap-mb", "1"},
        {"--no-shuffle", NULL}, {"--drop-last", NULL},   {"--sync-bn", NULL},
        {"--no-overlap", NULL}, {"--eval", NULL},
    };
    for (size_t i = 0; i < sizeof(must) / sizeof(must[0]); i++) {
        digest(other, sizeof(other), must[i][0], must[i][1], NULL);
        if (strcmp(other, base) == 0)
            fail_msg("%s does not change the digest", must[i][0]);
    }
    digest(other, sizeof(other), "--batch-size", "8", NULL);
    assert_non_null(strstr(other, " --batch-size 8 "));

    /* a short buffer: what snprintf does */
    char tiny[8];
    struct trn_config c;
    trn_flags_defaults(&c);
    assert_int_equal(trn_flags_digest(&c, tiny, sizeof(tiny)), (int)strlen(base));
    assert_string_equal(tiny, "--arch ");
}

static void test_output_paths(void **state)
{
    (void)state;
    char dir[] = "/tmp/cddp-flags-XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/ck.safetensors", dir);
    assert_int_equal(trn_flags_check_output("--checkpoint", path, err, sizeof(err)), 0);
    assert_int_equal(trn_flags_check_output("--save", "w.safetensors", err, sizeof(err)), 0);
    snprintf(path, sizeof(path), "%s/nowhere/w", dir);
    assert_int_equal(trn_flags_check_output("--save", path, err, sizeof(err)), TRN_FLAGS_BAD);
    char want[128];
    snprintf(want, sizeof(want), "--save: directory '%s/nowhere' does not exist", dir);
    assert_string_equal(err, want);
    assert_int_equal(trn_flags_check_output("--eval-logits", dir, err, sizeof(err)), TRN_FLAGS_BAD);
    snprintf(want, sizeof(want), "--eval-logits: '%s' exists and is not a file", dir);
    assert_string_equal(err, want);
    assert_int_equal(trn_flags_check_output("--save", "/w", err, sizeof(err)), 0); /* "/" */
    assert_int_equal(rmdir(dir), 0);
}

/* --cuda-graphs: off by default, on with the flag (no value), and every
 * rank must agree on it. */
static void test_cuda_graphs_flag(void **state)
{
    (void)state;
    struct trn_config c;
    assert_int_equal(parse(&c, NULL), TRN_FLAGS_RUN);
    assert_false(c.cuda_graphs);
    assert_int_equal(parse(&c, "--cuda-graphs", NULL), TRN_FLAGS_RUN);
    assert_true(c.cuda_graphs);
    assert_int_equal(parse(&c, "--cuda-graphs=1", NULL), TRN_FLAGS_BAD);
    char base[1024], with[1024];
    digest(base, sizeof(base), NULL);
    digest(with, sizeof(with), "--cuda-graphs", NULL);
    assert_null(strstr(base, "--cuda-graphs"));
    assert_non_null(strstr(with, " --cuda-graphs"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_are_the_seed_scripts),
        cmocka_unit_test(test_every_kind_sets_its_field),
        cmocka_unit_test(test_help_and_version),
        cmocka_unit_test(test_bad_flags_name_themselves),
        cmocka_unit_test(test_table_is_consistent),
        cmocka_unit_test(test_usage_lists_every_flag),
        cmocka_unit_test(test_digest_holds_what_ranks_must_agree_on),
        cmocka_unit_test(test_output_paths),
        cmocka_unit_test(test_cuda_graphs_flag),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
