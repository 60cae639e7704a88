/* Unit tests for common/dl.c: libraries opened on first use. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <string.h>

#include "common/dl.h"
#include "common/errors.h"

/* common/dl.h against a library every test machine has (libm) and one no
 * machine has: the table is filled and callable, a missing library or
 * function is one line naming it, and the first outcome is kept. */
static struct {
    __typeof__(cos) *cos;
    __typeof__(sqrt) *sqrt;
} m_fns;
static const struct cddp_dl_sym m_syms[] = {{"cos", &m_fns.cos}, {"sqrt", &m_fns.sqrt}};
static struct cddp_dl m_lib = CDDP_DL_INIT("libm.so.6", m_syms);

static void *load_m(void *arg)
{
    (void)arg;
    char err[64];
    return (void *)(intptr_t)cddp_dl_load(&m_lib, err, sizeof(err));
}

static void test_dl(void **state)
{
    (void)state;
    /* Many threads at once: one load, the same outcome for all. */
    pthread_t t[8];
    for (int i = 0; i < 8; i++)
        assert_int_equal(pthread_create(&t[i], NULL, load_m, NULL), 0);
    for (int i = 0; i < 8; i++) {
        void *rc;
        pthread_join(t[i], &rc);
        assert_int_equal((intptr_t)rc, 0);
    }
    assert_non_null(m_fns.cos);
    volatile double x = 4.0; /* not folded at compile time */
    assert_true(m_fns.sqrt(x) == 2.0);
    assert_true(m_fns.cos(0.0 * x) == 1.0);

    char err[320] = "";
    struct {
        __typeof__(cos) *f;
    } none_fns = {NULL}, bad_fns = {NULL};
    const struct cddp_dl_sym none_syms[] = {{"cos", &none_fns.f}};
    struct cddp_dl none = CDDP_DL_INIT("libcddp-no-such-library.so.9", none_syms);
    assert_int_equal(cddp_dl_load(&none, err, sizeof(err)), CDDP_ECONFIG);
    assert_non_null(strstr(err, "libcddp-no-such-library.so.9 cannot be loaded ("));
    assert_null(strchr(err, '\n'));
    assert_null(none_fns.f);
    err[0] = '\0';
    assert_int_equal(cddp_dl_load(&none, err, sizeof(err)), CDDP_ECONFIG); /* kept */
    assert_non_null(strstr(err, "libcddp-no-such-library.so.9"));

    /* A library without one of the functions: nothing is filled. */
    const struct cddp_dl_sym bad_syms[] = {{"cos", &bad_fns.f},
                                           {"cddp_no_such_function", &bad_fns.f}};
    struct cddp_dl bad = CDDP_DL_INIT("libm.so.6", bad_syms);
    assert_int_equal(cddp_dl_load(&bad, err, sizeof(err)), CDDP_ECONFIG);
    assert_string_equal(err, "libm.so.6 cannot be loaded (it has no cddp_no_such_function: too "
                             "old a version?)");
    assert_null(bad_fns.f);
    pthread_mutex_destroy(&none.mu);
    pthread_mutex_destroy(&bad.mu);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dl),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
