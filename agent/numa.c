/* numa.c: see numa.h. */
#include "agent/numa.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/log.h"
#include "common/strutil.h"

#define MAX_GPUS 64

int agent_numa_parse_list(const char *text, cpu_set_t *set)
{
    CPU_ZERO(set);
    const char *p = text;
    while (*p && *p != '\n') {
        char *end;
        long lo = strtol(p, &end, 10);
        if (end == p || lo < 0 || lo >= CPU_SETSIZE)
            return CDDP_EPARSE;
        long hi = lo;
        p = end;
        if (*p == '-') {
            hi = strtol(p + 1, &end, 10);
            if (end == p + 1 || hi < lo || hi >= CPU_SETSIZE)
                return CDDP_EPARSE;
            p = end;
        }
        for (long i = lo; i <= hi; i++)
            CPU_SET((int)i, set);
        if (*p == ',')
            p++;
        else if (*p && *p != '\n')
            return CDDP_EPARSE;
    }
    return 0;
}

void agent_numa_format_list(const cpu_set_t *set, char *out, size_t len)
{
    size_t n = 0;
    out[0] = '\0';
    for (int i = 0; i < CPU_SETSIZE; i++) {
        if (!CPU_ISSET(i, set))
            continue;
        int j = i;
        while (j + 1 < CPU_SETSIZE && CPU_ISSET(j + 1, set))
            j++;
        int w = j > i ? snprintf(out + n, len - n, "%s%d-%d", n ? "," : "", i, j)
                      : snprintf(out + n, len - n, "%s%d", n ? "," : "", i);
        if (w < 0 || (size_t)w >= len - n)
            return; /* cut: the log line only */
        n += (size_t)w;
        i = j;
    }
}

/* root + path into buf (NUL-terminated, trailing whitespace kept). 0 or
 * CDDP_ENOTFOUND with why. */
static int read_text(const char *root, const char *path, char *buf, size_t len, char *why,
                     size_t whylen)
{
    char full[4096];
    snprintf(full, sizeof(full), "%s%s", root, path);
    FILE *f = fopen(full, "r");
    if (f == NULL)
        return cddp_fail(why, whylen, CDDP_ENOTFOUND, "--numa_binding: cannot read %s: %s", full,
                         strerror(errno));
    size_t n = fread(buf, 1, len - 1, f);
    fclose(f);
    buf[n] = '\0';
    return 0;
}

/* A sysfs file under root: a list into set, or (set NULL) a number into v. */
static int read_sysfs(const char *root, const char *path, cpu_set_t *set, long *v, char *why,
                      size_t whylen)
{
    char buf[4096];
    int rc = read_text(root, path, buf, sizeof(buf), why, whylen);
    if (rc)
        return rc;
    char *t = cddp_strip(buf);
    if (set ? agent_numa_parse_list(t, set) != 0 : cddp_parse_long(t, -1, 1L << 30, v) != 0)
        return cddp_fail(why, whylen, CDDP_EPARSE, "--numa_binding: %s%s: '%s' is not %s", root,
                         path, t, set ? "a list" : "a number");
    return 0;
}

static int read_list(const char *root, const char *path, cpu_set_t *set, char *why, size_t whylen)
{
    return read_sysfs(root, path, set, NULL, why, whylen);
}

