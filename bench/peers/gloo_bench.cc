// gloo-bench: tutti-bench's measurement of Gloo's collectives, for side-by-side runs.
//
//   gloo-bench -np N [--coll NAME] [--algo ring|ring_chunked|halving_doubling|bcube]
//              [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [-c] [--sync] [--fresh]
//              [-r ROOT] [-t SECONDS]
//
// Forks N ranks that meet through a gloo::rendezvous::FileStore in a temp dir (behind a
// PrefixStore) and connect a full mesh with the tcp transport on 127.0.0.1. Float sum,
// tutti-bench's columns, sizes, inputs and iteration structure (peer.h): per size an
// out-of-place and an in-place half, WARMUP untimed calls then ITERS timed ones with no
// barrier between them, the per-iteration times reduced with MAX over ranks after the
// loop. Gloo's forms: allreduce (--algo), broadcast (one-to-all) and reduce_scatter
// (halving-doubling) are in place, so their out-of-place half times a copy of send into
// recv plus the in-place call (reduce_scatter leaves each rank's block at the start,
// as MPI_IN_PLACE does). allgather (AllgatherRing) and alltoall are out of place; their
// in-place half copies the input aside and makes the out-of-place call. (gloo::allgather,
// the unbound-buffer API, stalls here: 4 MiB on 2 ranks, p50 0.1 to 0.8 s.) The
// comparison tables use a half every system has natively.
#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gloo/algorithm.h>
#include <gloo/allgather_ring.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/alltoall.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include "../../tools/bind.h"
#include "peer.h"

namespace {

struct Config {
    peer_cfg_t p = peer_default_cfg();
    int np = 2;
    std::string algo = "ring";
    int timeout_s = 600;
    bool bind = false; // --bind: rank i held on the (i * ncpus / np)-th CPU (tutti-bench's)
};

const char *const kAlgos[] = {"ring", "ring_chunked", "halving_doubling", "bcube"};

void usage(FILE *f)
{
    fprintf(f, "usage: gloo-bench [-np N] [--algo ALGO] [-t SECONDS] [flags]\n"
               "  -np N         ranks to fork on this host (default 2)\n"
               "  --algo ALGO   allreduce algorithm: ring (default), ring_chunked,\n"
               "                halving_doubling, bcube\n"
               "  -t SECONDS    kill the ranks after this long (default 600)\n"
               "  --bind        hold rank i of N on the (i*C/N)-th of the C CPUs it may use\n"
               "                (neighbours together, as tutti-bench --bind)\n" PEER_FLAGS_USAGE
               "Ranks rendezvous through a FileStore in a temp dir and talk over 127.0.0.1.\n");
}

using Ctx = std::shared_ptr<gloo::Context>;

// --bind: this rank (of np) where tutti-bench's launcher puts its ranks (tools/bind.h)
void bind_rank(int r, int np)
{
    int cpu, e = tt_bind_rank(r, np, &cpu);
    if (e)
        fprintf(stderr, "gloo-bench: rank %d: --bind: CPU %d: %s\n", r, cpu, strerror(e));
}

// One size's calls, set up (and their pairs' buffers registered) before the timed loop.
struct Calls {
    const Config &cfg;
    int rank;
    size_t c;
    float *send, *recv;
    std::unique_ptr<gloo::Algorithm> algo; // on recv (allgather: send to recv)
    std::unique_ptr<gloo::AlltoallOptions> a2a;

    Calls(const Config &cfg, const Ctx &ctx, size_t c, float *send, float *recv)
        : cfg(cfg), rank(ctx->rank), c(c), send(send), recv(recv)
    {
        std::vector<float *> ptrs{recv};
        const int n = cfg.np, ic = (int)c;
        switch (cfg.p.coll) {
        case PEER_ALLREDUCE: algo = make_allreduce(ctx, ptrs, ic); break;
        case PEER_BROADCAST:
            algo.reset(new gloo::BroadcastOneToAll<float>(ctx, ptrs, c, cfg.p.root));
            break;
        case PEER_REDUCE_SCATTER:
            algo.reset(new gloo::ReduceScatterHalvingDoubling<float>(ctx, ptrs, n * ic,
                                                                     std::vector<int>(n, ic)));
            break;
        case PEER_ALLGATHER:
            algo.reset(new gloo::AllgatherRing<float>(ctx, std::vector<const float *>{send}, recv,
                                                      ic));
            break;
        case PEER_ALLTOALL:
            a2a.reset(new gloo::AlltoallOptions(ctx));
            a2a->setInput(send, (size_t)n * c);
            a2a->setOutput(recv, (size_t)n * c);
            break;
        default: algo.reset(new gloo::BarrierAllToAll(ctx)); break;
        }
    }

