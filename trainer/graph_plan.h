/*
 * graph_plan.h: when --cuda-graphs warms up, captures, replays or runs a
 * piece of the training step uncaptured, and what the host must advance
 * when a graph replays. Pure (no CUDA): train.c carries the decisions out
 * with the backend's graph ops (ops.h, trainer/ops/cuda/graph.cu);
 * tests/unit/test_graph_plan.c covers it.
 *
 * A step is two kinds of graph: MICRO, one micro-batch's forward and
 * backward (keyed by the batch shape, whether it accumulates into the
 * gradients, and the device address of the input it reads), and OPT, the
 * fp16 unscale and the SGD update over the flat buffers (one key). The
 * values that change from step to step (the learning rate, the loss scale
 * and its inverse, the labels, the input) are read from fixed device
 * memory that the host writes before the launch, so one graph serves
 * every step of its key, and a new loss scale does not invalidate it.
 *
 * A key is captured after `warmup` clean uncaptured runs in a row: a run
 * is clean when the backend's memory (its scratch generation, the model's
 * activation arena) did not change during it, which is what shows that
 * cuDNN's algorithm search, every scratch growth and cuBLAS's lazy set-up
 * are behind us (a growth frees memory a graph would point into, and
 * synchronises, which a capture cannot). A run that is not eligible (the
 * epoch's last short batch; OPT before the first SGD step, which fills the
 * momentum) runs uncaptured and does not count. When the memory
 * fingerprint differs from the one the graphs were captured against, every
 * graph is dropped (the caller destroys them) and the keys warm up again.
 * At most TRN_GRAPH_MAX keys are held; past that a new key runs
 * uncaptured.
 */
#ifndef CDDP_TRAINER_GRAPH_PLAN_H
#define CDDP_TRAINER_GRAPH_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#define TRN_GRAPH_MAX 8
#define TRN_GRAPH_WARMUP 2 /* clean uncaptured runs of a key before its capture */

enum trn_graph_kind {
    TRN_GRAPH_MICRO, /* forward + backward of one micro-batch */
    TRN_GRAPH_OPT,   /* unscale (fp16) + SGD */
};

struct trn_graph_key {
    enum trn_graph_kind kind;
    int n, h, w;     /* MICRO: the batch shape (0 for OPT) */
    bool accumulate; /* MICRO: adds into the gradients (a later micro-batch of a step) */
    uint64_t input;  /* MICRO: the device address of the input batch it reads */
};

/* What the graphs point into: if any of it changes, they are stale. */
struct trn_graph_env {
    uint64_t backend_gen; /* the backend's scratch generation (grows only) */
    uint64_t arena;       /* the model's activation arena: address */
    uint64_t arena_bytes; /* and size */
};

enum trn_graph_action {
    TRN_GRAPH_RUN,     /* run it uncaptured (warm-up, not eligible, or no room) */
    TRN_GRAPH_CAPTURE, /* capture it into a graph, then launch that */
    TRN_GRAPH_REPLAY,  /* launch the graph captured before */
};

struct trn_graph_entry {
    struct trn_graph_key key;
    bool used;
    bool captured;
    int clean_runs; /* clean uncaptured runs in a row */
};

struct trn_graph_plan {
    int warmup;
    struct trn_graph_entry e[TRN_GRAPH_MAX];
    struct trn_graph_env env; /* the captured graphs' (any captured) */
    /* for the closing line */
    long captures, replays, uncaptured, invalidations;
};

/* Whether two envs are the same memory (a graph captured against one is
 * valid against the other). */
bool trn_graph_env_same(const struct trn_graph_env *a, const struct trn_graph_env *b);

/* An empty plan; warmup < 1 is taken as 1. */
void trn_graph_plan_init(struct trn_graph_plan *p, int warmup);

/* Call before deciding: when a graph is held and env differs from the one
 * it was captured against, every graph is dropped. Returns the slots whose
 * graphs the caller must destroy (bit i: slot i), 0 when none. */
unsigned trn_graph_check_env(struct trn_graph_plan *p, const struct trn_graph_env *env);

/* What to do with key now. *slot is its slot for CAPTURE and REPLAY (-1
 * for RUN). eligible false: RUN, and the run is not a warm-up. */
enum trn_graph_action trn_graph_decide(struct trn_graph_plan *p, const struct trn_graph_key *key,
                                       bool eligible, int *slot);

/* After an eligible uncaptured run of key: clean says the env was the
 * same after it as before. */
void trn_graph_ran(struct trn_graph_plan *p, const struct trn_graph_key *key, bool clean);

/* After slot was captured (and launched) against env. */
void trn_graph_captured(struct trn_graph_plan *p, int slot, const struct trn_graph_env *env);

/* After slot's graph was launched again. */
void trn_graph_replayed(struct trn_graph_plan *p, int slot);

/*
 * The host-side state a launch leaves behind, to be advanced by hand:
 * bn_forwards, how many training forwards each batch norm's host
 * num_batches_tracked must count (a replayed MICRO: 1; a capture ran the
 * host code once, which counted it; an uncaptured run counts itself);
 * optimizer_steps, what the model's optimizer step count gains (OPT by a
 * graph, captured or replayed, when the step was taken, i.e. no inf/NaN
 * under fp16: the capture ran no host bookkeeping for it; uncaptured, the
 * SGD call counts itself).
 */
struct trn_graph_host_step {
    int bn_forwards;
    int optimizer_steps;
};
struct trn_graph_host_step trn_graph_host_advance(enum trn_graph_kind kind,
                                                  enum trn_graph_action action, bool step_taken);

#endif