static int read_int(const char *root, const char *path, long *v, char *why, size_t whylen)
{
    return read_sysfs(root, path, NULL, v, why, whylen);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The GPUs CUDA would number 0, 1, ...: PCI order, narrowed by
 * CUDA_VISIBLE_DEVICES. Fills addr[] (each 32 bytes); returns the count or
 * a negative code with why. */
static int visible_gpus(const char *root, const char *cuda_visible, char addr[][32], char *why,
                        size_t whylen)
{
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s/proc/driver/nvidia/gpus", root);
    char names[MAX_GPUS][32];
    char *sorted[MAX_GPUS];
    int n = 0;
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL && n < MAX_GPUS) {
            if (e->d_name[0] == '.' || strlen(e->d_name) >= 32)
                continue;
            cddp_strlcpy(names[n], e->d_name, 32);
            sorted[n] = names[n];
            n++;
        }
        closedir(d);
    }
    qsort(sorted, (size_t)n, sizeof(sorted[0]), cmp_str);
    if (cuda_visible == NULL) {
        for (int i = 0; i < n; i++)
            cddp_strlcpy(addr[i], sorted[i], 32);
        return n;
    }
    int m = 0;
    const char *p = cuda_visible;
    while (*p && m < MAX_GPUS) {
        char item[64];
        const char *c = strchr(p, ',');
        size_t l = c ? (size_t)(c - p) : strlen(p);
        if (l >= sizeof(item))
            l = sizeof(item) - 1;
        memcpy(item, p, l);
        item[l] = '\0';
        long idx;
        char *it = cddp_strip(item);
        /* CUDA stops at the first entry that names no device. */
        if (*it == '\0' || (it[0] == '-' && it[1] != '\0'))
            break;
        if (cddp_parse_long(it, 0, MAX_GPUS - 1, &idx) != 0)
            return cddp_fail(why, whylen, CDDP_ECONFIG,
                             "--numa_binding: CUDA_VISIBLE_DEVICES=%s: '%s' is not a device index "
                             "(UUIDs and MIG names cannot be matched to sysfs)",
                             cuda_visible, it);
        if (idx < n)
            cddp_strlcpy(addr[m++], sorted[idx], 32);
        if (c == NULL)
            break;
        p = c + 1;
    }
    return m;
}

static int gpu_node(const char *root, const char *addr, char *why, size_t whylen)
{
    char path[256];
    long v;
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", addr);
    int rc = read_int(root, path, &v, why, whylen);
    if (rc)
        return rc;
    return v < 0 ? 0 : (int)v; /* -1 on machines with one node: node 0 (torch) */
}

/* The allowed CPUs of node. */
static int node_cpus(const char *root, int node, const cpu_set_t *allowed, cpu_set_t *out,
                     char *why, size_t whylen)
{
    char path[128];
    snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/cpulist", node);
    int rc = read_list(root, path, out, why, whylen);
    if (rc)
        return rc;
    CPU_AND(out, out, allowed);
    return 0;
}

static int first_cpu(const cpu_set_t *s)
{
    for (int i = 0; i < CPU_SETSIZE; i++) {
        if (CPU_ISSET(i, s))
            return i;
    }
    return -1;
}

/* The smallest CPU in the sysfs list at /sys/devices/system/cpu/cpu<c>/<rel>:
 * the key that names a core (thread_siblings_list) or a cache. */
static int group_key(const char *root, int cpu, const char *rel, char *why, size_t whylen)
{
    char path[256];
    cpu_set_t s;
    snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/%s", cpu, rel);
    int rc = read_list(root, path, &s, why, whylen);
    if (rc)
        return rc;
    int k = first_cpu(&s);
    return k < 0 ? cpu : k;
}

/* The shared_cpu_list of cpu's highest Unified or Data cache, as a path
 * relative to its cpu folder, into rel. */
static int last_level_cache(const char *root, int cpu, char *rel, size_t len, char *why,
                            size_t whylen)
{
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s/sys/devices/system/cpu/cpu%d/cache", root, cpu);
    DIR *d = opendir(dir);
    if (d == NULL)
        return cddp_fail(why, whylen, CDDP_ENOTFOUND, "--numa_binding: cannot read %s: %s", dir,
                         strerror(errno));
    long best = -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "index", 5) != 0 || e->d_name[5] == '\0')
            continue;
        char path[512], type[64];
        long level;
        snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/cache/%s/type", cpu, e->d_name);
        if (read_text(root, path, type, sizeof(type), why, whylen) != 0)
            continue;
        cddp_strip(type);
        if (strcmp(type, "Unified") != 0 && strcmp(type, "Data") != 0)
            continue;
        snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/cache/%s/level", cpu,
                 e->d_name);
        if (read_int(root, path, &level, why, whylen) != 0 || level <= best)
            continue;
        best = level;
        snprintf(rel, len, "cache/%.64s/shared_cpu_list", e->d_name);
    }
    closedir(d);
    if (best < 0)
        return cddp_fail(why, whylen, CDDP_ENOTFOUND,
                         "--numa_binding: cpu%d has no data cache in %s", cpu, dir);
    return 0;
}