    std::unique_ptr<gloo::Algorithm> make_allreduce(const Ctx &ctx, std::vector<float *> &ptrs,
                                                    int ic)
    {
        gloo::Algorithm *a;
        if (cfg.algo == "ring_chunked")
            a = new gloo::AllreduceRingChunked<float>(ctx, ptrs, ic);
        else if (cfg.algo == "halving_doubling")
            a = new gloo::AllreduceHalvingDoubling<float>(ctx, ptrs, ic);
        else if (cfg.algo == "bcube")
            a = new gloo::AllreduceBcube<float>(ctx, ptrs, ic);
        else
            a = new gloo::AllreduceRing<float>(ctx, ptrs, ic);
        return std::unique_ptr<gloo::Algorithm>(a);
    }

    void run(bool in_place)
    {
        const size_t n = (size_t)cfg.np;
        switch (cfg.p.coll) {
        case PEER_ALLGATHER: // in place: this rank's block copied out, then out of place
            if (in_place)
                memcpy(send, recv + (size_t)rank * c, c * sizeof(float));
            break;
        case PEER_ALLTOALL:
            if (in_place) // the input is in recv: set it aside, as an in-place form would
                memcpy(send, recv, n * c * sizeof(float));
            gloo::alltoall(*a2a);
            return;
        case PEER_BROADCAST:
            if (!in_place && rank == cfg.p.root)
                memcpy(recv, send, c * sizeof(float));
            break;
        case PEER_ALLREDUCE:
        case PEER_REDUCE_SCATTER:
            if (!in_place)
                memcpy(recv, send, peer_send_count(cfg.p.coll, cfg.np, c) * sizeof(float));
            break;
        default: break;
        }
        algo->run();
    }

};

// In place over ranks: the per-iteration times by max (none: --window's loop had it),
// #wrong by sum.
void reduce_over_ranks(const Ctx &ctx, std::vector<double> &times, long long *wrong_p)
{
    if (!times.empty()) {
        std::vector<double *> ptrs{times.data()};
        gloo::AllreduceRing<double>(ctx, ptrs, (int)times.size(),
                                    gloo::ReductionFunction<double>::max)
            .run();
    }
    if (*wrong_p < 0)
        return;
    double w = (double)*wrong_p;
    std::vector<double *> wp{&w};
    gloo::AllreduceRing<double>(ctx, wp, 1, gloo::ReductionFunction<double>::sum).run();
    *wrong_p = (long long)w;
}

// --window's ops (bench/stats.h) on one half; Gloo throws on failure.
struct WindowArg {
    const Config &cfg;
    const Ctx &ctx;
    Calls &calls;
    bool in_place;
};

int window_prepare(void *p)
{
    auto *a = static_cast<WindowArg *>(p);
    peer_prepare(&a->cfg.p, a->ctx->rank, a->cfg.np, a->calls.c, a->in_place, a->calls.send,
                 a->calls.recv);
    return 0;
}

int window_call(void *p)
{
    auto *a = static_cast<WindowArg *>(p);
    a->calls.run(a->in_place);
    return 0;
}

int window_max(void *p, double *v, int n)
{
    std::vector<double *> ptrs{v};
    gloo::AllreduceRing<double>(static_cast<WindowArg *>(p)->ctx, ptrs, n,
                                gloo::ReductionFunction<double>::max)
        .run();
    return 0;
}

int window_bcast(void *p, double *v, int n)
{
    std::vector<double *> ptrs{v};
    gloo::BroadcastOneToAll<double>(static_cast<WindowArg *>(p)->ctx, ptrs, n, 0).run();
    return 0;
}

// Time one half of a row, as tutti-bench's run_half does.
void run_half(const Config &cfg, const Ctx &ctx, Calls &calls, gloo::Algorithm &barrier,
              bool in_place, std::vector<double> &times, peer_half_t *h)
{
    const peer_cfg_t &p = cfg.p;
    peer_prepare(&p, ctx->rank, cfg.np, calls.c, in_place, calls.send, calls.recv);
    if (p.window) {
        WindowArg wa{ cfg, ctx, calls, in_place };
        bench_window_ops_t o = { &wa, p.fresh ? window_prepare : nullptr, window_call, window_max,
                                 window_bcast };
        int late = 0, err = 0;
        double gap = 0.0;
        if (bench_window_times(&o, ctx->rank, p.warmup, p.iters, times.data(), &late, &gap,
                               &err) <= 0) // Gloo throws on errors: err stays 0
            throw std::runtime_error("every timed call late (--window)");
        bench_window_tally(late, p.iters, gap);
    }
    for (int i = 0; i < p.warmup && !p.window; i++)
        calls.run(in_place);
    for (int i = 0; i < p.iters && !p.window; i++) {
        if (p.fresh) // before the barrier (--fresh sets sync): no peer writes into it yet
            peer_prepare(&p, ctx->rank, cfg.np, calls.c, in_place, calls.send, calls.recv);
        if (p.sync)
            barrier.run();
        double t0 = now_us();
        calls.run(in_place);
        times[(size_t)i] = now_us() - t0;
    }
    long long wrong = -1;
    if (p.check && p.coll != PEER_BARRIER) {
        // Out of place the last timed call left the result; in place the buffer was
        // reduced (or exchanged) over and over, so run once more on fresh input
        // (--fresh: the last timed call had it).
        // --window: a rank late for the last timed call refilled its buffers after the
        // others had started it, over what their rings had already written there (Gloo
        // writes into the peer's buffer): checked on one more call, as without --fresh.
        if (p.window || (!p.fresh && (in_place || p.coll == PEER_BROADCAST))) {
            peer_prepare(&p, ctx->rank, cfg.np, calls.c, in_place, calls.send, calls.recv);
            // Gloo's rings write straight into the peer's buffer: a fast neighbour's
            // data must not land before this rank's fill.
            barrier.run();
            calls.run(in_place);
        }
        wrong = peer_count_wrong(&p, ctx->rank, cfg.np, calls.c, calls.recv);
    }
    if (p.window) { // its loop has the max over ranks; #wrong's sum alone
        std::vector<double> none;
        reduce_over_ranks(ctx, none, &wrong);
    } else {
        reduce_over_ranks(ctx, times, &wrong);
    }
    h->wrong = wrong;
    peer_stats(times.data(), bench_window_keep(times.data(), p.iters), h);
}

// Every size on a connected context; returns the number of wrong values.
long long bench_sizes(const Config &cfg, const Ctx &ctx, float *send, float *recv)
{
    const peer_cfg_t &p = cfg.p;
    const bool barrier = p.coll == PEER_BARRIER;
    gloo::BarrierAllToAll sync_barrier(ctx);
    std::vector<double> times((size_t)p.iters);
    long long total_wrong = 0;
    for (size_t size = barrier ? 0 : p.min_bytes; barrier || size <= p.max_bytes;
         size *= p.factor) {
        size_t c = peer_row_count(&p, cfg.np, size);
        if (!barrier && c == 0)
            continue;
        Calls calls(cfg, ctx, c, send, recv);
        peer_half_t h[2];
        for (int ip = 0; ip < (barrier ? 1 : 2); ip++) {
            run_half(cfg, ctx, calls, sync_barrier, ip != 0, times, &h[ip]);
            total_wrong += h[ip].wrong > 0 ? h[ip].wrong : 0;
        }
        if (ctx->rank == 0)
            peer_print_row(&p, cfg.np, c, h);
        if (barrier)
            break;
    }
    return total_wrong;
}

int run_rank(const Config &cfg, const std::string &dir, int rank)
{
    gloo::rendezvous::FileStore file_store(dir);
    gloo::rendezvous::PrefixStore store("gloo-bench", file_store);
    gloo::transport::tcp::attr attr("127.0.0.1");
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, cfg.np);
    ctx->setTimeout(std::chrono::seconds(cfg.timeout_s));
    ctx->connectFullMesh(store, dev);
    if (rank == 0) {
        std::string what = "transport tcp (127.0.0.1)";
        if (cfg.p.coll == PEER_ALLREDUCE)
            what = "algo " + cfg.algo + ", " + what;
        peer_print_header(&cfg.p, "gloo-bench", cfg.np, what.c_str());
        fflush(stdout);
    }
    // tutti-bench's buffers: page-aligned, zeroed (touched) before the first row
    size_t alloc = (cfg.p.max_bytes + sizeof(float) + 4095) & ~(size_t)4095;
    std::unique_ptr<float, decltype(&free)> send((float *)aligned_alloc(4096, alloc), free);
    std::unique_ptr<float, decltype(&free)> recv((float *)aligned_alloc(4096, alloc), free);
    if (!send || !recv)
        throw std::bad_alloc();
    memset(send.get(), 0, alloc);
    memset(recv.get(), 0, alloc);
    long long total_wrong = bench_sizes(cfg, ctx, send.get(), recv.get());
    // A Gloo pair fails pending operations when its peer closes, even ones that were
    // about to complete, so nobody tears down until every rank is past its last
    // operation: a barrier through the store, not through the pairs.
    std::vector<std::string> done;
    for (int r = 0; r < cfg.np; r++)
        done.push_back("done/" + std::to_string(r));
    store.set(done[(size_t)rank], std::vector<char>{'1'});
    store.wait(done);
    if (rank == 0)
        peer_print_summary(total_wrong);
    return total_wrong ? 1 : 0;
}

