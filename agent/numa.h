/*
 * numa.h: --numa_binding, torch/numa/binding.py's four modes read from sysfs.
 *
 * Each worker is bound to the CPUs near the GPU whose index is its local
 * rank (torch's assumption), and its memory to the same NUMA node(s):
 *
 *   node          every allowed CPU of the GPU's NUMA node
 *   socket        every allowed CPU of every NUMA node on the GPU's socket
 *   exclusive     the GPU's node's physical cores split evenly among the
 *                 node's GPUs (the lowest GPUs get one more when they do not
 *                 divide), every hardware thread of a core kept together
 *   core-complex  one group of CPUs sharing the last-level cache on the
 *                 GPU's node, a different one per GPU while there are enough
 *
 * Facts come from files only, under root (tests give a tree of their own;
 * "" is the machine): the GPUs are /proc/driver/nvidia/gpus/<pci address>
 * in PCI order (CUDA's order under CUDA_DEVICE_ORDER=PCI_BUS_ID), narrowed
 * by CUDA_VISIBLE_DEVICES (indices); a GPU's node is
 * /sys/bus/pci/devices/<address>/numa_node (-1 counts as 0, as torch);
 * nodes, CPUs, cores, sockets and caches are /sys/devices/system/{node,cpu}.
 * "allowed" is the agent's own affinity, which the caller passes. No CUDA,
 * no libnuma, no numactl.
 *
 * A machine with one NUMA node (online is "0") has nothing to bind: the
 * plan says so and binds nothing.
 */
#ifndef CDDP_AGENT_NUMA_H
#define CDDP_AGENT_NUMA_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>

#define AGENT_NUMA_MAX_NODES 1024

struct agent_numa_plan {
    bool bind; /* false: nothing to do (one NUMA node) */
    int node;  /* the GPU's NUMA node */
    cpu_set_t cpus;
    /* set_mempolicy(2)'s node mask: one bit per node */
    unsigned long mems[AGENT_NUMA_MAX_NODES / (8 * sizeof(unsigned long))];
    char gpu[32];      /* the GPU's PCI address */
    char cpulist[256]; /* cpus as ranges ("0-3,8"), for the log */
    char nodelist[64]; /* mems as ranges */
};

/*
 * Plans the binding of the worker that uses GPU gpu_index (its local rank)
 * under mode ("node", "socket", "exclusive", "core-complex"). cuda_visible
 * is the agent's CUDA_VISIBLE_DEVICES or NULL. Returns 0 with plan->bind
 * false (one node; why says so) or true, or a negative code with a one-line
 * reason in why (no such GPU, a sysfs file missing, UUIDs in
 * CUDA_VISIBLE_DEVICES, no allowed CPU left, ...).
 */
int agent_numa_plan(const char *root, const char *mode, int gpu_index, const char *cuda_visible,
                    const cpu_set_t *allowed, struct agent_numa_plan *plan, char *why,
                    size_t whylen);

/* --numa_binding=mode for local ranks 0..n-1 of this machine (sysfs, this
 * process's CPU affinity, CUDA_VISIBLE_DEVICES), each plan logged. *out:
 * n plans (the caller frees them), or NULL where nothing is bound (one NUMA
 * node: said once, in the log). 0, or a negative code with why filled. */
int agent_numa_plan_group(const char *mode, int n, struct agent_numa_plan **out, char *why,
                          size_t whylen);

/* Parses a sysfs list ("0-3,8,10-11\n") into set (cleared first). 0 or
 * CDDP_EPARSE. */
int agent_numa_parse_list(const char *text, cpu_set_t *set);

/* Writes set as a sysfs list into out. */
void agent_numa_format_list(const cpu_set_t *set, char *out, size_t len);

#endif