/* CPUs of cpus grouped by key (0: physical core, 1: last-level cache):
 * keys[i] is group i's key, groups[i] its CPUs. Returns the count or a
 * negative code. */
static int group_cpus(const char *root, const cpu_set_t *cpus, int by, int *keys, cpu_set_t *groups,
                      int max, char *why, size_t whylen)
{
    int n = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, cpus))
            continue;
        char rel[128] = "topology/thread_siblings_list";
        int rc = by == 1 ? last_level_cache(root, c, rel, sizeof(rel), why, whylen) : 0;
        int key = rc ? rc : group_key(root, c, rel, why, whylen);
        if (key < 0)
            return key;
        int g = 0;
        while (g < n && keys[g] != key)
            g++;
        if (g == n) {
            if (n == max)
                return cddp_fail(why, whylen, CDDP_ETOOBIG, "--numa_binding: too many groups");
            keys[n] = key;
            CPU_ZERO(&groups[n]);
            n++;
        }
        CPU_SET(c, &groups[g]);
    }
    return n;
}

static void set_mem(struct agent_numa_plan *plan, int node)
{
    size_t bits = 8 * sizeof(plan->mems[0]);
    if (node >= 0 && node < AGENT_NUMA_MAX_NODES)
        plan->mems[(size_t)node / bits] |= 1UL << ((size_t)node % bits);
}