int rm_entry(const char *path, const struct stat *, int, struct FTW *)
{
    remove(path);
    return 0;
}

// Returns -1 when the command line asks for a run, else the exit status (0: --help).
int parse_args(int argc, char **argv, Config *cfg)
{
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : nullptr;
        int takes = 1, ok = 1;
        if (a == "-h" || a == "--help") {
            usage(stdout);
            return 0;
        } else if (a == "-np" || a == "--np") {
            ok = v && !peer_parse_int(v, &cfg->np, 1);
        } else if (a == "--algo") {
            ok = v && std::find(std::begin(kAlgos), std::end(kAlgos), std::string(v)) !=
                          std::end(kAlgos);
            if (ok)
                cfg->algo = v;
        } else if (a == "-t" || a == "--timeout") {
            ok = v && !peer_parse_int(v, &cfg->timeout_s, 1);
        } else if (a == "--bind") {
            cfg->bind = true;
            takes = 0;
        } else {
            ok = peer_parse_flag(&cfg->p, argv[i], v, &takes) > 0;
        }
        if (!ok) {
            fprintf(stderr, "gloo-bench: bad argument %s\n", argv[i]);
            usage(stderr);
            return 2;
        }
        i += takes;
    }
    if (cfg->p.coll == PEER_SCAN || cfg->p.coll == PEER_EXSCAN ||
        cfg->p.coll == PEER_NEIGHBOR_ALLTOALL) {
        fprintf(stderr, "gloo-bench: Gloo has no %s\n", peer_coll_names[cfg->p.coll]);
        return 2;
    }
    if (cfg->p.root >= cfg->np || cfg->p.min_bytes == 0 || cfg->p.min_bytes > cfg->p.max_bytes) {
        fprintf(stderr, "gloo-bench: need 0 <= root < np and 0 < MIN <= MAX\n");
        return 2;
    }
    return -1;
}

} // namespace

