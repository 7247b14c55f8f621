/* ProcessGroupTutti: torch.distributed's c10d backend "tutti", one tutti communicator
 * under a process group, for CPU tensors and CUDA tensors (staged through host memory).
 * Every collective is issued async; WorkTutti holds the tutti work handle and the buffers
 * it uses, and is finished (results copied back, exception set, Future completed) by the
 * group's Completer thread, never under tutti's lock. The base class is
 * c10d::ProcessGroup on torch 1.x and c10d::Backend on torch >= 2 (the 2.x branch follows
 * torch-ccl's; built and run against torch 2.11 on the device tool's machine once,
 * docs/pytorch.md). */
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <sys/types.h>

#include <torch/version.h>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <c10/core/Stream.h>
#include <c10/util/Optional.h>

#include <tutti/tutti.h>

namespace tutti_torch
{

/* Whether the torch compiled against is at least major.minor. */
#define TUTTI_TORCH_AT_LEAST(major, minor)                                                         \
    (TORCH_VERSION_MAJOR > (major) ||                                                              \
     (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#if TUTTI_TORCH_AT_LEAST(2, 1)
#define TUTTI_TORCH_2_1_OVERRIDE override
#else
#define TUTTI_TORCH_2_1_OVERRIDE
#endif

#if TORCH_VERSION_MAJOR >= 2
using PGBase = c10d::Backend;
#else
using PGBase = c10d::ProcessGroup;
#endif

class WorkTutti;

/* The threads that finish works: tutti's completion callback only queues them here,
 * since finishing runs Future continuations, which may issue collectives and wait for
 * them (PowerSGD's hook does): while every thread is busy in one, another is started
 * (up to kMaxThreads, a bound against runaway growth, not a working limit: until
 * session 96 it was 8, and 8 continuations each waiting on a later future hung for
 * good), so that a waiting continuation never holds up the completions it waits for.
 * The threads share the state with the Completer (state_): the group's last reference
 * may go in a continuation, destroying the Completer on one of its own threads, which
 * then returns into run() (found by review: it used the freed members). */
class Completer
{
  public:
    Completer();
    ~Completer();
    void push(WorkTutti *work, int status); /* takes over one reference */
    void stop();                            /* finish what is queued, then end */
    /* in a forked child: its threads are the parent's (none here to join or stop), so
     * the state is left as it is, never freed (the child's memory) */
    void abandon();

  private:
    static constexpr size_t kMaxThreads = 1024;
    struct State {
        std::mutex mu;
        std::condition_variable cv;
        std::deque<std::pair<WorkTutti *, int>> queue;
        bool stopping = false;
        size_t idle = 0;
        std::vector<std::thread> threads;
    };
    static void run(std::shared_ptr<State> s);
    std::shared_ptr<State> state_;
};

/* A work with a future, finished by settle(): the future first, then the waiters (as
 * gloo's: a wait() that returned finds its future completed; the other order failed
 * torch's completed() assert on 7-16 of 3000 calls, found by review). A continuation that
 * throws is warned about, and the waiters are woken all the same. */
class WorkFuture : public c10d::Work
{
  protected:
    using c10d::Work::Work;
    /* Once: the future gets err, or value without one; then finish(err). what: the
     * work, in the warning ("allreduce", "a sparse allreduce") */
    void settle(c10::ivalue::Future &future, c10::IValue value, std::exception_ptr err,
                const char *what);
};

class WorkTutti : public WorkFuture
{
  public:
    WorkTutti(int rank, c10d::OpType type, const char *name, std::vector<at::Tensor> outputs,
              std::chrono::milliseconds timeout, Completer *completer);
    ~WorkTutti() override;
    bool wait(std::chrono::milliseconds timeout) override;
    std::vector<at::Tensor> result() override;
    int sourceRank() const override;
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
    void synchronize() override {}

    /* Called once with the tutti status: on the thread that waits for the work if one
     * waited before tutti finished it (then tutti ran the op on that thread too: no
     * hand-off at all), else on a completer thread. */
    void complete(int status);
    static void on_done(void *arg, int status);
    /* The future's value is these lists (of the outputs) instead of the flat outputs:
     * allgather_coalesced's, one list per rank, as gloo's. Before the op is issued. */
    void nest(std::vector<std::vector<at::Tensor>> lists);

    const char *name;
    tutti_work_t *handle = nullptr;
    std::vector<at::Tensor> buffers; /* what tutti reads and writes: kept alive */
    std::function<void()> finisher;  /* copies results into the caller's tensors */
    Completer *completer;

  private:
    enum { kUnclaimed, kWaiterFinishes, kCompleterFinishes };
    std::atomic<int> finishing_{ kUnclaimed };
    std::vector<at::Tensor> outputs_;
    c10::optional<c10::Stream> stream_; /* the caller's, for results on a GPU */
    std::chrono::milliseconds timeout_;
    c10::intrusive_ptr<c10::ivalue::Future> future_;
    std::vector<std::vector<at::Tensor>> nested_;
};

/* A sparse allreduce's work (gloo's AsyncSparseAllreduceWork): done when its second
 * stage is, from a future callback on the completer
 * (ProcessGroupTutti::allreduce_sparse_coo). */
class WorkSparse : public WorkFuture
{
  public:
    WorkSparse(int rank, std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout);
    bool wait(std::chrono::milliseconds timeout) override;
    std::vector<at::Tensor> result() override;
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
    void synchronize() override {}
    void done(std::exception_ptr err); /* once */

  private:
    std::vector<at::Tensor> outputs_;
    std::chrono::milliseconds timeout_; /* both stages' bound */
    c10::intrusive_ptr<c10::ivalue::Future> future_;
};

/* What endCoalescing returns: the works issued since startCoalescing, as one (torch 2.x's
 * batch_isend_irecv of CUDA tensors and _coalescing_manager(device=...) wait on it). */
class WorkBatch : public WorkFuture
{
  public:
    WorkBatch(int rank, std::vector<c10::intrusive_ptr<WorkTutti>> works);
    /* Arms the completion: when every work's future is done, this work finishes (with
     * the first error) and so does its future (once, after construction). */
    void arm();
    bool wait(std::chrono::milliseconds timeout) override;
    std::vector<at::Tensor> result() override;
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
    void synchronize() override {}

  private:
    std::vector<c10::intrusive_ptr<WorkTutti>> works_;
    std::vector<at::Tensor> outputs_;
    c10::intrusive_ptr<c10::ivalue::Future> future_;
    std::atomic<size_t> left_;
    std::mutex err_mu_;
    std::exception_ptr first_error_;
};

class ProcessGroupTutti : public PGBase
{
  public:
    ProcessGroupTutti(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                      std::chrono::milliseconds timeout);
    ~ProcessGroupTutti() override;

    const std::string getBackendName() const override
    {
        return "tutti";
    }

    c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor> &tensors,
                                             const c10d::BroadcastOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor> &tensors,
                                             const c10d::AllreduceOptions &opts) override;
#if TORCH_VERSION_MAJOR >= 2
    /* torch 2.x's Backend has it from 2.1 (gloo's calls allreduce) */
    c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor> &tensors,
                                                    const c10d::AllreduceOptions &opts)
        TUTTI_TORCH_2_1_OVERRIDE
    {
        return allreduce(tensors, opts);
    }
#endif
    c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
        std::vector<at::Tensor> &tensors, const c10d::AllreduceCoalescedOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor> &tensors,
                                          const c10d::ReduceOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                             std::vector<at::Tensor> &inputs,
                                             const c10d::AllgatherOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &output, at::Tensor &input,
                                                   const c10d::AllgatherOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> allgather_coalesced(
        std::vector<std::vector<at::Tensor>> &outputs, std::vector<at::Tensor> &inputs,
        const c10d::AllgatherOptions &opts) override;
    /* torch >= 2.1's Backend has these two (dist._coalescing_manager's batches); on older
     * torch they are plain members, reached from Python through _C's bindings */
    c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
        std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
        const c10d::AllgatherOptions &opts) TUTTI_TORCH_2_1_OVERRIDE;
    c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
        std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
        const c10d::ReduceScatterOptions &opts) TUTTI_TORCH_2_1_OVERRIDE;
    c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>> &outputs,
                                          std::vector<at::Tensor> &inputs,
                                          const c10d::GatherOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor> &outputs,
                                           std::vector<std::vector<at::Tensor>> &inputs,
                                           const c10d::ScatterOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor> &outputs,
                                                  std::vector<std::vector<at::Tensor>> &inputs,
                                                  const c10d::ReduceScatterOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
        at::Tensor &output, at::Tensor &input, const c10d::ReduceScatterOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor &output, at::Tensor &input,
                                                 std::vector<int64_t> &outputSplits,
                                                 std::vector<int64_t> &inputSplits,
                                                 const c10d::AllToAllOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor> &outputs,
                                            std::vector<at::Tensor> &inputs,
                                            const c10d::AllToAllOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &tensors, int dst,
                                        int tag) override;
    c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &tensors, int src,
                                        int tag) override;
    c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor> &tensors,
                                                 int tag) override;
    c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions &opts) override;
    void monitoredBarrier(const c10d::BarrierOptions &opts, bool waitAllRanks) override;
    /* A batch: the works issued between the two calls, waited on as one. torch 2.x's
     * startCoalescing/endCoalescing; bound in _C for 1.x, whose ProcessGroup has calls
     * of those names with another contract. */
    void begin_batch();
    c10::intrusive_ptr<c10d::Work> end_batch();