int agent_numa_plan(const char *root, const char *mode, int gpu_index, const char *cuda_visible,
                    const cpu_set_t *allowed, struct agent_numa_plan *plan, char *why,
                    size_t whylen)
{
    memset(plan, 0, sizeof(*plan));
    CPU_ZERO(&plan->cpus);
    plan->node = -1;
    cpu_set_t online;
    int rc = read_list(root, "/sys/devices/system/node/online", &online, why, whylen);
    if (rc)
        return rc;
    if (CPU_COUNT(&online) <= 1) {
        snprintf(why, whylen,
                 "--numa_binding=%s: this machine has one NUMA node; there is nothing to bind",
                 mode);
        return 0;
    }
    static char addr[MAX_GPUS][32];
    int ngpus = visible_gpus(root, cuda_visible, addr, why, whylen);
    if (ngpus < 0)
        return ngpus;
    if (gpu_index < 0 || gpu_index >= ngpus)
        return cddp_fail(why, whylen, CDDP_ECONFIG,
                         "--numa_binding=%s: local rank %d has no GPU %d to be near (%d visible)",
                         mode, gpu_index, gpu_index, ngpus);
    int node = gpu_node(root, addr[gpu_index], why, whylen);
    if (node < 0)
        return node;
    plan->node = node;
    cddp_strlcpy(plan->gpu, addr[gpu_index], sizeof(plan->gpu));
    cpu_set_t cpus;
    if ((rc = node_cpus(root, node, allowed, &cpus, why, whylen)) != 0)
        return rc;

    if (strcmp(mode, "node") == 0) {
        plan->cpus = cpus;
        set_mem(plan, node);
    } else if (strcmp(mode, "socket") == 0) {
        char path[128];
        long socket, other;
        int c = first_cpu(&cpus);
        snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/topology/physical_package_id",
                 c < 0 ? 0 : c);
        if (c < 0)
            goto empty;
        if ((rc = read_int(root, path, &socket, why, whylen)) != 0)
            return rc;
        for (int n = 0; n < CPU_SETSIZE; n++) {
            cpu_set_t nc;
            if (!CPU_ISSET(n, &online) || node_cpus(root, n, allowed, &nc, why, whylen) != 0)
                continue;
            int f = first_cpu(&nc);
            if (f < 0)
                continue;
            snprintf(path, sizeof(path),
                     "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", f);
            if (read_int(root, path, &other, why, whylen) == 0 && other == socket) {
                CPU_OR(&plan->cpus, &plan->cpus, &nc);
                set_mem(plan, n);
            }
        }
    } else if (strcmp(mode, "exclusive") == 0 || strcmp(mode, "core-complex") == 0) {
        /* This GPU's place among the node's GPUs (in CUDA's order). */
        int rel = 0, on_node = 0;
        for (int g = 0; g < ngpus; g++) {
            char ignore[256];
            if (gpu_node(root, addr[g], ignore, sizeof(ignore)) != node)
                continue;
            rel += g < gpu_index;
            on_node++;
        }
        static int keys[CPU_SETSIZE];
        static cpu_set_t groups[CPU_SETSIZE];
        bool excl = mode[0] == 'e';
        int ng = group_cpus(root, &cpus, excl ? 0 : 1, keys, groups, CPU_SETSIZE, why, whylen);
        if (ng < 0)
            return ng;
        if (ng == 0)
            goto empty;
        if (excl) {
            /* Cores in key order; each GPU a slice, the first ones one more. */
            int order[CPU_SETSIZE];
            for (int i = 0; i < ng; i++)
                order[i] = i;
            for (int i = 1; i < ng; i++)
                for (int j = i; j > 0 && keys[order[j]] < keys[order[j - 1]]; j--) {
                    int t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
            int per = ng / on_node, extra = ng % on_node;
            if (per < 1)
                return cddp_fail(why, whylen, CDDP_ECONFIG,
                                 "--numa_binding=exclusive: NUMA node %d has %d physical cores for "
                                 "%d GPUs",
                                 node, ng, on_node);
            int start = rel * per + (rel < extra ? rel : extra);
            int end = start + per + (rel < extra ? 1 : 0);
            for (int i = start; i < end; i++)
                CPU_OR(&plan->cpus, &plan->cpus, &groups[order[i]]);
        } else {
            /* Caches with more CPUs first, then by their lowest CPU. */
            int order[CPU_SETSIZE];
            for (int i = 0; i < ng; i++)
                order[i] = i;
            for (int i = 1; i < ng; i++)
                for (int j = i; j > 0; j--) {
                    int a = order[j], b = order[j - 1];
                    int ca = CPU_COUNT(&groups[a]), cb = CPU_COUNT(&groups[b]);
                    if (!(ca > cb || (ca == cb && keys[a] < keys[b])))
                        break;
                    order[j] = b;
                    order[j - 1] = a;
                }
            plan->cpus = groups[order[rel % ng]];
        }
        set_mem(plan, node);
    } else {
        return cddp_fail(why, whylen, CDDP_EPARSE, "--numa_binding: unknown mode '%s'", mode);
    }
    if (CPU_COUNT(&plan->cpus) == 0)
        goto empty;
    plan->bind = true;
    agent_numa_format_list(&plan->cpus, plan->cpulist, sizeof(plan->cpulist));
    cpu_set_t nodes;
    CPU_ZERO(&nodes);
    size_t bits = 8 * sizeof(plan->mems[0]);
    for (int n = 0; n < CPU_SETSIZE && n < AGENT_NUMA_MAX_NODES; n++) {
        if (plan->mems[(size_t)n / bits] & (1UL << ((size_t)n % bits)))
            CPU_SET(n, &nodes);
    }
    agent_numa_format_list(&nodes, plan->nodelist, sizeof(plan->nodelist));
    snprintf(why, whylen, "GPU %d (%s) is on NUMA node %d: CPUs %s, memory on node %s", gpu_index,
             plan->gpu, node, plan->cpulist, plan->nodelist);
    return 0;
empty:
    return cddp_fail(why, whylen, CDDP_ECONFIG,
                     "--numa_binding=%s: NUMA node %d has no CPU this agent may run on", mode,
                     node);
}

int agent_numa_plan_group(const char *mode, int n, struct agent_numa_plan **out, char *why,
                          size_t whylen)
{
    *out = NULL;
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0)
        CPU_ZERO(&allowed);
    struct agent_numa_plan *plans = calloc((size_t)n, sizeof(*plans));
    if (plans == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    for (int i = 0; i < n; i++) {
        char note[512] = "";
        int rc = agent_numa_plan("", mode, i, cvd, &allowed, &plans[i], note, sizeof(note));
        if (rc) {
            snprintf(why, whylen, "%s", note);
            free(plans);
            return rc;
        }
        if (!plans[i].bind) {
            log_warn("A2203", "%s", note);
            free(plans);
            return 0;
        }
        log_info("A2202", "--numa_binding=%s: local_rank %d: %s", mode, i, note);
    }
    *out = plans;
    return 0;
}
