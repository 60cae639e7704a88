/*
 * msg.h: cddp protocol messages <-> JSON payloads (docs/protocol.md).
 *
 * Every payload is one JSON object with "v" (PROTO_VERSION) and "type".
 * Decoding is bounded before cJSON sees the bytes: nesting depth, number of
 * JSON values and string lengths; then every field is checked for presence,
 * type and range. Unknown versions and types are refused; unknown extra
 * fields are ignored, so later versions can add optional fields.
 *
 * Decoded strings point into the message (valid until proto_msg_free). To
 * encode, fill a struct proto_msg with your own pointers and call
 * proto_msg_encode; nothing is taken over.
 */
#ifndef CDDP_PROTO_MSG_H
#define CDDP_PROTO_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/strutil.h"

#define PROTO_VERSION 1

/* Bounds of the decoder (the wire limits of docs/protocol.md). */
#define PROTO_MAX_DEPTH 8            /* nesting of objects and arrays */
#define PROTO_MAX_VALUES 65536       /* JSON values in one message */
#define PROTO_MAX_ID 256             /* run_id, node_id, bytes */
#define PROTO_MAX_TEXT 4096          /* reasons, messages, host names */
#define PROTO_MAX_TOKEN 1024         /* join token */
#define PROTO_MAX_KEY 4096           /* store key */
#define PROTO_MAX_VALUE (512 * 1024) /* store value, raw bytes (base64 on the wire) */
#define PROTO_MAX_WAIT_KEYS 1024     /* keys in one wait */
#define PROTO_MAX_CONF 64            /* rdzv_conf entries in a join */
#define PROTO_MAX_NODES 1000000      /* min_nodes/max_nodes */
#define PROTO_MAX_REPLACED 255       /* a round's replaced ranks, as text */
#define PROTO_MAX_NPROC 65536        /* workers on one node */
#define PROTO_MAX_TIMEOUT_MS (7LL * 24 * 3600 * 1000)
#define PROTO_MAX_INT 9007199254740992LL /* 2^53: exact in a JSON number */
#define PROTO_MAX_STEP_S 86400.0         /* a step time in a heartbeat's perf, seconds */

/* XX(NAME, "wire name"). The order is not the wire format (names are). */
#define PROTO_TYPES(XX)                                                                            \
    XX(HELLO, "hello")                                                                             \
    XX(WELCOME, "welcome")                                                                         \
    XX(JOIN, "join")                                                                               \
    XX(JOINED, "joined")                                                                           \
    XX(HEARTBEAT, "heartbeat")                                                                     \
    XX(LEAVE, "leave")                                                                             \
    XX(FAILURE, "failure")                                                                         \
    XX(CLOSE, "close")                                                                             \
    XX(ROUND, "round")                                                                             \
    XX(RESTART, "restart")                                                                         \
    XX(CLOSED, "closed")                                                                           \
    XX(ERROR, "error")                                                                             \
    XX(SET, "set")                                                                                 \
    XX(GET, "get")                                                                                 \
    XX(WAIT, "wait")                                                                               \
    XX(ADD, "add")                                                                                 \
    XX(COMPARE_SET, "compare_set")                                                                 \
    XX(RESULT, "result")                                                                           \
    XX(STATUS, "status")                                                                           \
    XX(RESUME, "resume")                                                                           \
    XX(REPLACE, "replace")                                                                         \
    XX(GENERATION, "generation")                                                                   \
    XX(BLAME, "blame")

enum proto_type {
    PROTO_NONE = 0,
#define XX(name, str) PROTO_##name,
    PROTO_TYPES(XX)
#undef XX
        PROTO_TYPE_COUNT
};

/* "hello", ... ; "?" for an unknown value. */
const char *proto_type_name(enum proto_type t);

/* Binary data; base64 in JSON. */
struct proto_bytes {
    const char *data;
    size_t len;
};

struct proto_conf_kv {
    const char *key;
    const char *value;
};

/* The round a node is told about when its rendezvous completes. */
struct proto_round {
    const char *run_id;
    uint64_t round;  /* numbered from 1 per run (0: no round yet) */
    int node_rank;   /* 0..nnodes-1, torchrun's GROUP_RANK */
    int nnodes;      /* nodes in the round */
    int world_size;  /* sum of every node's nproc */
    int rank_offset; /* first global rank of this node (prefix sum of nproc) */
    int nproc;       /* this node's workers (LOCAL_WORLD_SIZE) */
    const char *master_addr;
    int master_port;
    /* Worker-failure restarts the run has had before this round (optional
     * on the wire, default 0): every node's TORCHELASTIC_RESTART_COUNT. */
    int64_t restart_count;
    /* > 0: this round goes on with the last round's worker group in place
     * (optional, default 0): the same node count, world size and node 0,
     * every member that stayed keeps its node rank and rank offset, and
     * the new members take the places of lost ones; replaced lists their
     * global ranks, decimal, comma-separated (at most PROTO_MAX_REPLACED
     * bytes). The generation counts such rounds since the group started
     * (docs/multi-node.md, "Replacing a node in place"). */
    int64_t generation;
    const char *replaced; /* NULL or "" when generation is 0 */
};