#if TUTTI_TORCH_AT_LEAST(2, 1)
    void startCoalescing() override
    {
        begin_batch();
    }
    c10::intrusive_ptr<c10d::Work> endCoalescing() override
    {
        return end_batch();
    }
#endif
#if TUTTI_TORCH_AT_LEAST(2, 6)
    /* batch_isend_irecv batches only where the backend says it can (2.6 on) */
    bool supportsCoalescing() const override
    {
        return true;
    }
#endif

    /* The group's timeout for the calls issued from here on, their wait()s included
     * (tutti_comm_set_timeout; what torch's _set_pg_timeout does to gloo's and nccl's
     * groups); a call's own options.timeout, where set, still wins for that call. */
    void set_timeout(std::chrono::milliseconds timeout);
    std::chrono::milliseconds timeout() const
    {
        return op_timeout_.load();
    }
    std::string transport() const;
    /* The flight recorder: the group's last calls as tutti_comm_trace_dump's JSON. */
    std::string trace() const;

  private:
    using Call = std::function<int(tutti_work_t **)>;
    c10::intrusive_ptr<c10d::Work> launch(c10d::OpType type, const char *name,
                                          std::vector<at::Tensor> outputs,
                                          std::vector<at::Tensor> buffers,
                                          std::function<void()> finisher, const Call &call,
                                          std::vector<std::vector<at::Tensor>> nested = {});
    c10::intrusive_ptr<c10d::Work> receive(c10d::OpType type, const char *name,
                                           std::vector<at::Tensor> &tensors, int src, int tag);
    void rendezvous(c10d::Store &store, tutti_comm_opts_t *opts);
    c10::intrusive_ptr<c10d::Work> allreduce_sparse_coo(at::Tensor &t,
                                                        const c10d::AllreduceOptions &opts);
    /* a sparse call's second stage: issued under sparse_mu_, it returns what is left */
    using SparseIssue = std::function<std::function<void()>()>;
    void sparse_ready(uint64_t seq, SparseIssue issue);
    void sparse_skipped();
    SparseIssue sparse_stage2(const at::Tensor &all, const at::Tensor &in,
                              const at::Tensor &packed, at::Tensor t,
                              c10::intrusive_ptr<WorkSparse> user);
    [[noreturn]] void fail(const char *name, int status);

    std::atomic<std::chrono::milliseconds> timeout_;
    /* tutti's own (TUTTI_TIMEOUT_MS wins over torch's at set-up); set_timeout changes both */
    std::atomic<std::chrono::milliseconds> op_timeout_;
    std::mutex issue_mu_; /* one caller at a time in tutti (last_error is per comm) */
    bool coalescing_ = false; /* under issue_mu_, as coalesced_ */
    std::vector<c10::intrusive_ptr<WorkTutti>> coalesced_;
    c10::intrusive_ptr<c10d::Store> torch_store_; /* behind store_ */
    tutti_store_t *store_ = nullptr;
    tutti_comm_t *comm_ = nullptr;
    /* the process that made the group: in a forked child (a DataLoader worker) every
     * collective is refused before it takes a lock a parent's thread may have held at
     * the fork, and the destructor leaves the parent's communicator, threads and store
     * alone (check_owner, ~ProcessGroupTutti) */
    pid_t owner_pid_;
    void check_owner(const char *name) const;
    std::string job_id_;
    /* Sparse allreduce, in two stages as gloo's: every rank's sizes (an allgather on
     * comm_, issued in the caller's order), then the indices and values (an allgatherv
     * of bytes) on sparse_comm_, a split of comm_ made at the first sparse call. The
     * second stages are issued by whichever thread finishes a first, in the sparse
     * calls' order (sparse_next_), so that every rank issues them alike while later
     * calls on comm_ go on. */
    tutti_comm_t *sparse_comm_ = nullptr; /* made under issue_mu_, gone under sparse_mu_ */
    std::atomic<uint64_t> sparse_issued_{ 0 }; /* first stages issued (under issue_mu_) */
    std::mutex sparse_mu_;
    std::condition_variable sparse_cv_;
    uint64_t sparse_next_ = 0; /* under sparse_mu_: the next second stage to issue */
    std::map<uint64_t, SparseIssue> sparse_waiting_; /* under sparse_mu_ */
    Completer completer_;
};

} // namespace tutti_torch
