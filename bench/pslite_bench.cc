/* The ps-lite side of bench/run_pslite.sh: the loop of `bench_ps --loop pslite`, written against
 * ps-lite's KVWorker / KVServer (https://github.com/dmlc/ps-lite). Not built by CMake (ps-lite
 * is optional): run_pslite.sh compiles it against a ps-lite built from the user's checkout.
 *
 * One program for every role, as ps-lite programs are (DMLC_ROLE=scheduler|server|worker,
 * DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER, DMLC_NUM_WORKER in the environment).
 *
 * Worker: per tensor size one dense float32 tensor, split over the servers as ps-lite's
 * benchmark does it: one key per server's key range (range begin + the size's index), its
 * values an equal share of the tensor (ZPush / ZPull with lens). Data: the same normal(0, 1e-3)
 * values from the same generator and seed as bench_ps.c. After a warm-up of a tenth of the
 * iterations (at least 3), N times {ZPush, Wait; ZPull, Wait}: push and pull latency p50/p99 in
 * microseconds, and GB/s (10^9 B/s) counting the pushed and the pulled bytes over the wall time
 * of the N iterations. N is --iters, else 1 GiB / size within [60, 2000] (bench_ps's rule).
 * Every worker pushes into the same keys.
 *
 * Beside ps-lite's own benchmarks: its byteps branch's tests/test_benchmark.cc takes keys the
 * same way (range begin + i) but sends a whole `len` to each server in turn and, unless in debug
 * mode, its server adds nothing; master's tests/test_kv_app_benchmark.cc (15b8adf) pushes 10 M
 * keys of one value each once. Here a tensor of `size` bytes is one ZPush to all servers at once
 * (as cps_push of a tensor sharded over the servers), and the server does the adding an
 * optimizer's apply costs.
 *
 * Server: the pushed values added into the stored ones element by element (what ps-lite's
 * default handle does, here with several values per key), a pull answered with a copy of them.
 *
 * usage: pslite_bench [--sizes a,b,...] [--iters N] [--out FILE]
 * One line per size, "pslite_loop system=pslite ... key=value", on stdout and appended to FILE.
 */
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "ps/ps.h"

