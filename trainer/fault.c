/* fault.c: --fault parsing and firing; see fault.h. */
#include "trainer/fault.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/exitcodes.h"
#include "common/log.h"
#include "common/strutil.h"

#define FAULT_SPEC_MAX 128
#define FAULT_USAGE                                                                                \
    "use crash@step=N[,rank=R][,every], crash@reform[,rank=R], hang@step=N[,rank=R][,every] "      \
    "slow@step=N,ms=M[,rank=R][,for=K][,every] or nocma@rank=R"

const char *trn_fault_kind_name(enum trn_fault_kind kind)
{
    switch (kind) {
    case TRN_FAULT_CRASH:
        return "crash";
    case TRN_FAULT_HANG:
        return "hang";
    case TRN_FAULT_SLOW:
        return "slow";
    case TRN_FAULT_NOCMA:
        return "nocma";
    case TRN_FAULT_NONE:
        break;
    }
    return "none";
}

static int fail(struct trn_fault *out, char *err, size_t errlen, int code, const char *spec,
                const char *why)
{
    memset(out, 0, sizeof(*out));
    snprintf(err, errlen, "--fault '%s': %s", spec, why);
    return code;
}

int trn_fault_parse(const char *spec, struct trn_fault *out, char *err, size_t errlen)
{
    char buf[FAULT_SPEC_MAX];
    char why[320];
    memset(out, 0, sizeof(*out));
    if (spec == NULL || *spec == '\0')
        return fail(out, err, errlen, CDDP_EPARSE, "", "empty fault (" FAULT_USAGE ")");
    if (strlen(spec) >= sizeof(buf))
        return fail(out, err, errlen, CDDP_ERANGE_ARG, "...", "fault spec too long");
    cddp_strlcpy(buf, spec, sizeof(buf));

    char *at = strchr(buf, '@');
    if (at == NULL)
        return fail(out, err, errlen, CDDP_EPARSE, spec, "missing '@' (" FAULT_USAGE ")");
    *at = '\0';
    struct trn_fault f = {.kind = TRN_FAULT_NONE,
                          .step = -1,
                          .rank = -1,
                          .rank_last = -1,
                          .ms = 0,
                          .count = 1,
                          .every = false};
    if (strcmp(buf, "crash") == 0)
        f.kind = TRN_FAULT_CRASH;
    else if (strcmp(buf, "hang") == 0)
        f.kind = TRN_FAULT_HANG;
    else if (strcmp(buf, "slow") == 0)
        f.kind = TRN_FAULT_SLOW;
    else if (strcmp(buf, "nocma") == 0)
        f.kind = TRN_FAULT_NOCMA;
    else {
        snprintf(why, sizeof(why), "unknown fault kind '%s' (" FAULT_USAGE ")", buf);
        return fail(out, err, errlen, CDDP_EPARSE, spec, why);
    }

    bool have_rank = false;
    bool have_ms = false;
    bool have_for = false;
    char *p = at + 1;
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma != NULL)
            *comma = '\0';
        if (*p == '\0')
            return fail(out, err, errlen, CDDP_EPARSE, spec, "empty field");
        char *eq = strchr(p, '=');
        if (eq == NULL && strcmp(p, "reform") == 0) {
            if (f.kind != TRN_FAULT_CRASH)
                return fail(out, err, errlen, CDDP_EPARSE, spec, "reform applies to crash only");
            if (f.at_reform)
                return fail(out, err, errlen, CDDP_EPARSE, spec, "'reform' given twice");
            f.at_reform = true;
        } else if (eq == NULL) {
            if (strcmp(p, "every") != 0) {
                snprintf(why, sizeof(why),
                         "unknown field '%s' (fields: step=, rank=, ms=, for=, every, reform)", p);
                return fail(out, err, errlen, CDDP_EPARSE, spec, why);
            }
            if (f.every)
                return fail(out, err, errlen, CDDP_EPARSE, spec, "'every' given twice");
            f.every = true;
        } else {
            *eq = '\0';
            const char *val = eq + 1;
            long v;
            int rc;
            if (strcmp(p, "step") == 0) {
                if (f.step >= 0)
                    return fail(out, err, errlen, CDDP_EPARSE, spec, "'step' given twice");
                rc = cddp_parse_long(val, 0, (1L << 62), &v);
                if (rc < 0) {
                    snprintf(why, sizeof(why), "step must be an integer >= 0, not '%s'", val);
                    return fail(out, err, errlen, rc, spec, why);
                }
                f.step = v;
            } else if (strcmp(p, "rank") == 0) {
                if (have_rank)
                    return fail(out, err, errlen, CDDP_EPARSE, spec, "'rank' given twice");
                /* rank=R, or rank=R-S: the ranks R to S (a node's, hung together) */
                char *dash = strchr(val, '-');
                if (dash != NULL)
                    *dash = '\0';
                long last = 0;
                rc = cddp_parse_long(val, 0, 1 << 24, &v);
                if (rc == 0 && dash != NULL)
                    rc = cddp_parse_long(dash + 1, 0, 1 << 24, &last);
                if (rc < 0 || (dash != NULL && last < v)) {
                    if (dash != NULL)
                        *dash = '-';
                    snprintf(why, sizeof(why),
                             "rank must be an integer >= 0 or a range R-S with R <= S, not '%s'",
                             val);
                    return fail(out, err, errlen, rc < 0 ? rc : CDDP_ERANGE_ARG, spec, why);
                }
                f.rank = (int)v;
                f.rank_last = dash != NULL ? (int)last : (int)v;
                have_rank = true;
            } else if (strcmp(p, "ms") == 0) {
                if (f.kind != TRN_FAULT_SLOW)
                    return fail(out, err, errlen, CDDP_EPARSE, spec, "ms= applies to slow only");
                if (have_ms)
                    return fail(out, err, errlen, CDDP_EPARSE, spec, "'ms' given twice");
                rc = cddp_parse_long(val, 1, 24L * 3600 * 1000, &v);
                if (rc < 0) {
                    snprintf(why, sizeof(why), "ms must be an integer in 1..86400000, not '%s'",
                             val);
                    return fail(out, err, errlen, rc, spec, why);
                }
                f.ms = v;
                have_ms = true;
            } else if (strcmp(p, "for") == 0) {
                if (f.kind != TRN_FAULT_SLOW)
                    return fail(out, err, errlen, CDDP_EPARSE, spec, "for= applies to slow only");
                if (have_for)
                    return fail(out, err, errlen, CDDP_EPARSE, spec, "'for' given twice");
                rc = cddp_parse_long(val, 1, (1L << 40), &v);
                if (rc < 0) {
                    snprintf(why, sizeof(why), "for must be a number of steps >= 1, not '%s'", val);
                    return fail(out, err, errlen, rc, spec, why);
                }
                f.count = v;
                have_for = true;
            } else {
                snprintf(why, sizeof(why),
                         "unknown field '%s' (fields: step=, rank=, ms=, for=, every)", p);
                return fail(out, err, errlen, CDDP_EPARSE, spec, why);
            }
        }
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    if (f.at_reform && (f.step >= 0 || f.every))
        return fail(out, err, errlen, CDDP_EPARSE, spec,
                    "crash@reform takes rank= only (it fires while re-forming, not at a step)");
    if (f.kind == TRN_FAULT_NOCMA && (f.step >= 0 || f.every || !have_rank))
        return fail(out, err, errlen, CDDP_EPARSE, spec,
                    "nocma takes rank= only (it fires while re-forming, not at a step)");
    if (f.step < 0 && !f.at_reform && f.kind != TRN_FAULT_NOCMA)
        return fail(out, err, errlen, CDDP_EPARSE, spec, "missing step=N");
    if (f.kind == TRN_FAULT_SLOW && !have_ms)
        return fail(out, err, errlen, CDDP_EPARSE, spec, "slow needs ms=M");
    *out = f;
    return 0;
}

