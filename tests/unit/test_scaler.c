/*
 * Unit tests for trainer/scaler.c (fp16 loss scaling) against
 * torch.amp.GradScaler's documented behaviour, step by step:
 *
 *   - defaults: scale 65536 (2^16), growth x2, backoff x0.5, interval 2000;
 *   - scale(loss) multiplies by the scale; unscale_ multiplies by the fp32
 *     of 1/scale taken in double;
 *   - a step with inf/NaN gradients is skipped, the scale halves and the
 *     growth tracker restarts; 2000 good steps in a row double it, and not
 *     before; growth that would overflow keeps the scale;
 *   - disabled (enabled=False) it changes nothing and skips nothing;
 *
 * plus the per-element math its CUDA kernel runs (ops_math.h): unscale with
 * the inf/NaN check, and the fp32 <-> bf16 / fp16 roundings (round to
 * nearest even, overflow to inf, subnormals), against the compiler's own
 * _Float16 where it has one; and the scaler's state in a checkpoint
 * (amp.scale, amp.growth_tracker), with checkpoints without it still loading.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trainer/checkpoint.h"
#include "trainer/ops/cuda/ops_math.h"
#include "trainer/scaler.h"

static void test_defaults(void **state)
{
    (void)state;
    struct trn_scaler s;
    trn_scaler_init(&s, true);
    assert_true(s.scale == 65536.0f);
    assert_true(s.growth_factor == 2.0f && s.backoff_factor == 0.5f);
    assert_int_equal(s.growth_interval, 2000);
    assert_int_equal(s.growth_tracker, 0);
    assert_true(trn_scaler_loss_scale(&s) == 65536.0f);
    assert_true(trn_scaler_inv_scale(&s) == 1.0f / 65536.0f);
    /* 1/scale in double, then fp32, as torch's scale.double().reciprocal().float() */
    s.scale = 3.0f;
    assert_true(trn_scaler_inv_scale(&s) == (float)(1.0 / 3.0));
}

static void test_growth_after_interval(void **state)
{
    (void)state;
    struct trn_scaler s;
    trn_scaler_init(&s, true);
    for (int i = 1; i < 2000; i++) {
        assert_true(trn_scaler_update(&s, false));
        assert_true(s.scale == 65536.0f);
        assert_int_equal(s.growth_tracker, i);
    }
    assert_true(trn_scaler_update(&s, false)); /* the 2000th good step */
    assert_true(s.scale == 131072.0f);
    assert_int_equal(s.growth_tracker, 0);
    for (int i = 0; i < 2000; i++)
        trn_scaler_update(&s, false);
    assert_true(s.scale == 262144.0f);
    assert_int_equal(s.skipped, 0);
}

static void test_backoff_skips_and_restarts(void **state)
{
    (void)state;
    struct trn_scaler s;
    trn_scaler_init(&s, true);
    for (int i = 0; i < 1500; i++)
        trn_scaler_update(&s, false);
    assert_int_equal(s.growth_tracker, 1500);
    assert_false(trn_scaler_update(&s, true)); /* skipped */
    assert_true(s.scale == 32768.0f);
    assert_int_equal(s.growth_tracker, 0);
    assert_false(trn_scaler_update(&s, true)); /* again */
    assert_true(s.scale == 16384.0f);
    assert_int_equal(s.skipped, 2);
    /* the tracker counts from the skip: 1999 good steps are not enough */
    for (int i = 0; i < 1999; i++)
        assert_true(trn_scaler_update(&s, false));
    assert_true(s.scale == 16384.0f);
    trn_scaler_update(&s, false);
    assert_true(s.scale == 32768.0f);
}

static void test_growth_never_overflows(void **state)
{
    (void)state;
    struct trn_scaler s;
    trn_scaler_init(&s, true);
    s.scale = ldexpf(1.0f, 127); /* x2 would be inf */
    s.growth_tracker = 1999;
    assert_true(trn_scaler_update(&s, false));
    assert_true(s.scale == ldexpf(1.0f, 127));
    assert_int_equal(s.growth_tracker, 0);
}

static void test_disabled(void **state)
{
    (void)state;
    struct trn_scaler s;
    trn_scaler_init(&s, false);
    assert_true(trn_scaler_loss_scale(&s) == 1.0f);
    assert_true(trn_scaler_inv_scale(&s) == 1.0f);
    assert_true(trn_scaler_update(&s, true)); /* nothing is skipped */
    assert_true(trn_scaler_update(&s, false));
    assert_true(s.scale == 65536.0f);
    assert_int_equal(s.growth_tracker, 0);
    assert_int_equal(s.skipped, 0);
}

