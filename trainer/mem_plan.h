/*
 * mem_plan.h: placing a step's buffers in one arena, for a shape known in
 * advance (resnet.c's activations and backward scratch, on either backend:
 * allocated once per shape, never inside a step; on CUDA, cudaMalloc
 * synchronises the device).
 *
 * Each request is a size and a lifetime: the first and last position (in
 * the order the step runs its ops) at which the buffer is live, inclusive.
 * Two requests whose lifetimes overlap get disjoint byte ranges; two that
 * do not may share. The placement is greedy (largest first, each at the
 * lowest aligned offset clear of the already placed requests it overlaps
 * in time), which is what TensorFlow's and PyTorch's static planners do
 * too; it is not optimal, and it is deterministic.
 *
 * Pure C: unit-tested on the CPU (tests/unit/test_mem_plan.c).
 * Not thread-safe (the sort's comparator reads a static).
 */
#ifndef CDDP_TRAINER_MEM_PLAN_H
#define CDDP_TRAINER_MEM_PLAN_H

#include <stddef.h>

struct trn_mem_req {
    size_t bytes;    /* 0: placed at offset 0, takes no room */
    int first, last; /* lifetime, inclusive; first <= last */
    size_t offset;   /* out: where it starts in the arena */
};

/*
 * Fills every request's offset (a multiple of align, a power of two) and
 * returns the arena's size in bytes. Returns (size_t)-1 without placing
 * anything when align is not a power of two, a lifetime is empty, or the
 * sizes overflow.
 */
size_t trn_mem_plan(struct trn_mem_req *reqs, int n, size_t align);

/* The most bytes live at one position (a lower bound for any plan's size). */
size_t trn_mem_peak_live(const struct trn_mem_req *reqs, int n);

#endif
