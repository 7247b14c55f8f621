// gloo-bench: the tutti-bench measurement against Gloo, for side-by-side runs.
//
//   gloo-bench -np N --algo ring|ring_chunked|halving_doubling|bcube|broadcast|barrier
//              [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [-c] [-t SECONDS]
//
// Forks N ranks that meet through a gloo::rendezvous::FileStore in a temp dir (behind a
// PrefixStore) and connect a full mesh with the tcp transport on 127.0.0.1. Gloo
// collectives run in place, so only the in-place half of tutti-bench's columns is
// printed. Each rank times every call; after the timed loop the per-iteration times are
// reduced with MAX over ranks (a Gloo allreduce of doubles), and time/p50/p99 come from
// those maxima, exactly like tutti-bench.
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
#include <cmath>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <gloo/algorithm.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

namespace {

struct Config {
    int np = 2;
    std::string algo = "ring";
    size_t min_bytes = 8;
    size_t max_bytes = 64u << 20;
    size_t factor = 2;
    int iters = 20;
    int warmup = 5;
    bool check = false;
    int timeout_s = 600;
    int root = 0;
};

const char *const kAlgos[] = {"ring", "ring_chunked", "halving_doubling", "bcube",
                              "broadcast", "barrier"};

void usage(FILE *f)
{
    fprintf(f,
            "usage: gloo-bench [-np N] [--algo ALGO] [-b MIN] [-e MAX] [-f FACTOR]\n"
            "                  [-n ITERS] [-w WARMUP] [-c] [-r ROOT] [-t SECONDS]\n"
            "  -np N          ranks to fork on this host (default 2)\n"
            "  --algo ALGO    ring (default), ring_chunked, halving_doubling, bcube\n"
            "                 (allreduce, float sum), broadcast (one-to-all), barrier\n"
            "  -b, -e SIZE    smallest/largest message in bytes, K/M/G suffixes\n"
            "                 (default 8 .. 64M)\n"
            "  -f FACTOR      size multiplier between rows (default 2)\n"
            "  -n ITERS       timed iterations per size (default 20)\n"
            "  -w WARMUP      untimed iterations per size (default 5)\n"
            "  -c, --check    verify results (#wrong); without it #wrong prints N/A\n"
            "  -r ROOT        broadcast root (default 0)\n"
            "  -t SECONDS     kill the ranks after this long (default 600)\n"
            "Ranks rendezvous through a FileStore in a temp dir and talk over 127.0.0.1.\n");
}

bool parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return false;
    unsigned long long mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1ull << 10; end++; break;
    case 'm': case 'M': mul = 1ull << 20; end++; break;
    case 'g': case 'G': mul = 1ull << 30; end++; break;
    default: break;
    }
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end)
        return false;
    *out = (size_t)(v * mul);
    return true;
}

bool parse_int(const char *s, int *out, int min)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > 1 << 30)
        return false;
    *out = (int)v;
    return true;
}

double now_us()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

// Nearest-rank percentile of sorted values.
double percentile(const std::vector<double> &sorted, double p)
{
    if (sorted.empty())
        return 0.0;
    size_t k = (size_t)std::ceil(p / 100.0 * (double)sorted.size());
    if (k == 0)
        k = 1;
    return sorted[std::min(k, sorted.size()) - 1];
}

// Small integers, so float sums are exact and the reference is too.
float input_value(int rank, size_t i)
{
    return (float)((rank * 7 + (int)(i % 13)) % 17);
}

bool is_allreduce(const std::string &algo)
{
    return algo == "ring" || algo == "ring_chunked" || algo == "halving_doubling" ||
           algo == "bcube";
}

