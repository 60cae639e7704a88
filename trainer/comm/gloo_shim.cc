// gloo_shim.cc: our collectives on Debian's libgloo (see gloo_shim.h).
//
// The only C++ in the project, kept to translation: a store adapter, the
// device and context set-up, one function per collective, and exceptions
// turned into error codes at the C boundary.
#include "trainer/comm/gloo_shim.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

extern "C" {
#include "common/errors.h"
}

struct trn_gloo {
    std::shared_ptr<gloo::transport::Device> dev;
    std::shared_ptr<gloo::rendezvous::Context> ctx;
};

namespace
{

std::chrono::milliseconds to_ms(double s)
{
    return std::chrono::milliseconds(static_cast<long long>(s * 1000.0 + 0.5));
}

// gloo's messages start with "[file:line] "; users want the words after it.
std::string strip_location(const std::string &msg)
{
    if (!msg.empty() && msg[0] == '[') {
        size_t end = msg.find("] ");
        if (end != std::string::npos)
            return msg.substr(end + 2);
    }
    return msg;
}

void one_line(char *dst, size_t len, const std::string &msg)
{
    std::string s = strip_location(msg);
    std::replace(s.begin(), s.end(), '\n', ' ');
    std::snprintf(dst, len, "%s", s.c_str());
}

// gloo's rendezvous::Store over our trn_kv (bootstrap store or test table).
class KvStore : public gloo::rendezvous::Store
{
  public:
    KvStore(trn_kv *kv, std::string prefix, double timeout_s)
        : kv_(kv), prefix_(std::move(prefix)), timeout_s_(timeout_s)
    {
    }

    void set(const std::string &key, const std::vector<char> &data) override
    {
        std::string k = prefix_ + key;
        int rc = kv_->ops->set(kv_, k.c_str(), data.data(), data.size());
        if (rc < 0)
            fail("set", k, rc);
    }

    std::vector<char> get(const std::string &key) override
    {
        std::string k = prefix_ + key;
        void *val = nullptr;
        size_t len = 0;
        int rc = kv_->ops->get(kv_, k.c_str(), timeout_s_, &val, &len);
        if (rc < 0)
            fail("get", k, rc);
        std::vector<char> out(static_cast<char *>(val), static_cast<char *>(val) + len);
        std::free(val);
        return out;
    }

    void wait(const std::vector<std::string> &keys) override { wait(keys, to_ms(timeout_s_)); }

    void wait(const std::vector<std::string> &keys,
              const std::chrono::milliseconds &timeout) override
    {
        double t = std::min(timeout_s_, static_cast<double>(timeout.count()) / 1000.0);
        if (timeout.count() <= 0)
            t = timeout_s_;
        for (const auto &key : keys) {
            std::string k = prefix_ + key;
            void *val = nullptr;
            size_t len = 0;
            int rc = kv_->ops->get(kv_, k.c_str(), t, &val, &len);
            if (rc < 0)
                fail("wait", k, rc);
            std::free(val);
        }
    }

    int last_rc = 0; /* the store's code when an operation failed */

  private:
    [[noreturn]] void fail(const char *op, const std::string &key, int rc)
    {
        last_rc = rc;
        std::string why = kv_->err[0] ? kv_->err : cddp_strerror(rc);
        throw gloo::IoException(std::string("bootstrap store ") + op + " '" + key + "': " + why);
    }

