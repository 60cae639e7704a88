/*
 * cma.h: reading a peer process' memory on the same host (cross-memory
 * attach: process_vm_readv), for the state transfer of a recovery in place
 * (inplace.c). A replacement takes the parameters and momentum of a
 * survivor on its host in one copy, without going through a socket: on
 * loopback TCP the two 45 MiB buffers of ResNet-18 were most of the
 * recovery's time (docs/benchmarks.md). The same technique as MPI's
 * intra-node CMA transports; anything that forbids it (a seccomp profile,
 * Yama's ptrace_scope 2 or 3, another pid namespace) makes the read fail,
 * and the state goes over the network instead.
 *
 * CDDP_CMA_DISABLE=1 turns it off (trn_cma_host_key returns 0).
 */
#ifndef CDDP_TRAINER_CMA_H
#define CDDP_TRAINER_CMA_H

#include <stddef.h>
#include <stdint.h>

/* A key naming this host, this boot and this pid namespace (a hash of the
 * host name, /proc/sys/kernel/random/boot_id and /proc/self/ns/pid): two
 * ranks with the same key can read each other's memory given their pids.
 * Never 0; 0 when CDDP_CMA_DISABLE is set to anything but "0" or "". */
uint64_t trn_cma_host_key(void);

/* Lets process `pid` read this one under Yama's ptrace_scope 1
 * (PR_SET_PTRACER; a no-op without Yama); pid 0 takes it back. */
void trn_cma_allow(int pid);

/* Copies `bytes` from address `addr` of process `pid` into dst, in as many
 * calls as it takes. 0, or a negative errno (EPERM, ESRCH, EFAULT, ENOSYS;
 * EIO when the peer's memory ends early). */
int trn_cma_read(int pid, void *dst, uint64_t addr, size_t bytes);

/* Zeroes buf twice over: in user space, then by the kernel (a read from
 * /dev/zero), so that neither the first step after a transfer nor the
 * transfer itself (whose copy the kernel makes) is the first to touch its
 * pages. Under shadow paging (a PVM guest, as the machine of
 * docs/benchmarks.md) the kernel's first write to a page faults even when
 * user space wrote it before: 0.1-0.2 s for ResNet-18's 45 MiB of
 * parameters, which a warm spare pays while it waits instead. */
void trn_cma_prepare(void *buf, size_t bytes);

#endif