std::unique_ptr<gloo::Algorithm> make_algo(const Config &cfg,
                                           const std::shared_ptr<gloo::Context> &ctx,
                                           float *buf, int count)
{
    std::vector<float *> ptrs{buf};
    if (cfg.algo == "ring")
        return std::unique_ptr<gloo::Algorithm>(new gloo::AllreduceRing<float>(ctx, ptrs, count));
    if (cfg.algo == "ring_chunked")
        return std::unique_ptr<gloo::Algorithm>(
            new gloo::AllreduceRingChunked<float>(ctx, ptrs, count));
    if (cfg.algo == "halving_doubling")
        return std::unique_ptr<gloo::Algorithm>(
            new gloo::AllreduceHalvingDoubling<float>(ctx, ptrs, count));
    if (cfg.algo == "bcube")
        return std::unique_ptr<gloo::Algorithm>(new gloo::AllreduceBcube<float>(ctx, ptrs, count));
    if (cfg.algo == "broadcast")
        return std::unique_ptr<gloo::Algorithm>(
            new gloo::BroadcastOneToAll<float>(ctx, ptrs, (size_t)count, cfg.root));
    return std::unique_ptr<gloo::Algorithm>(new gloo::BarrierAllToAll(ctx));
}

void fill(const Config &cfg, int rank, float *buf, size_t count)
{
    for (size_t i = 0; i < count; i++)
        buf[i] = (cfg.algo == "broadcast" && rank != cfg.root) ? -1.0f : input_value(rank, i);
}

long count_wrong(const Config &cfg, const float *buf, size_t count)
{
    long wrong = 0;
    for (size_t i = 0; i < count; i++) {
        float expect = 0.0f;
        if (cfg.algo == "broadcast") {
            expect = input_value(cfg.root, i);
        } else {
            for (int r = 0; r < cfg.np; r++)
                expect += input_value(r, i);
        }
        if (buf[i] != expect)
            wrong++;
    }
    return wrong;
}

void print_header(const Config &cfg)
{
    const char *coll = is_allreduce(cfg.algo) ? "allreduce"
                       : cfg.algo == "broadcast" ? "broadcast" : "barrier";
    printf("# gloo-bench: %s (%s), %d ranks, transport tcp (127.0.0.1), dtype float, op sum\n",
           coll, cfg.algo.c_str(), cfg.np);
    printf("# iters %d, warmup %d, time = mean over iterations of the max over ranks\n",
           cfg.iters, cfg.warmup);
    printf("#%60s %s\n", "", "in-place");
    printf("#%11s %12s %6s %6s %5s %9s %8s %8s %7s %9s %9s\n", "size", "count", "type",
           "redop", "root", "time", "algbw", "busbw", "#wrong", "p50", "p99");
    printf("#%11s %12s %6s %6s %5s %9s %8s %8s %7s %9s %9s\n", "(B)", "(elements)", "", "",
           "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)");
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

    const bool barrier = cfg.algo == "barrier";
    const double factor = is_allreduce(cfg.algo) ? 2.0 * (cfg.np - 1) / cfg.np : 1.0;
    if (rank == 0)
        print_header(cfg);

    double bw_sum = 0.0;
    int bw_rows = 0;
    long total_wrong = 0;
    std::vector<double> times((size_t)cfg.iters);
    std::vector<size_t> sizes;
    if (barrier) {
        sizes.push_back(0);
    } else {
        for (size_t size = cfg.min_bytes; size <= cfg.max_bytes; size *= cfg.factor)
            if (size >= sizeof(float))
                sizes.push_back(size);
    }
    for (size_t size : sizes) {
        size_t count = size / sizeof(float);
        size_t bytes = count * sizeof(float);
        std::vector<float> buf(count ? count : 1);
        fill(cfg, rank, buf.data(), count);
        auto algo = make_algo(cfg, ctx, buf.data(), (int)count);
        for (int i = 0; i < cfg.warmup; i++)
            algo->run();
        for (int i = 0; i < cfg.iters; i++) {
            double t0 = now_us();
            algo->run();
            times[(size_t)i] = now_us() - t0;
        }
        long wrong = -1;
        if (cfg.check && !barrier) {
            fill(cfg, rank, buf.data(), count);
            algo->run();
            wrong = count_wrong(cfg, buf.data(), count);
        }
        // Max over ranks per iteration, and the sum of #wrong, in one allreduce after
        // the timed loop.
        std::vector<double> red(times);
        red.push_back(wrong > 0 ? (double)wrong : 0.0);
        {
            std::vector<double *> ptrs{red.data()};
            gloo::AllreduceRing<double> maxred(ctx, ptrs, (int)red.size(),
                                               gloo::ReductionFunction<double>::max);
            maxred.run();
        }
        double max_wrong = red.back();
        red.pop_back();
        if (wrong >= 0 && max_wrong > 0)
            wrong = (long)max_wrong; // the worst rank's count
        total_wrong += wrong > 0 ? wrong : 0;
        if (rank != 0)
            continue;
        double mean = 0.0;
        for (double t : red)
            mean += t;
        mean /= (double)red.size();
        std::sort(red.begin(), red.end());
        char wrong_s[32];
        if (wrong < 0)
            snprintf(wrong_s, sizeof(wrong_s), "N/A");
        else
            snprintf(wrong_s, sizeof(wrong_s), "%ld", wrong);
        if (barrier) {
            printf(" %11zu %12d %6s %6s %5d %9.2f %8s %8s %7s %9.2f %9.2f\n", (size_t)0, 0,
                   "none", "none", -1, mean, "-", "-", "N/A", percentile(red, 50),
                   percentile(red, 99));
        } else {
            double algbw = (double)bytes / 1e3 / mean; // bytes/us / 1e3 = GB/s
            double busbw = algbw * factor;
            bw_sum += busbw;
            bw_rows++;
            printf(" %11zu %12zu %6s %6s %5d %9.2f %8.3f %8.3f %7s %9.2f %9.2f\n", bytes,
                   count, "float", "sum", cfg.algo == "broadcast" ? cfg.root : -1, mean,
                   algbw, busbw, wrong_s, percentile(red, 50), percentile(red, 99));
        }
        fflush(stdout);
    }
    // A Gloo pair fails pending operations when its peer closes, even ones that were
    // about to complete, so nobody tears down until every rank is past its last
    // operation: a barrier through the store, not through the pairs.
    std::vector<std::string> done;
    for (int r = 0; r < cfg.np; r++)
        done.push_back("done/" + std::to_string(r));
    store.set(done[(size_t)rank], std::vector<char>{'1'});
    store.wait(done);
    if (rank == 0) {
        printf("# Out of bounds values : %ld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %g\n", bw_rows ? bw_sum / bw_rows : 0.0);
        fflush(stdout);
    }
    return total_wrong ? 1 : 0;
}