int main(int argc, char **argv)
{
    Config cfg;
    int st = parse_args(argc, argv, &cfg);
    if (st >= 0)
        return st;

    char dir[] = "/tmp/gloo-bench.XXXXXX";
    if (!mkdtemp(dir)) {
        perror("gloo-bench: mkdtemp");
        return 1;
    }
    fflush(stdout);
    std::vector<pid_t> pids;
    for (int r = 0; r < cfg.np; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("gloo-bench: fork");
            break;
        }
        if (pid == 0) {
            if (cfg.bind)
                bind_rank(r, cfg.np);
            int rc = 3; // 1: wrong results (the others finish too), 3: an error
            try {
                rc = run_rank(cfg, dir, r);
            } catch (const std::exception &e) {
                fprintf(stderr, "gloo-bench: rank %d: %s\n", r, e.what());
            }
            fflush(stdout);
            _exit(rc);
        }
        pids.push_back(pid);
    }

    // Wait for every rank; on the first failure or the deadline, kill the rest.
    int rc = (int)pids.size() == cfg.np ? 0 : 1;
    size_t live = pids.size();
    const double deadline = now_us() + (double)cfg.timeout_s * 1e6;
    bool killed = rc != 0;
    if (killed)
        for (pid_t p : pids)
            kill(p, SIGKILL);
    while (live > 0) {
        int status;
        pid_t p = waitpid(-1, &status, WNOHANG);
        if (p < 0)
            break;
        if (p == 0) {
            if (!killed && now_us() > deadline) {
                fprintf(stderr, "gloo-bench: timed out after %d s; killing ranks\n",
                        cfg.timeout_s);
                rc = 1;
                killed = true;
                for (pid_t q : pids)
                    kill(q, SIGKILL);
            }
            usleep(10000);
            continue;
        }
        live--;
        bool wrong = WIFEXITED(status) && WEXITSTATUS(status) == 1;
        bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
        if (failed)
            rc = 1;
        if (failed && !wrong && !killed) {
            rc = 1;
            killed = true;
            for (pid_t q : pids)
                if (q != p)
                    kill(q, SIGKILL);
        }
    }
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return rc;
}