/* A node's join: what it asks for. */
struct proto_join {
    const char *node_id;    /* unique in the run, e.g. "host_pid_0" */
    int nproc;              /* 1..PROTO_MAX_NPROC */
    int min_nodes;          /* 1..max_nodes */
    int max_nodes;          /* min_nodes..PROTO_MAX_NODES */
    const char *local_addr; /* --local_addr, or NULL */
    const char *hostname;   /* how others can reach this node, or NULL */
    int master_port;        /* the port this node would serve MASTER_PORT on */
    /* Optional: the agent's status port (--status_port), 0 when it serves
     * none; shown in the server's /status so cddpctl job can ask each
     * node's agent for its workers. */
    int status_port;
    /* Optional: the last round this node ran in, its node count, and
     * the job's counted restarts as this node knows them (0 when
     * none); a run that has had no round yet (a restarted server)
     * continues from there. */
    uint64_t round;
    int last_nnodes;
    int64_t restart_count;
    size_t nconf;
    const struct proto_conf_kv *conf; /* rdzv_conf, values as strings */
};

/* An agent's summary of its ranks' step times, sent with its heartbeats
 * (optional: older agents send none) so that the server can name a node
 * slower than the job's others (docs/protocol.md, "heartbeat"). */
struct proto_perf {
    int ranks;        /* local ranks measured (1..PROTO_MAX_NPROC) */
    double step_s;    /* their median seconds a step */
    double compute_s; /* their median compute seconds a step; < 0: not reported */
    int max_rank;     /* the global rank of its slowest one */
    double factor;    /* the agent's --straggler_factor (> 1) */
};

/* An agent's goodput totals (agent/goodput.h: where its wall time went),
 * sent with its heartbeats (optional: older agents send none) so that the
 * server can sum them job-wide (docs/protocol.md, "heartbeat"). Unlike the
 * other fields, a bad "goodput" does not fail the message: the decoder
 * leaves has_goodput false and says why in goodput_error. */
#define PROTO_GOODPUT_PHASES 6
#define PROTO_MAX_GOODPUT_S 4e9 /* seconds in one phase: about 126 years */
struct proto_goodput {
    /* seconds per phase, in agent/goodput.h's order: init, productive,
     * lost, restart, rendezvous, stopped (wire: "init_s", ...) */
    double s[PROTO_GOODPUT_PHASES];
    int64_t lost_steps; /* steps computed and then redone */
    int64_t step;       /* the highest step its workers reported; -1: none */
};

/* "init", "productive", ... ; "?" out of range. */
const char *proto_goodput_phase_name(int phase);
/* Reads a "goodput" object: every phase a number in 0..PROTO_MAX_GOODPUT_S
 * (missing: 0), lost_steps and step integers in range. 0, or
 * CDDP_EPROTO_FIELD with one line in err (*g is then not to be used). */
int proto_goodput_from_json(const cJSON *o, struct proto_goodput *g, char *err, size_t errlen);
/* Writes g as a JSON object into buf; the length, or CDDP_EPROTO_FIELD (a
 * value out of range) or CDDP_ETOOBIG (buf too small). */
int proto_goodput_to_json(const struct proto_goodput *g, char *buf, size_t len);

