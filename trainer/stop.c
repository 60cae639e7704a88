/* stop.c: the grace period on SIGTERM / SIGINT; see stop.h. */
#include "trainer/stop.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"     /* log_error, log_warn, log_info */
#include "trainer/resnet.h" /* trn_resnet_pull */

static volatile sig_atomic_t stop_sig;       /* the signal to stop by, 0: none */
static volatile sig_atomic_t stop_arm;       /* a step ended: worth finishing the next */
static volatile sig_atomic_t stop_grace = 2; /* seconds */
static double longest_step_s;                /* main thread only */

static void die_by(int sig)
{
    signal(sig, SIG_DFL);
    raise(sig);
}

static void on_stop_signal(int sig)
{
    if (stop_sig || !stop_arm) {
        die_by(sig);
        return;
    }
    stop_sig = sig;
    alarm((unsigned)stop_grace);
}

static void on_stop_alarm(int sig)
{
    (void)sig;
    die_by(stop_sig ? stop_sig : SIGTERM);
}

void trn_stop_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sa.sa_handler = on_stop_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = on_stop_alarm;
    sigaction(SIGALRM, &sa, NULL);
}

void trn_stop_note_step(double step_s, double ckpt_s)
{
    if (step_s > longest_step_s)
        longest_step_s = step_s;
    double g = 3.0 * longest_step_s + ckpt_s + 2.0;
    stop_grace = g > 30.0 ? 30 : (int)ceil(g);
    stop_arm = 1;
}

void trn_stop_if_signalled(struct trn_resume *ckpt, int rank, int epoch, long step,
                           size_t rank_offset)
{
    if (!stop_sig)
        return;
    int sig = stop_sig;
    if (rank == 0) {
        char err[4096];
        trn_resnet_pull(ckpt->model);
        int rc = trn_resume_save(ckpt, 0, epoch, step, rank_offset, err, sizeof(err));
        if (rc < 0)
            log_error("T2010", "%s: %s", strsignal(sig), err);
        else
            log_warn("T2011", "%s: checkpoint at step %ld %s; stopping", strsignal(sig), step,
                     rc > 0 ? "written" : "already on disk");
    } else {
        log_info("T2012", "%s: stopping after step %ld", strsignal(sig), step);
    }
    fflush(stdout);
    fflush(stderr);
    die_by(sig);
}