    trn_kv *kv_;
    std::string prefix_;
    double timeout_s_;
};

// Sums written so the compiler can vectorise them (no possible aliasing
// inside each loop); gloo reduces in place, so c is usually a.
template <typename T> void add_into(T *__restrict c, const T *__restrict b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        c[i] += b[i];
}

template <typename T>
void add3(T *__restrict c, const T *__restrict a, const T *__restrict b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        c[i] = a[i] + b[i];
}

template <typename T> void sum_fn(void *c_, const void *a_, const void *b_, size_t n)
{
    T *c = static_cast<T *>(c_);
    const T *a = static_cast<const T *>(a_);
    const T *b = static_cast<const T *>(b_);
    if (c == a)
        add_into(c, b, n);
    else if (c == b)
        add_into(c, a, n);
    else
        add3(c, a, b, n);
}

template <typename T> void max_fn(void *c_, const void *a_, const void *b_, size_t n)
{
    T *c = static_cast<T *>(c_);
    const T *a = static_cast<const T *>(a_);
    const T *b = static_cast<const T *>(b_);
    for (size_t i = 0; i < n; i++)
        c[i] = std::max(a[i], b[i]);
}

template <typename T> void min_fn(void *c_, const void *a_, const void *b_, size_t n)
{
    T *c = static_cast<T *>(c_);
    const T *a = static_cast<const T *>(a_);
    const T *b = static_cast<const T *>(b_);
    for (size_t i = 0; i < n; i++)
        c[i] = std::min(a[i], b[i]);
}

template <typename T> void allreduce(trn_gloo *g, trn_comm_work *w, std::chrono::milliseconds t)
{
    gloo::AllreduceOptions opts(g->ctx);
    opts.setOutput(static_cast<T *>(w->buf), w->count);
    opts.setTimeout(t);
    switch (w->redop) {
    case TRN_COMM_SUM:
    case TRN_COMM_AVG:
        opts.setReduceFunction(sum_fn<T>);
        break;
    case TRN_COMM_MAX:
        opts.setReduceFunction(max_fn<T>);
        break;
    case TRN_COMM_MIN:
        opts.setReduceFunction(min_fn<T>);
        break;
    }
    gloo::allreduce(opts);
    if (w->redop == TRN_COMM_AVG) {
        T *p = static_cast<T *>(w->buf);
        const T scale = static_cast<T>(1) / static_cast<T>(g->ctx->size);
        for (size_t i = 0; i < w->count; i++)
            p[i] *= scale;
    }
}

template <typename T> void broadcast(trn_gloo *g, trn_comm_work *w, std::chrono::milliseconds t)
{
    gloo::BroadcastOptions opts(g->ctx);
    opts.setOutput(static_cast<T *>(w->buf), w->count);
    opts.setRoot(w->root);
    opts.setTimeout(t);
    gloo::broadcast(opts);
}

template <typename T> void allgather(trn_gloo *g, trn_comm_work *w, std::chrono::milliseconds t)
{
    // In place: this rank's block of the output holds its input.
    T *out = static_cast<T *>(w->buf);
    T *mine = out + static_cast<size_t>(g->ctx->rank) * w->count;
    if (w->send != mine)
        std::memmove(mine, w->send, w->count * sizeof(T));
    gloo::AllgatherOptions opts(g->ctx);
    opts.setOutput(out, w->count * static_cast<size_t>(g->ctx->size));
    opts.setTimeout(t);
    gloo::allgather(opts);
}

// Sends and receives, on a slot of their own: gloo's collectives use
// prefixes 0x01 to 0x08 (gloo/types.h). Messages on one slot between two
// ranks arrive in the order they were sent.
constexpr uint8_t kP2pSlotPrefix = 0x70;

void p2p(trn_gloo *g, trn_comm_work *w, size_t bytes, std::chrono::milliseconds t)
{
    const uint64_t slot = gloo::Slot::build(kP2pSlotPrefix, 0);
    bool done;
    if (w->coll == TRN_COLL_SEND) {
        // (gloo only reads a buffer it sends)
        auto ub = g->ctx->createUnboundBuffer(const_cast<void *>(w->send), bytes);
        ub->send(w->root, slot);
        done = ub->waitSend(t);
    } else {
        auto ub = g->ctx->createUnboundBuffer(w->buf, bytes);
        ub->recv(w->root, slot);
        done = ub->waitRecv(t);
    }
    if (!done)
        throw gloo::IoException(std::string(w->coll == TRN_COLL_SEND ? "send to" : "recv from") +
                                " rank " + std::to_string(w->root) + " aborted");
}

template <typename T> void run_typed(trn_gloo *g, trn_comm_work *w, std::chrono::milliseconds t)
{
    switch (w->coll) {
    case TRN_COLL_ALLREDUCE:
        allreduce<T>(g, w, t);
        break;
    case TRN_COLL_BROADCAST:
        broadcast<T>(g, w, t);
        break;
    case TRN_COLL_ALLGATHER:
        allgather<T>(g, w, t);
        break;
    case TRN_COLL_BARRIER: {
        gloo::BarrierOptions opts(g->ctx);
        opts.setTimeout(t);
        gloo::barrier(opts);
        break;
    }
    case TRN_COLL_SEND:
    case TRN_COLL_RECV:
        p2p(g, w, w->count * sizeof(T), t);
        break;
    }
}

int classify(const std::string &msg)
{
    return msg.find("Timed out") != std::string::npos || msg.find("timed out") != std::string::npos
               ? CDDP_ETIMEOUT
               : CDDP_EPEER;
}

} // namespace

extern "C" int trn_gloo_connect(const struct trn_gloo_config *cfg, struct trn_kv *kv,
                                struct trn_gloo **out, char *err, size_t errlen)
{
    *out = nullptr;
    trn_gloo *g = nullptr;
    KvStore store(kv, cfg->prefix != nullptr ? cfg->prefix : "", cfg->init_timeout_s);
    try {
        gloo::transport::tcp::attr attr;
        if (cfg->iface != nullptr && cfg->iface[0] != '\0')
            attr.iface = cfg->iface;
        else
            attr.hostname = cfg->host != nullptr ? cfg->host : "127.0.0.1";
        g = new trn_gloo;
        g->dev = gloo::transport::tcp::CreateDevice(attr);
        g->ctx = std::make_shared<gloo::rendezvous::Context>(cfg->rank, cfg->world);
        g->ctx->setTimeout(to_ms(cfg->init_timeout_s));
        g->ctx->connectFullMesh(store, g->dev);
    } catch (const std::exception &e) {
        one_line(err, errlen, e.what());
        delete g;
        if (store.last_rc != 0)
            return store.last_rc;
        return classify(e.what());
    }
    *out = g;
    return 0;
}

extern "C" int trn_gloo_run(struct trn_gloo *g, struct trn_comm_work *w, double timeout_s)
{
    auto t = to_ms(timeout_s);
    try {
        switch (w->dtype) {
        case TRN_COMM_F32:
            run_typed<float>(g, w, t);
            break;
        case TRN_COMM_F64:
            run_typed<double>(g, w, t);
            break;
        case TRN_COMM_I32:
            run_typed<int32_t>(g, w, t);
            break;
        case TRN_COMM_I64:
            run_typed<int64_t>(g, w, t);
            break;
        case TRN_COMM_U8:
            run_typed<uint8_t>(g, w, t);
            break;
        case TRN_COMM_BF16:
            one_line(w->detail, sizeof(w->detail), "gloo has no bf16 reduction (nccl only)");
            return CDDP_ERANGE_ARG;
        }
    } catch (const gloo::IoException &e) {
        one_line(w->detail, sizeof(w->detail), e.what());
        return classify(e.what());
    } catch (const std::exception &e) {
        one_line(w->detail, sizeof(w->detail), e.what());
        return CDDP_ERR_FROM_ERRNO(EIO);
    }
    return 0;
}

extern "C" void trn_gloo_free(struct trn_gloo *g)
{
    if (g == nullptr)
        return;
    g->ctx.reset();
    g->dev.reset();
    delete g;
}