struct proto_msg {
    enum proto_type type;
    /* Request id of store ops and status, echoed in their result. */
    uint64_t id;
    union {
        struct {
            const char *token;  /* may be NULL */
            const char *run_id; /* "" for a plain store */
            const char *client; /* free text, e.g. "cddprun 0.1.0" (may be NULL) */
            /* Optional: answer this connection's heartbeats (a server that
             * does says so in welcome), so the client can tell a silent
             * server from a quiet one. */
            bool heartbeat_ack;
        } hello;
        struct {
            const char *server;
            bool heartbeat_ack; /* optional: heartbeats will be answered */
            bool resume;        /* optional: the server understands "resume" */
            bool generations;   /* optional: the server understands "replace" and "blame" */
            bool replace_ranks; /* optional: ... and replace's "ranks" (several at once) */
        } welcome;
        struct {
            /* Server to agent only (an answer to a heartbeat), optional: the
             * length of the wait list of the connection's run. */
            bool has_waiting;
            int64_t waiting;
            /* Agent to server only, optional: its ranks' step times. */
            bool has_perf;
            struct proto_perf perf;
            /* Agent to server only, optional: its goodput totals; a bad
             * one is dropped, and goodput_error says why ("" when not). */
            bool has_goodput;
            struct proto_goodput goodput;
            char goodput_error[128];
        } heartbeat;
        struct {
            const char *node_id; /* the node, as it joined on a connection now lost */
            uint64_t round;      /* the round it runs in */
            /* Optional (both or neither): what a restarted server needs to
             * rebuild that round: the join this node would send, and the
             * round message it got (member.round == round). */
            bool rebuild;
            struct proto_join join;
            struct proto_round member;
        } resume;
        struct proto_join join;
        struct {
            uint64_t round;
            bool waiting; /* on the wait list (round running and full, or closed to it) */
        } joined;
        struct {
            const char *reason; /* may be NULL */
            /* leave only: this node's workers succeeded; the others go on
             * without it (no restart). Optional on the wire. */
            bool finished;
        } leave, close, closed;
        struct {
            uint64_t round;
            const char *reason;
        } failure;
        /* Agent to server (--restart_scope=worker): this node restarts the
         * worker of global rank `rank` alone in `round`, and asks for the
         * group's next generation (docs/protocol.md, "replace"). */
        struct {
            uint64_t round;
            int rank;
            /* Optional (a server whose welcome said replace_ranks): every
             * global rank of this node to restart together in the one
             * generation, decimal, comma-separated, ascending, `rank` the
             * first ("5,7": a node's ranks hung together); NULL: rank alone. */
            const char *ranks;
            const char *reason; /* may be NULL */
        } replace;
        /* Server to agents: the answer to a replace. Granted (generation
         * > 0): to every node of the round, which goes on in place with
         * `replaced` restarted by node_id's agent. Refused (generation 0,
         * refused says why): to the asking node only, which then fails its
         * group as without worker scope. */
        struct {
            uint64_t round;
            int64_t generation;
            const char *replaced; /* decimal global ranks, comma-separated */
            const char *node_id;  /* the node that asked */
            const char *refused;  /* NULL when granted */
            /* granted (optional, default 0): the run's counted restarts,
             * this one included */
            int64_t restart_count;
        } generation;
        /* Agent to server, and server to the agent that runs `rank`
         * (--restart_scope=worker): a worker of the sender's named global
         * rank `rank` as never reaching a collective of `generation`
         * (docs/protocol.md, "blame"). node_id: the sender (server to
         * agent only). */
        struct {
            uint64_t round;
            int rank;
            int64_t generation;
            const char *node_id;
        } blame;
        struct proto_round round;
        struct {
            uint64_t round;     /* the new round to join */
            const char *reason; /* "node_lost", "node_joined", "node_left", "worker_failure", ... */
            const char *node_id;   /* the node that caused it, or NULL */
            bool counted;          /* counts against --max_restarts (worker failures) */
            int64_t restart_count; /* the run's counted restarts, this one included (optional) */
        } restart;
        struct {
            int code; /* a CDDP_* or -errno code */
            const char *message;
        } error;
        struct {
            const char *key;
            struct proto_bytes value;
        } set;
        struct {
            const char *key;
            int64_t timeout_ms; /* < 0: do not wait for a missing key */
        } get;
        struct {
            const char *const *keys;
            size_t nkeys;
            int64_t timeout_ms; /* < 0: no timeout */
        } wait;
        struct {
            const char *key;
            int64_t delta;
        } add;
        struct {
            const char *key;
            struct proto_bytes expected;
            struct proto_bytes desired;
        } compare_set;
        struct {
            int code;            /* 0, or the error of the request */
            const char *message; /* with code != 0 */
            bool has_value;
            struct proto_bytes value; /* get, compare_set */
            bool has_number;
            int64_t number; /* add */
            cJSON *status;  /* status: an object (encode: borrowed; decode: owned by the msg) */
        } result;
    };

    /* Decoded messages own these; encode ignores them. */
    cJSON *json;
    void *mem;
};

/* Decodes one payload. On error returns CDDP_EPARSE (not JSON), CDDP_ETOOBIG
 * (a bound exceeded), CDDP_EPROTO_VERSION, CDDP_EPROTO_TYPE or
 * CDDP_EPROTO_FIELD, writes one line naming the problem into err, and leaves
 * nothing to free. On success call proto_msg_free. */
int proto_msg_decode(const char *payload, size_t len, struct proto_msg *m, char *err,
                     size_t errlen);

/* Frees what a decoded message owns; harmless on a zeroed message. */
void proto_msg_free(struct proto_msg *m);

/* Appends m as one frame (header + JSON) to out. 0, CDDP_ETOOBIG, CDDP_EPROTO_FIELD
 * (a field out of range or too long) or -ENOMEM; out is unchanged on error. */
int proto_msg_encode(const struct proto_msg *m, struct cddp_buf *out);

/* The JSON payload alone, as a NUL-terminated string the caller frees with
 * free(). NULL on error (*err says why). */
char *proto_msg_to_json(const struct proto_msg *m, int *err);

/* Error names on the wire: "ETIMEOUT", "ECONNRESET", ... <-> codes. Unknown
 * names map to CDDP_EPEER. */
const char *proto_error_name(int code);
int proto_error_code(const char *name);

/* Standard base64 with padding. encode writes a NUL-terminated string of
 * proto_base64_len(n) chars; decode is strict (no whitespace, canonical
 * padding) and returns the decoded length or CDDP_EPARSE. */
static inline size_t proto_base64_len(size_t n)
{
    return (n + 2) / 3 * 4;
}
void proto_base64_encode(const void *src, size_t n, char *dst);
long proto_base64_decode(const char *src, size_t n, void *dst, size_t dstlen);

#endif