/* Does f fire on `rank`? (-1: every rank; a struct not from the parser
 * may have rank_last 0: rank alone.) */
static bool on_rank(const struct trn_fault *f, int rank)
{
    int last = f->rank_last > f->rank ? f->rank_last : f->rank;
    return f->rank < 0 || (rank >= f->rank && rank <= last);
}

bool trn_fault_due(const struct trn_fault *f, long step, int rank, long restart_count)
{
    long count = f->count > 1 ? f->count : 1; /* (a struct not from the parser has 0) */
    if (f->kind == TRN_FAULT_NONE || f->kind == TRN_FAULT_NOCMA || f->at_reform || step < f->step ||
        step - f->step >= count)
        return false;
    if (!on_rank(f, rank))
        return false;
    return restart_count <= 0 || f->every;
}

void trn_fault_reform(const struct trn_fault *f, int rank, long generation)
{
    if (!f->at_reform || !on_rank(f, rank))
        return;
    log_error("T6105",
              "fault injection: crash while taking the state in generation %ld on rank %d "
              "(--fault crash@reform), exiting 1",
              generation, rank);
    fflush(stdout);
    _exit(CDDP_EXIT_FAILURE);
}

bool trn_fault_nocma(const struct trn_fault *f, int rank)
{
    return f->kind == TRN_FAULT_NOCMA && on_rank(f, rank);
}

void trn_fault_fire(const struct trn_fault *f, long step, int rank)
{
    switch (f->kind) {
    case TRN_FAULT_CRASH:
        log_error("T6101", "fault injection: crash at step %ld on rank %d (--fault), exiting 1",
                  step, rank);
        fflush(stdout);
        /* _exit: a crash does not run exit handlers or flush anyone's state. */
        _exit(CDDP_EXIT_FAILURE);
    case TRN_FAULT_HANG:
        log_error("T6102",
                  "fault injection: hang at step %ld on rank %d (--fault), blocking forever", step,
                  rank);
        fflush(stdout);
        for (;;)
            pause();
    case TRN_FAULT_SLOW: {
        if (f->count > 1 && step == f->step)
            log_warn("T6104",
                     "fault injection: sleeping %ld ms in each of %ld steps from step %ld on "
                     "rank %d (--fault)",
                     f->ms, f->count, step, rank);
        else if (f->count <= 1)
            log_warn("T6103", "fault injection: sleeping %ld ms at step %ld on rank %d (--fault)",
                     f->ms, step, rank);
        struct timespec ts = {.tv_sec = f->ms / 1000, .tv_nsec = (f->ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
        return;
    }
    case TRN_FAULT_NOCMA:
    case TRN_FAULT_NONE:
        return;
    }
}