int rm_entry(const char *path, const struct stat *, int, struct FTW *)
{
    remove(path);
    return 0;
}

} // namespace

int main(int argc, char **argv)
{
    Config cfg;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto val = [&](void) -> const char * {
            if (i + 1 >= argc) {
                fprintf(stderr, "gloo-bench: %s needs a value\n", a.c_str());
                exit(2);
            }
            return argv[++i];
        };
        bool ok = true;
        if (a == "-h" || a == "--help") {
            usage(stdout);
            return 0;
        } else if (a == "-np" || a == "--np") {
            ok = parse_int(val(), &cfg.np, 1);
        } else if (a == "--algo" || a == "-a") {
            cfg.algo = val();
            ok = std::find(std::begin(kAlgos), std::end(kAlgos), cfg.algo) != std::end(kAlgos);
        } else if (a == "-b" || a == "--minbytes") {
            ok = parse_size(val(), &cfg.min_bytes);
        } else if (a == "-e" || a == "--maxbytes") {
            ok = parse_size(val(), &cfg.max_bytes);
        } else if (a == "-f" || a == "--stepfactor") {
            size_t f;
            ok = parse_size(val(), &f) && f >= 2;
            cfg.factor = f;
        } else if (a == "-n" || a == "--iters") {
            ok = parse_int(val(), &cfg.iters, 1);
        } else if (a == "-w" || a == "--warmup_iters") {
            ok = parse_int(val(), &cfg.warmup, 0);
        } else if (a == "-c" || a == "--check") {
            cfg.check = true;
        } else if (a == "-r" || a == "--root") {
            ok = parse_int(val(), &cfg.root, 0);
        } else if (a == "-t" || a == "--timeout") {
            ok = parse_int(val(), &cfg.timeout_s, 1);
        } else {
            fprintf(stderr, "gloo-bench: unknown argument %s\n", a.c_str());
            usage(stderr);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "gloo-bench: bad value for %s\n", a.c_str());
            return 2;
        }
    }
    if (cfg.root >= cfg.np || cfg.min_bytes == 0 || cfg.min_bytes > cfg.max_bytes) {
        fprintf(stderr, "gloo-bench: need 0 <= root < np and 0 < MIN <= MAX\n");
        return 2;
    }

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