namespace
{

struct Options {
    std::vector<size_t> sizes{4096, 65536, 1048576, 16777216};
    int iters = 0;
    const char *out = nullptr;
};

/* xorshift64 and Box-Muller: bench_ps.c's fill_grad for dense data, value for value. */
uint64_t Next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

double Unit(uint64_t *s)
{
    return (static_cast<double>(Next(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

void FillNormal(float *g, size_t n, uint64_t seed)
{
    uint64_t s = seed | 1;
    for (size_t i = 0; i < n; i++) {
        double u1 = Unit(&s), u2 = Unit(&s);
        g[i] = static_cast<float>(1e-3 * std::sqrt(-2.0 * std::log(u1)) *
                                  std::cos(6.283185307179586 * u2));
    }
}

double Now()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

/* The p quantile by bench_ps.c's rule (nearest rank of p * (n - 1)). */
double Quantile(std::vector<double> v, double p)
{
    std::sort(v.begin(), v.end());
    return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5)];
}

/* The server's values: key -> its floats. ps-lite calls the handle from one thread. */
std::unordered_map<ps::Key, std::vector<float>> g_store;

void Handle(const ps::KVMeta &meta, const ps::KVPairs<float> &req, ps::KVServer<float> *server)
{
    size_t nkeys = req.keys.size();
    ps::KVPairs<float> res;
    if (meta.push) {
        size_t off = 0;
        for (size_t i = 0; i < nkeys; i++) {
            size_t len =
                req.lens.empty() ? req.vals.size() / nkeys : static_cast<size_t>(req.lens[i]);
            std::vector<float> &v = g_store[req.keys[i]];
            if (v.size() != len)
                v.assign(len, 0.0f);
            const float *g = req.vals.data() + off;
            for (size_t j = 0; j < len; j++)
                v[j] += g[j];
            off += len;
        }
    } else {
        size_t total = 0;
        for (size_t i = 0; i < nkeys; i++)
            total += g_store[req.keys[i]].size();
        res.keys = req.keys;
        res.vals.resize(total);
        res.lens.resize(nkeys);
        float *p = res.vals.data();
        for (size_t i = 0; i < nkeys; i++) {
            const std::vector<float> &v = g_store[req.keys[i]];
            std::copy(v.begin(), v.end(), p);
            p += v.size();
            res.lens[i] = static_cast<int>(v.size());
        }
    }
    server->Response(meta, res);
}

void RunWorker(const Options &o)
{
    ps::KVWorker<float> kv(0, 0);
    const std::vector<ps::Range> &ranges = ps::Postoffice::Get()->GetServerKeyRanges();
    size_t nserv = ranges.size();
    FILE *out = o.out ? std::fopen(o.out, "a") : nullptr;
    if (o.out && !out) {
        std::perror(o.out);
        std::exit(1);
    }
    for (size_t si = 0; si < o.sizes.size(); si++) {
        size_t size = o.sizes[si], len = size / sizeof(float);
        size_t per = (1u << 30) / size;
        int n = o.iters > 0 ? o.iters : per < 60 ? 60 : per > 2000 ? 2000 : static_cast<int>(per);
        int warm = std::max(3, n / 10);
        ps::SArray<ps::Key> keys(nserv);
        ps::SArray<int> lens(nserv);
        for (size_t s = 0; s < nserv; s++) {
            keys[s] = ranges[s].begin() + si;
            lens[s] = static_cast<int>(len / nserv + (s < len % nserv ? 1 : 0));
        }
        ps::SArray<float> vals(len), back;
        ps::SArray<int> back_lens;
        FillNormal(vals.data(), len, 0x1234567 + size);
        for (int i = 0; i < warm; i++) {
            kv.Wait(kv.ZPush(keys, vals, lens));
            kv.Wait(kv.ZPull(keys, &back, &back_lens));
        }
        std::vector<double> push(n), pull(n);
        double t0 = Now();
        for (int i = 0; i < n; i++) {
            double a = Now();
            kv.Wait(kv.ZPush(keys, vals, lens));
            double b = Now();
            kv.Wait(kv.ZPull(keys, &back, &back_lens));
            push[i] = (b - a) * 1e6;
            pull[i] = (Now() - b) * 1e6;
        }
        double gbps = 2.0 * n * static_cast<double>(size) / (Now() - t0) / 1e9;
        if (back.size() != len) {
            std::fprintf(stderr, "pslite_bench: pulled %zu values, not %zu\n", back.size(), len);
            std::exit(1);
        }
        /* One worker: the server must hold the sum of every push (a few values checked). */
        for (size_t j = 0; ps::NumWorkers() == 1 && j < len; j += len / 4 + 1) {
            double want = static_cast<double>(warm + n) * vals[j];
            if (std::fabs(back[j] - want) > 1e-3 * std::fabs(want) + 1e-6) {
                std::fprintf(stderr, "pslite_bench: value %zu is %g, not %g\n", j, back[j], want);
                std::exit(1);
            }
        }
        char line[512];
        std::snprintf(line, sizeof line,
                      "pslite_loop system=pslite servers=%zu workers=%d rank=%d size=%zu iters=%d "
                      "push_p50_us=%.1f push_p99_us=%.1f pull_p50_us=%.1f pull_p99_us=%.1f "
                      "pp_gbps=%.3f\n",
                      nserv, ps::NumWorkers(), ps::MyRank(), size, n, Quantile(push, 0.50),
                      Quantile(push, 0.99), Quantile(pull, 0.50), Quantile(pull, 0.99), gbps);
        std::fputs(line, stdout);
        std::fflush(stdout);
        if (out) {
            std::fputs(line, out);
            std::fflush(out);
        }
    }
    if (out)
        std::fclose(out);
}

[[noreturn]] void Usage()
{
    std::fprintf(stderr, "usage: pslite_bench [--sizes a,b,...] [--iters N] [--out FILE]\n");
    std::exit(2);
}

Options Parse(int argc, char **argv)
{
    Options o;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (i + 1 >= argc)
            Usage();
        const char *v = argv[++i];
        if (a == "--sizes") {
            o.sizes.clear();
            for (const char *p = v; *p;) {
                char *end;
                unsigned long long s = std::strtoull(p, &end, 10);
                if (end == p || s < 4 || s % 4 || s > (256ull << 20))
                    Usage();
                o.sizes.push_back(static_cast<size_t>(s));
                p = *end == ',' ? end + 1 : end;
                if (*end && *end != ',')
                    Usage();
            }
            if (o.sizes.empty())
                Usage();
        } else if (a == "--iters") {
            o.iters = std::atoi(v);
            if (o.iters < 1)
                Usage();
        } else if (a == "--out") {
            o.out = v;
        } else {
            Usage();
        }
    }
    return o;
}

} // namespace

int main(int argc, char **argv)
{
    Options o = Parse(argc, argv);
    ps::Start(0);
    ps::KVServer<float> *server = nullptr;
    if (ps::IsServer()) {
        server = new ps::KVServer<float>(0);
        server->set_request_handle(Handle);
    }
    /* ps::Start's barrier lets a worker push before a server has set its handle: the server's
     * receiving thread then found no handle and aborted (kv_app.h "Check failed: request_handle_",
     * 1 run in 24 here). Workers start once every server is ready. */
    if (!ps::IsScheduler())
        ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup + ps::kServerGroup);
    if (ps::IsWorker())
        RunWorker(o);
    ps::Finalize(0, true);
    delete server;
    return 0;
}