static void test_restore(void **state)
{
    (void)state;
    struct trn_scaler s;
    trn_scaler_init(&s, true);
    assert_int_equal(trn_scaler_restore(&s, 1024.0, 17), 0);
    assert_true(s.scale == 1024.0f);
    assert_int_equal(s.growth_tracker, 17);
    assert_int_equal(trn_scaler_restore(&s, 0.0, 0), -1);
    assert_int_equal(trn_scaler_restore(&s, -2.0, 0), -1);
    assert_int_equal(trn_scaler_restore(&s, INFINITY, 0), -1);
    assert_int_equal(trn_scaler_restore(&s, NAN, 0), -1);
    assert_int_equal(trn_scaler_restore(&s, 1e300, 0), -1); /* not an fp32 */
    assert_int_equal(trn_scaler_restore(&s, 8.0, -1), -1);
    assert_int_equal(trn_scaler_restore(&s, 8.0, 2000), -1);
    assert_true(s.scale == 1024.0f); /* a refused state leaves it */
}

/* A whole fp16 step over a gradient vector as step.c runs it: the kernel's
 * per-element unscale, then the scaler's decision. */
static void test_unscale_one(void **state)
{
    (void)state;
    struct trn_scaler s;
    trn_scaler_init(&s, true);
    float g[5] = {65536.0f, -32768.0f, 3.0f, 0.0f, 131072.0f};
    float inv = trn_scaler_inv_scale(&s);
    int found = 0;
    for (int i = 0; i < 5; i++)
        g[i] = trn_unscale_one(g[i], inv, &found);
    assert_int_equal(found, 0);
    assert_true(g[0] == 1.0f && g[1] == -0.5f && g[2] == 3.0f / 65536.0f && g[3] == 0.0f &&
                g[4] == 2.0f);
    assert_true(trn_scaler_update(&s, found));

    float bad[3] = {1.0f, INFINITY, NAN};
    for (int i = 0; i < 3; i++) {
        int f = 0;
        trn_unscale_one(bad[i], inv, &f);
        assert_int_equal(f, i > 0);
    }
    found = 0;
    trn_unscale_one(-INFINITY, inv, &found);
    assert_int_equal(found, 1);
    assert_false(trn_scaler_update(&s, found));
    assert_true(s.scale == 32768.0f);
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static void test_bf16(void **state)
{
    (void)state;
    assert_int_equal(trn_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(trn_f32_to_bf16(-2.0f), 0xc000);
    /* ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 */
    assert_int_equal(trn_f32_to_bf16(bits_f32(0x3f808000u)), 0x3f80);
    assert_int_equal(trn_f32_to_bf16(bits_f32(0x3f818000u)), 0x3f82);
    assert_int_equal(trn_f32_to_bf16(bits_f32(0x3f808001u)), 0x3f81);
    assert_int_equal(trn_f32_to_bf16(FLT_MAX), 0x7f80); /* rounds up to inf */
    assert_int_equal(trn_f32_to_bf16(INFINITY), 0x7f80);
    uint16_t n = trn_f32_to_bf16(NAN);
    assert_true((n & 0x7f80) == 0x7f80 && (n & 0x7f) != 0);
    /* every bf16 value survives the round trip */
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = trn_bf16_to_f32((uint16_t)h);
        if (isnan(f))
            continue;
        assert_int_equal(trn_f32_to_bf16(f), h);
    }
}

static void test_f16(void **state)
{
    (void)state;
    assert_int_equal(trn_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(trn_f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(trn_f32_to_f16(65504.0f), 0x7bff); /* the largest half */
    assert_int_equal(trn_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(trn_f32_to_f16(65520.0f), 0x7c00); /* rounds to inf */
    assert_int_equal(trn_f32_to_f16(-1e10f), 0xfc00);
    assert_int_equal(trn_f32_to_f16(ldexpf(1.0f, -24)), 0x0001); /* the smallest subnormal */
    assert_int_equal(trn_f32_to_f16(ldexpf(1.0f, -25)), 0x0000); /* a tie: to even, 0 */
    assert_int_equal(trn_f32_to_f16(ldexpf(1.5f, -25)), 0x0001);
    assert_int_equal(trn_f32_to_f16(ldexpf(1.0f, -14)), 0x0400); /* the smallest normal */
    assert_int_equal(trn_f32_to_f16(0.1f), 0x2e66);
    assert_int_equal(trn_f32_to_f16(-0.0f), 0x8000);
    uint16_t n = trn_f32_to_f16(NAN);
    assert_true((n & 0x7c00) == 0x7c00 && (n & 0x3ff) != 0);
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = trn_f16_to_f32((uint16_t)h);
        if (isnan(f))
            continue;
        assert_int_equal(trn_f32_to_f16(f), h);
    }
#ifdef __FLT16_MAX__
    /* against the compiler's conversion (round to nearest even) on many floats */
    uint64_t x = 12345;
    for (int i = 0; i < 2000000; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t u = (uint32_t)(x >> 32);
        /* half the draws near the half range, so subnormals and overflow are hit */
        if (i & 1)
            u = (u & 0x80000000u) | (0x33000000u + (u % (0x47800000u - 0x33000000u)));
        float f = bits_f32(u);
        if (isnan(f))
            continue;
        __extension__ _Float16 h = (__extension__(_Float16) f);
        uint16_t want;
        memcpy(&want, &h, sizeof(want));
        if (trn_f32_to_f16(f) != want)
            fail_msg("f16 of %a (0x%08x): ours 0x%04x, the compiler's 0x%04x", (double)f, u,
                     trn_f32_to_f16(f), want);
        float back = trn_f16_to_f32(want);
        if (back != (float)h)
            fail_msg("f32 of half 0x%04x: ours %a, the compiler's %a", want, (double)back,
                     (double)(float)h);
    }
#endif
}

/* ---- the scaler's state in a checkpoint ---- */

static char tmpdir[256], err[2048];

static struct trn_ckpt_meta meta_at(long step)
{
    struct trn_ckpt_meta m = {.arch = "resnet18",
                              .num_classes = 3,
                              .seed = 1,
                              .step = step,
                              .world_size = 1,
                              .batch_size = 4,
                              .dataset_len = 8,
                              .optimizer_steps = step,
                              .lr = 0.01,
                              .momentum = 0.9,
                              .lr_schedule = "constant"};
    return m;
}

static void test_checkpoint_state(void **state)
{
    (void)state;
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(tmpdir, sizeof(tmpdir), "%s/cddp-scaler-XXXXXX", base);
    assert_non_null(mkdtemp(tmpdir));
    char with[400], without[400];
    snprintf(with, sizeof(with), "%s/with.ckpt", tmpdir);
    snprintf(without, sizeof(without), "%s/without.ckpt", tmpdir);
    float w[4] = {1, 2, 3, 4}, mw[4] = {5, 6, 7, 8};
    struct trn_ckpt_tensor t = {"fc.weight", TRN_ST_F32, 1, {4}, w};
    struct trn_ckpt_tensor mt = {"fc.weight", TRN_ST_F32, 1, {4}, mw};

    struct trn_ckpt_meta m = meta_at(3);
    m.amp_scaler = true;
    m.amp_scale = 32768.0 * 3; /* any fp32 survives the text */
    m.amp_growth_tracker = 1999;
    assert_int_equal(trn_ckpt_save(with, &t, 1, &mt, 1, &m, err, sizeof(err)), 0);
    struct trn_ckpt_meta got;
    assert_int_equal(trn_ckpt_load(with, "resnet18", &t, 1, &mt, 1, &got, err, sizeof(err)), 0);
    assert_true(got.amp_scaler);
    assert_true(got.amp_scale == 32768.0 * 3);
    assert_int_equal(got.amp_growth_tracker, 1999);
    struct trn_scaler s;
    trn_scaler_init(&s, true);
    assert_int_equal(trn_scaler_restore(&s, got.amp_scale, got.amp_growth_tracker), 0);
    assert_false(trn_scaler_update(&s, true));
    assert_true(s.scale == 49152.0f);

    /* without the keys (a run without fp16, or a checkpoint from before
     * them): no scaler state, and nothing else changes */
    struct trn_ckpt_meta plain = meta_at(3);
    assert_int_equal(trn_ckpt_save(without, &t, 1, &mt, 1, &plain, err, sizeof(err)), 0);
    memset(&got, 0x5a, sizeof(got));
    assert_int_equal(trn_ckpt_load(without, "resnet18", &t, 1, &mt, 1, &got, err, sizeof(err)), 0);
    assert_false(got.amp_scaler);
    assert_int_equal(got.step, 3);
    unlink(with);
    unlink(without);
    rmdir(tmpdir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_growth_after_interval),
        cmocka_unit_test(test_backoff_skips_and_restarts),
        cmocka_unit_test(test_growth_never_overflows),
        cmocka_unit_test(test_disabled),
        cmocka_unit_test(test_restore),
        cmocka_unit_test(test_unscale_one),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_f16),
        cmocka_unit_test(test_checkpoint_state),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
