/* ProcessGroupTutti and WorkTutti (process_group.hpp): torch tensors and options mapped
 * onto tutti's async collectives, the completion thread, and the rendezvous through
 * the store torch hands the backend's creator. */
#include "process_group.hpp"

#include <Python.h>

#include <algorithm>
#include <climits>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <queue>
#include <tuple>
#include <type_traits>
#include <utility>

#include <ATen/Dispatch.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <sys/mman.h>
#include <unistd.h>

namespace tutti_torch
{

namespace
{

/* tutti's own dtype for a torch scalar type, or -1 where it has none. */
int native_dtype(at::ScalarType s)
{
    switch (s) {
    case at::kChar: return TUTTI_INT8;
    case at::kByte: return TUTTI_UINT8;
    case at::kInt: return TUTTI_INT32;
    case at::kLong: return TUTTI_INT64;
    case at::kHalf: return TUTTI_FP16;
    case at::kBFloat16: return TUTTI_BF16;
    case at::kFloat: return TUTTI_FP32;
    case at::kDouble: return TUTTI_FP64;
    case at::kShort: return TUTTI_INT16;
    case at::kComplexFloat: return TUTTI_COMPLEX64; /* (torch's dist.* calls pass complex */
    case at::kComplexDouble: return TUTTI_COMPLEX128; /* tensors as view_as_real already) */
#if TUTTI_TORCH_AT_LEAST(2, 3)
    case c10::ScalarType::UInt16: return TUTTI_UINT16; /* torch's unsigned types beyond uint8: 2.3 on */
    case c10::ScalarType::UInt32: return TUTTI_UINT32;
    case c10::ScalarType::UInt64: return TUTTI_UINT64;
#endif
#if TUTTI_TORCH_AT_LEAST(2, 1)
    case c10::ScalarType::Float8_e4m3fn: return TUTTI_FP8_E4M3; /* OCP fp8: 2.1 on, as */
    case c10::ScalarType::Float8_e5m2: return TUTTI_FP8_E5M2;   /* NCCL's (tutti.h) */
#endif
    default: return -1;
    }
}

/* The dtype a reduction of t computes in (bool: see to_reduction). */
tutti_dtype_t to_dtype(const at::Tensor &t, const char *op)
{
    int dt = native_dtype(t.scalar_type());
    TORCH_CHECK(dt >= 0, "tutti backend: ", op, ": dtype ", t.scalar_type(),
                " is not supported by reductions (int8, uint8, int16, int32, int64, float16, "
                "bfloat16, float32, float64, complex64, complex128 (sum, product, avg), bool, "
                "from torch 2.1 float8_e4m3fn and float8_e5m2, and from torch 2.3 uint16, "
                "uint32, uint64 are; collectives that only move data take every dtype)");
    return (tutti_dtype_t)dt;
}

/* What moves t's elements unchanged: tutti's dtype of the same type, or else t's bytes
 * as uint8 (bool, float8, ...: data movement and send/recv take any dtype, as
 * NCCL's do), k carrier elements to one of t's. */
struct carrier {
    tutti_dtype_t dt;
    size_t k;
    size_t n(int64_t numel) const { return (size_t)numel * k; }
};

carrier carry(const at::Tensor &t)
{
    int dt = native_dtype(t.scalar_type());
    if (dt >= 0)
        return { (tutti_dtype_t)dt, 1 };
    return { TUTTI_UINT8, (size_t)t.element_size() };
}

const char *redop_name(c10d::ReduceOp::RedOpType op)
{
    switch (op) {
    case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNUSED";
    }
}

tutti_redop_t to_redop(const c10d::ReduceOp &op, const char *name)
{
    switch (op.op_) {
    case c10d::ReduceOp::SUM: return TUTTI_SUM;
    case c10d::ReduceOp::PRODUCT: return TUTTI_PROD;
    case c10d::ReduceOp::MIN: return TUTTI_MIN;
    case c10d::ReduceOp::MAX: return TUTTI_MAX;
    case c10d::ReduceOp::AVG: return TUTTI_AVG;
    case c10d::ReduceOp::PREMUL_SUM: return TUTTI_SUM; /* its input multiplied first: premul */
    /* integer dtypes only: tutti refuses a float tensor naming the op and dtype */
    case c10d::ReduceOp::BAND: return TUTTI_BAND;
    case c10d::ReduceOp::BOR: return TUTTI_BOR;
    case c10d::ReduceOp::BXOR: return TUTTI_BXOR;
    default:
        TORCH_CHECK(false, "tutti backend: ", name, ": reduce op ", redop_name(op.op_),
                    " is not supported (SUM, PRODUCT, MIN, MAX, AVG, PREMUL_SUM, BAND, BOR, BXOR "
                    "are)");
    }
}

/* The dtype and op a reduction of t runs with. Bool (stored as 0 or 1) reduces as uint8,
 * as NCCL's backend maps it: SUM and MAX as MAX (logical or), PRODUCT and MIN as MIN
 * (logical and), the bitwise ops as they are; AVG is refused. */
struct reduction {
    tutti_dtype_t dt;
    tutti_redop_t op;
};

reduction to_reduction(const at::Tensor &t, const c10d::ReduceOp &op, const char *name)
{
    tutti_redop_t r = to_redop(op, name);
    if (t.scalar_type() != at::kBool)
        return { to_dtype(t, name), r };
    TORCH_CHECK(op.op_ != c10d::ReduceOp::PREMUL_SUM, "tutti backend: ", name,
                ": reduce op PREMUL_SUM does not apply to bool tensors");
    switch (r) {
    case TUTTI_SUM:
    case TUTTI_MAX: r = TUTTI_MAX; break;
    case TUTTI_PROD:
    case TUTTI_MIN: r = TUTTI_MIN; break;
    case TUTTI_AVG:
        TORCH_CHECK(false, "tutti backend: ", name, ": reduce op AVG does not apply to bool "
                           "tensors");
    default: break;
    }
    return { TUTTI_UINT8, r };
}

/* An exception's message without torch's backtrace (a c10::Error's what() carries one) */
const char *no_backtrace(const std::exception &e)
{
    const auto *ce = dynamic_cast<const c10::Error *>(&e);
    return ce ? ce->what_without_backtrace() : e.what();
}

void check_device(const at::Tensor &t, const char *op)
{
    TORCH_CHECK(t.device().is_cpu() || t.device().is_cuda(), "tutti backend: ", op,
                ": only CPU and CUDA tensors are supported, got ", t.device());
    TORCH_CHECK(t.layout() == at::kStrided, "tutti backend: ", op,
                ": only dense (strided) tensors are supported");
}

const at::Tensor &single(const std::vector<at::Tensor> &ts, const char *op)
{
    TORCH_CHECK(ts.size() == 1, "tutti backend: ", op, " takes one tensor per call, got ",
                ts.size());
    check_device(ts[0], op);
    return ts[0];
}

/* Tensors of like's dtype, each on the CPU or a GPU. */
void same_dtype(const std::vector<at::Tensor> &ts, const at::Tensor &like, const char *op)
{
    for (const auto &t : ts) {
        check_device(t, op);
        TORCH_CHECK(t.scalar_type() == like.scalar_type(), "tutti backend: ", op,
                    ": tensors of different dtypes (", t.scalar_type(), " and ", like.scalar_type(),
                    ")");
    }
}

/* One list of `size` tensors, as op takes it: saying what it got otherwise (gloo says
 * "Incorrect output list size 3") */
void list_of(const std::vector<std::vector<at::Tensor>> &lists, int size, const char *op)
{
    TORCH_CHECK(lists.size() == 1, "tutti backend: ", op, ": takes one list of ", size,
                " tensors, got ", lists.size(), " lists");
    TORCH_CHECK((int)lists[0].size() == size, "tutti backend: ", op, ": takes a list of ", size,
                " tensors (one per rank), got ", lists[0].size());
}

/* The one list of `size` tensors, each of like's dtype and length, that op takes (the
 * root's, or every rank's). */
const std::vector<at::Tensor> &rank_list(const std::vector<std::vector<at::Tensor>> &lists,
                                         const at::Tensor &like, int size, const char *op)
{
    list_of(lists, size, op);
    same_dtype(lists[0], like, op);
    for (size_t i = 0; i < lists[0].size(); i++)
        TORCH_CHECK(lists[0][i].numel() == like.numel(), "tutti backend: ", op,
                    ": the list's tensor ", i, " has ", lists[0][i].numel(),
                    " elements, this rank's own tensor ", like.numel(), " (they must match)");
    return lists[0];
}

/* The list of `size` tensors of like's dtype that allgather and reduce_scatter take
 * (every rank's, so every rank knows whether it is even): its elements per rank, empty
 * where every tensor has like's length. Uneven lists, as NCCL's backend takes them (gloo
 * refuses them), go to tutti's v forms; this rank's own tensor must be like's length. */
std::vector<size_t> uneven_counts(const std::vector<std::vector<at::Tensor>> &lists,
                                  const at::Tensor &like, int size, int rank, const char *op)
{
    list_of(lists, size, op);
    same_dtype(lists[0], like, op);
    const auto &ts = lists[0];
    if (std::all_of(ts.begin(), ts.end(),
                    [&](const at::Tensor &t) { return t.numel() == like.numel(); }))
        return {};
    TORCH_CHECK(ts[rank].numel() == like.numel(), "tutti backend: ", op, " on rank ", rank,
                ": this rank's tensor has ", like.numel(), " elements, its place in the list ",
                ts[rank].numel());
    std::vector<size_t> counts;
    for (const auto &t : ts)
        counts.push_back((size_t)t.numel());
    return counts;
}

/* What a non-root passes for the root's list: nothing, or one empty list. */
void check_no_list(const std::vector<std::vector<at::Tensor>> &lists, const char *op)
{
    TORCH_CHECK(lists.empty() || (lists.size() == 1 && lists[0].empty()), "tutti backend: ", op,
                ": only the root rank takes a list of tensors");
}

/* PREMUL_SUM's factor as a tensor (torch 2.x holds one, 1.13 a list), or none. */
template <typename S, typename = void> struct one_factor : std::false_type {};
template <typename S>
struct one_factor<S, std::void_t<decltype(std::declval<S &>().tensor_factor)>> : std::true_type {
};
template <typename S> at::Tensor factor_tensor(const S &s)
{
    if constexpr (one_factor<S>::value)
        return s.tensor_factor;
    else
        return s.tensor_factors.empty() ? at::Tensor() : s.tensor_factors[0];
}

/* What a reduction sends for in: in itself, or for PREMUL_SUM (torch's
 * _make_nccl_premul_sum, NCCL's ncclRedOpCreatePreMulSum) in times the factor in a new
 * tensor (a caller's input is only read), which then reduces as SUM. The factor takes
 * in's dtype first, as NCCL's backend casts it (an integer tensor: the factor truncated). */
at::Tensor premul(const at::Tensor &in, const c10d::ReduceOp &op, const char *name)
{
    if (op.op_ != c10d::ReduceOp::PREMUL_SUM)
        return in;
    auto *s = dynamic_cast<c10d::NCCLPreMulSumSupplement *>(op.supplement_.get());
    TORCH_CHECK(s, "tutti backend: ", name, ": reduce op PREMUL_SUM without its factor");
    at::Tensor f = factor_tensor(*s);
#if TUTTI_TORCH_AT_LEAST(2, 1)
    /* float8: multiplied in float32 and cast back (torch has no float8 arithmetic on
     * every device and version) */
    if (in.scalar_type() == c10::ScalarType::Float8_e4m3fn ||
        in.scalar_type() == c10::ScalarType::Float8_e5m2)
        return (f.defined() ? in.to(at::kFloat).mul(f.to(in.device(), at::kFloat).reshape({}))
                            : in.to(at::kFloat).mul(s->double_factor))
            .to(in.scalar_type());
#endif
    if (f.defined()) {
        TORCH_CHECK(f.numel() == 1, "tutti backend: ", name, ": PREMUL_SUM's factor has ",
                    f.numel(), " elements, not 1");
        return in.mul(f.to(in.device(), in.scalar_type()).reshape({}));
    }
    if (at::isIntegralType(in.scalar_type(), /*includeBool=*/false))
        return in.mul(static_cast<int64_t>(s->double_factor));
    return in.mul(s->double_factor);
}

/* CUDA tensors are staged through host memory, as gloo's CUDA paths do: tutti works on
 * a pinned host buffer, filled from the tensor when the call is issued (a blocking copy
 * on the caller's current stream: it sees every kernel queued there before the call)
 * and copied back when the op is done (a blocking copy, before the work completes).
 *
 * A pinned host buffer shaped as t, holding t's elements if fill. */
at::Tensor staged(const at::Tensor &t, bool fill)
{
    at::Tensor h = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
    if (fill)
        h.copy_(t);
    return h;
}

/* A contiguous host buffer holding t's elements: t itself, or a copy written back by
 * copy_back. */
at::Tensor contig(const at::Tensor &t)
{
    if (t.device().is_cuda())
        return staged(t, true);
    return t.is_contiguous() ? t : t.contiguous();
}

/* A contiguous host buffer for what the op writes into t (its old elements unused). */
at::Tensor out_buf(const at::Tensor &t)
{
    return t.device().is_cuda() ? staged(t, false) : contig(t);
}

bool any_cuda(const std::vector<at::Tensor> &ts)
{
    return std::any_of(ts.begin(), ts.end(), [](const at::Tensor &t) { return t.is_cuda(); });
}

/* A new 1-d host buffer of n elements of like's dtype, pinned where it goes to a GPU. */
at::Tensor host_empty(int64_t n, const at::Tensor &like, bool pinned)
{
    return at::empty({ n }, like.options().device(at::kCPU).pinned_memory(pinned));
}

/* Writes the result into t as tutti itself would (or NCCL): outside autograd, so a leaf
 * that requires grad takes it, and without bumping t's version counter (.data's alias). */
void write_into(const at::Tensor &t, const at::Tensor &from)
{
    t.variable_data().copy_(from);
}

std::function<void()> copy_back(at::Tensor t, at::Tensor buf)
{
    if (buf.is_same(t))
        return nullptr;
    return [t, buf]() mutable { write_into(t, buf); };
}

/* A batch's outputs and inputs: as many of each (at least one), all of one dtype. */
void pairs_of_one_dtype(const std::vector<at::Tensor> &outputs,
                        const std::vector<at::Tensor> &inputs, const char *name)
{
    TORCH_CHECK(!inputs.empty() && outputs.size() == inputs.size(), "tutti backend: ", name,
                ": needs as many outputs as inputs (at least one), got ", outputs.size(), " and ",
                inputs.size());
    same_dtype(inputs, inputs[0], name);
    same_dtype(outputs, inputs[0], name);
}

/* Every tensor's elements, back to back, in one new 1-d host tensor (tensors all on one
 * GPU joined there, then copied once; on several devices, each copied to the host). */
/* gloo's lists of several tensors (torch's *_multigpu calls, on CPU tensors too): every
 * tensor of like's dtype and length, as gloo asks */
void same_shape_list(const std::vector<at::Tensor> &ts, const char *op)
{
    for (size_t i = 0; i < ts.size(); i++) {
        check_device(ts[i], op);
        TORCH_CHECK(ts[i].scalar_type() == ts[0].scalar_type() && ts[i].numel() == ts[0].numel(),
                    "tutti backend: ", op, ": the list's tensor ", i, " is ", ts[i].numel(), " x ",
                    ts[i].scalar_type(), ", tensor 0 ", ts[0].numel(), " x ", ts[0].scalar_type(),
                    " (a list's tensors must match)");
    }
}

/* A list's tensors reduced into one new host tensor by op, as gloo's allreduce of a list
 * reduces across it before the ranks (AVG: their mean; PREMUL_SUM: each scaled first) */
at::Tensor reduce_list(const std::vector<at::Tensor> &ts, const c10d::ReduceOp &op,
                       const char *name)
{
    at::NoGradGuard no_grad;
    auto in = [&](const at::Tensor &t) { return premul(t.to(at::kCPU).contiguous(), op, name); };
    at::Tensor acc = in(ts[0]).clone();
    for (size_t i = 1; i < ts.size(); i++) {
        at::Tensor x = in(ts[i]);
        switch (op.op_) {
        case c10d::ReduceOp::PRODUCT: acc.mul_(x); break;
        case c10d::ReduceOp::MIN: acc = at::minimum(acc, x); break;
        case c10d::ReduceOp::MAX: acc = at::maximum(acc, x); break;
        case c10d::ReduceOp::BAND: acc.bitwise_and_(x); break;
        case c10d::ReduceOp::BOR: acc.bitwise_or_(x); break;
        case c10d::ReduceOp::BXOR: acc.bitwise_xor_(x); break;
        default: acc.add_(x); break; /* SUM, AVG, PREMUL_SUM (scaled) */
        }
    }
    if (op.op_ == c10d::ReduceOp::AVG) {
        TORCH_CHECK(at::isFloatingType(acc.scalar_type()) || at::isComplexType(acc.scalar_type()),
                    "tutti backend: ", name, ": AVG of a list of ", acc.scalar_type(),
                    " tensors: floating point only");
        acc.div_((double)ts.size());
    }
    return acc.is_contiguous() ? acc : acc.contiguous();
}

at::Tensor flatten(const std::vector<at::Tensor> &ts)
{
    bool mixed = std::any_of(ts.begin(), ts.end(), [&](const at::Tensor &t) {
        return t.device() != ts[0].device();
    });
    std::vector<at::Tensor> flat;
    flat.reserve(ts.size());
    for (const auto &t : ts)
        flat.push_back((mixed ? contig(t) : t).reshape({ -1 }));
    at::Tensor cat = at::cat(flat);
    return cat.is_cuda() ? staged(cat, true) : cat;
}

/* Copies consecutive pieces of flat into ts (the inverse of flatten), from element off. */
void unflatten(const at::Tensor &flat, int64_t off, std::vector<at::Tensor> &ts)
{
    for (auto &t : ts) {
        write_into(t, flat.narrow(0, off, t.numel()).view(t.sizes()));
        off += t.numel();
    }
}

void check_root(int64_t root, int size, const char *op, const char *what = "root rank")
{
    TORCH_CHECK(root >= 0 && root < size, "tutti backend: ", op, ": ", what, " ", root,
                " out of range (group of ", size, ")");
}

size_t total(const std::vector<size_t> &v)
{
    return std::accumulate(v.begin(), v.end(), size_t(0));
}

/* Element counts of the rank blocks of t along dim 0: splits (rows), or equal ones. */
std::vector<size_t> split_counts(const at::Tensor &t, const std::vector<int64_t> &splits, int size,
                                 const char *side)
{
    std::vector<size_t> counts(size);
    int64_t rows = t.dim() ? t.size(0) : 1;
    int64_t row = rows ? t.numel() / rows : 0;
    if (splits.empty()) {
        TORCH_CHECK(rows % size == 0, "tutti backend: alltoall_base: ", side, " has ", rows,
                    " rows, not a multiple of the group size ", size);
        for (auto &c : counts)
            c = (size_t)(rows / size * row);
        return counts;
    }
    TORCH_CHECK((int)splits.size() == size, "tutti backend: alltoall_base: ", side, " split has ",
                splits.size(), " sizes for a group of ", size);
    int64_t sum = 0;
    for (int i = 0; i < size; i++) {
        TORCH_CHECK(splits[i] >= 0, "tutti backend: alltoall_base: negative split size");
        counts[i] = (size_t)(splits[i] * row);
        sum += splits[i];
    }
    TORCH_CHECK(sum == rows, "tutti backend: alltoall_base: ", side, " split sizes add up to ", sum,
                ", the tensor has ", rows, " rows");
    return counts;
}

constexpr uint32_t kMonitorTag = 0x7474ffffu; /* monitoredBarrier's messages */

/* A sparse allreduce's first stage: each rank's tensor described in kSparseMeta int64s
 * (marker, dtype, sparse dims, dense dims, nnz, dims, sizes), gathered from every rank. */
constexpr int64_t kSparseMeta = 32;
constexpr int64_t kSparseMaxDims = kSparseMeta - 6;
constexpr int64_t kSparseMarker = 0x7475737061727365; /* "tutsparse" */

/* A rank's indices and values are padded to this, so that views of them in the bytes
 * received are aligned for every dtype (complex128's 16 bytes). */
size_t pad16(size_t n)
{
    return (n + 15) & ~size_t(15);
}

/* The sum of every rank's piece of a sparse tensor (idx[r]: sparse dims x n_r indices,
 * val[r]: n_r rows of values), coalesced. Each rank sent its tensor coalesced, so each
 * piece's indices are unique and in order: the pieces are merged, each index's rows
 * added straight into the sum in rank order (one pass, no sort of them all: torch's
 * coalesce, gloo's way, took 15 ms of a 4 MiB call at 2 ranks here, the merge 3). Every
 * rank computes it alike from the same bytes, so every rank gets the same tensor. A
 * piece out of order (a rank that sent something else) or sizes whose product overflows
 * go through coalesce instead. Indices outside the sizes are refused, naming the rank. */
at::Tensor sparse_sum(const std::vector<at::Tensor> &idx, const std::vector<at::Tensor> &val,
                      const std::vector<int64_t> &sizes, int64_t sd, const at::TensorOptions &vopts)
{
    const size_t nr = idx.size();
    std::vector<int64_t> stride(sd, 1);
    bool ordered = true;
    for (int64_t d = sd - 1; d > 0; d--)
        ordered = ordered && !__builtin_mul_overflow(stride[d], sizes[d], &stride[d - 1]);
    std::vector<std::vector<int64_t>> keys(nr);
    for (size_t r = 0; r < nr; r++) {
        const int64_t n = idx[r].size(1), *ip = idx[r].data_ptr<int64_t>();
        keys[r].assign(n, 0);
        for (int64_t d = 0; d < sd; d++)
            for (int64_t j = 0; j < n; j++) {
                int64_t x = ip[d * n + j];
                TORCH_CHECK(x >= 0 && x < sizes[d], "tutti backend: allreduce of a sparse tensor: "
                            "rank ", r, " sent index ", x, " in dimension ", d, " of size ",
                            sizes[d]);
                keys[r][j] += x * stride[d];
            }
        for (int64_t j = 1; j < n && ordered; j++)
            ordered = keys[r][j - 1] < keys[r][j];
    }
    at::NoGradGuard no_grad;
    if (!ordered)
        return at::sparse_coo_tensor(at::cat(idx, 1), at::cat(val, 0), sizes,
                                     vopts.layout(at::kSparse))
            .coalesce();
    /* the merge: the sum's indices, and for each which piece's row (rank, j) goes in,
     * in rank order; at 2 ranks a look at both heads, from 3 a heap (test_sparse_allreduce
     * runs 2 and 3 ranks: each way) */
    std::vector<int64_t> out_keys;
    std::vector<std::pair<uint32_t, int64_t>> rows; /* (rank, j), grouped by out key */
    std::vector<int64_t> group_end;                 /* rows[..group_end[k]] make key k */
    std::vector<int64_t> at_(nr, 0);
    using head = std::pair<int64_t, uint32_t>;
    std::priority_queue<head, std::vector<head>, std::greater<head>> heap;
    const bool use_heap = nr > 2;
    if (use_heap)
        for (size_t r = 0; r < nr; r++)
            if (!keys[r].empty())
                heap.emplace(keys[r][0], (uint32_t)r);
    for (;;) {
        int64_t k;
        uint32_t r;
        if (use_heap) {
            if (heap.empty())
                break;
            std::tie(k, r) = heap.top();
            heap.pop();
            if (++at_[r] < (int64_t)keys[r].size())
                heap.emplace(keys[r][at_[r]], r);
            at_[r]--; /* the row taken is at_[r], advanced below */
        } else {
            r = UINT32_MAX;
            k = INT64_MAX;
            for (size_t q = 0; q < nr; q++)
                if (at_[q] < (int64_t)keys[q].size() && keys[q][at_[q]] < k)
                    k = keys[q][at_[q]], r = (uint32_t)q;
            if (r == UINT32_MAX)
                break;
        }
        if (out_keys.empty() || out_keys.back() != k) {
            if (!out_keys.empty())
                group_end.push_back((int64_t)rows.size());
            out_keys.push_back(k);
        }
        rows.emplace_back(r, at_[r]++);
    }
    if (!out_keys.empty())
        group_end.push_back((int64_t)rows.size());
    const int64_t nout = (int64_t)out_keys.size();
    std::vector<int64_t> vs(val[0].sizes().begin(), val[0].sizes().end());
    vs[0] = nout;
    at::Tensor out_val = at::empty(vs, vopts);
    const int64_t width = nout ? out_val.numel() / nout : 0;
    AT_DISPATCH_ALL_TYPES_AND_COMPLEX_AND3(
        at::kHalf, at::kBFloat16, at::kBool, out_val.scalar_type(), "tutti_sparse_sum", [&] {
            std::vector<const scalar_t *> src(nr);
            for (size_t q = 0; q < nr; q++)
                src[q] = val[q].data_ptr<scalar_t>();
            scalar_t *dst = out_val.data_ptr<scalar_t>();
            int64_t g = 0;
            for (int64_t o = 0; o < nout; o++, dst += width) {
                const auto &first = rows[g++];
                std::copy_n(src[first.first] + first.second * width, width, dst);
                for (; g < group_end[o]; g++) {
                    const scalar_t *in = src[rows[g].first] + rows[g].second * width;
                    for (int64_t e = 0; e < width; e++) {
                        if constexpr (std::is_same_v<scalar_t, bool>)
                            dst[e] = dst[e] || in[e];
                        else
                            dst[e] = dst[e] + in[e];
                    }
                }
            }
        });
    at::Tensor out_idx = at::empty({ sd, nout }, at::kLong);
    int64_t *op = out_idx.data_ptr<int64_t>();
    for (int64_t j = 0; j < nout; j++)
        for (int64_t d = 0, k = out_keys[j]; d < sd; d++) {
            op[d * nout + j] = k / stride[d];
            k %= stride[d];
        }
    return at::_sparse_coo_tensor_unsafe(out_idx, out_val, sizes, vopts.layout(at::kSparse))
        ._coalesced_(true);
}

/* "float32 [4, 3] (1 sparse dim)" from a first-stage row. */
std::string sparse_desc(const int64_t *m)
{
    std::string s = c10::toString(static_cast<at::ScalarType>(m[1]));
    s += " [";
    for (int64_t d = 0; d < m[5] && d < kSparseMaxDims; d++)
        s += (d ? ", " : "") + std::to_string(m[6 + d]);
    return s + "] (" + std::to_string(m[2]) + " sparse dims)";
}

/* A work's future: one that holds GPU tensors names their devices, as torch's CUDA-aware
 * futures must (their continuations then wait on the streams it completed on). */
c10::intrusive_ptr<c10::ivalue::Future> make_future(const std::vector<at::Tensor> &outputs)
{
    std::vector<c10::Device> devices;
    for (const auto &t : outputs)
        if (t.is_cuda() && std::find(devices.begin(), devices.end(), t.device()) == devices.end())
            devices.push_back(t.device());
    return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                    std::move(devices));
}

} // namespace

/* ---- Completer ---- */

Completer::Completer() : state_(std::make_shared<State>())
{
    std::lock_guard<std::mutex> g(state_->mu);
    state_->idle = 1;
    auto s = state_;
    state_->threads.emplace_back([s] { run(s); });
}

Completer::~Completer()
{
    if (state_)
        stop();
}

void Completer::abandon()
{
    new std::shared_ptr<State>(std::move(state_)); /* never deleted: see the header */
}

void Completer::push(WorkTutti *work, int status)
{
    std::lock_guard<std::mutex> g(state_->mu);
    state_->queue.emplace_back(work, status);
    state_->cv.notify_one();
}

void Completer::stop()
{
    State &st = *state_;
    std::unique_lock<std::mutex> g(st.mu);
    st.stopping = true;
    st.cv.notify_all();
    while (!st.threads.empty()) {
        std::vector<std::thread> ts;
        ts.swap(st.threads);
        g.unlock();
        for (auto &t : ts) {
            if (t.get_id() == std::this_thread::get_id())
                t.detach(); /* the group's last reference went in a continuation: this
                               thread's run() holds the state */
            else
                t.join();
        }
        g.lock();
    }
}

void Completer::run(std::shared_ptr<State> s)
{
    std::unique_lock<std::mutex> g(s->mu);
    for (;;) {
        s->cv.wait(g, [&s] { return s->stopping || !s->queue.empty(); });
        if (s->queue.empty())
            return;
        auto item = s->queue.front();
        s->queue.pop_front();
        if (--s->idle == 0 && s->threads.size() < kMaxThreads && !s->stopping) {
            s->idle++;
            s->threads.emplace_back([s] { run(s); });
        }
        g.unlock();
        auto work = c10::intrusive_ptr<WorkTutti>::reclaim(item.first);
        work->complete(item.second);
        work.reset(); /* may be the group's last reference: the Completer goes, s stays */
        g.lock();
        s->idle++;
    }
}

/* ---- WorkFuture ---- */

void WorkFuture::settle(c10::ivalue::Future &future, c10::IValue value, std::exception_ptr err,
                        const char *what)
{
    try {
        if (err)
            future.setError(err);
        else
            future.markCompleted(std::move(value));
    } catch (const std::exception &e) { /* a C++ callback's (Python's catch their own) */
        TORCH_WARN("tutti backend: rank ", rank_, ": a callback of ", what,
                   "'s future threw: ", e.what());
    } catch (...) {
        TORCH_WARN("tutti backend: rank ", rank_, ": a callback of ", what, "'s future threw");
    }
    finish(err);
}

/* ---- WorkTutti ---- */

WorkTutti::WorkTutti(int rank, c10d::OpType type, const char *name_,
                     std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout,
                     Completer *completer_)
    : WorkFuture(rank, type), name(name_), completer(completer_), outputs_(std::move(outputs)),
      timeout_(timeout), future_(make_future(outputs_))
{
    /* the caller's current stream on the (first) GPU the results go to: the results are
     * copied back on it, after the work the caller queued there before the call, and the
     * future completes with that device current (its continuations run there) */
    for (const auto &t : outputs_) {
        if (t.is_cuda()) {
            stream_ = c10::impl::VirtualGuardImpl(t.device().type()).getStream(t.device());
            break;
        }
    }
}

WorkTutti::~WorkTutti()
{
    if (handle)
        tutti_work_free(handle);
}

void WorkTutti::on_done(void *arg, int status)
{
    auto *work = static_cast<WorkTutti *>(arg);
    int unclaimed = kUnclaimed;
    if (work->finishing_.compare_exchange_strong(unclaimed, kCompleterFinishes))
        work->completer->push(work, status);
    else
        c10::intrusive_ptr<WorkTutti>::reclaim(work); /* the waiter, which holds one too */
}

void WorkTutti::complete(int status)
{
    c10::OptionalStreamGuard on_stream(stream_); /* none for CPU results */
    std::exception_ptr err;
    if (status == TUTTI_OK && finisher) {
        try {
            finisher();
        } catch (...) {
            err = std::current_exception();
        }
    } else if (status != TUTTI_OK) {
        /* a timeout says "Timed out", as gloo's do: torch's suite (its barrier timeout
         * tests) and code written against gloo look for the words */
        err = std::make_exception_ptr(
            /* {}: no backtrace (a string in torch 1.x, a lazy value in 2.x) */
            c10::Error(c10::str("tutti backend: ", name, " failed on rank ", rank_, ": ",
                                status == TUTTI_ERR_TIMEOUT ? "Timed out (" : "",
                                tutti_status_name(status),
                                status == TUTTI_ERR_TIMEOUT ? ")" : "", ": ",
                                tutti_work_error(handle)),
                       {}));
    }
    finisher = nullptr;
    buffers.clear();
    settle(*future_,
           err               ? c10::IValue()
           : nested_.empty() ? c10::IValue(outputs_)
                             : c10::IValue(nested_),
           err, name);
}

bool WorkTutti::wait(std::chrono::milliseconds timeout)
{
    /* By default the group's timeout, and a second more: the op's own deadline in tutti
     * (the same timeout, from its start) then fails it first, naming the peer. */
    if (timeout == kNoTimeout)
        timeout = timeout_ + std::chrono::milliseconds(1000);
    /* A wait at least as long as the op's own deadline may run the op on this thread
     * (tutti_wait without a bound does, when the op has not started) and finish it here,
     * unless the completion callback came first. */
    int unclaimed = kUnclaimed;
    if (timeout >= timeout_ && finishing_.compare_exchange_strong(unclaimed, kWaiterFinishes))
        complete(tutti_wait(handle, -1));
    std::unique_lock<std::mutex> g(mutex_);
    if (!cv_.wait_for(g, timeout, [this] { return completed_; }))
        TORCH_CHECK(false, "tutti backend: ", name, " on rank ", rank_, ": Timed out after ",
                    timeout.count(), " ms (not done)");
    if (exception_)
        std::rethrow_exception(exception_);
    return true;
}

int WorkTutti::sourceRank() const
{
    int src = handle ? tutti_work_source(handle) : -1;
    TORCH_CHECK(src >= 0, "tutti backend: ", name, " on rank ", rank_,
                ": no source rank (not a finished receive)");
    return src;
}

std::vector<at::Tensor> WorkTutti::result()
{
    return outputs_;
}

void WorkTutti::nest(std::vector<std::vector<at::Tensor>> lists)
{
    future_ = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::ListType::create(c10::TensorType::get())),
        future_->devices());
    nested_ = std::move(lists);
}

c10::intrusive_ptr<c10::ivalue::Future> WorkTutti::getFuture()
{
    return future_;
}

/* ---- WorkSparse ---- */

WorkSparse::WorkSparse(int rank, std::vector<at::Tensor> outputs,
                       std::chrono::milliseconds timeout)
    : WorkFuture(rank, c10d::OpType::ALLREDUCE), outputs_(std::move(outputs)), timeout_(timeout),
      future_(make_future(outputs_))
{
}

void WorkSparse::done(std::exception_ptr err)
{
    settle(*future_, err ? c10::IValue() : c10::IValue(outputs_), err, "a sparse allreduce");
}

/* By default within both stages' bounds: each fails by its own deadline first. */
bool WorkSparse::wait(std::chrono::milliseconds timeout)
{
    if (timeout == kNoTimeout)
        timeout = timeout_;
    std::unique_lock<std::mutex> g(mutex_);
    if (!cv_.wait_for(g, timeout, [this] { return completed_; }))
        TORCH_CHECK(false, "tutti backend: allreduce of a sparse tensor on rank ", rank_,
                    ": Timed out after ", timeout.count(), " ms (not done)");
    if (exception_)
        std::rethrow_exception(exception_);
    return true;
}

std::vector<at::Tensor> WorkSparse::result()
{
    return outputs_;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkSparse::getFuture()
{
    return future_;
}

/* ---- ProcessGroupTutti: set-up ---- */

namespace
{
/* A call's own timeout: its options' `timeout` (gloo's backend honours it a call; unset:
 * the group's), from the collective's entry to its launch, on the calling thread. */
thread_local std::chrono::milliseconds call_timeout = c10d::kUnsetTimeout;

struct CallTimeout {
    explicit CallTimeout(std::chrono::milliseconds t) : prev(call_timeout)
    {
        call_timeout = t;
    }
    ~CallTimeout()
    {
        call_timeout = prev;
    }
    CallTimeout(const CallTimeout &) = delete;
    CallTimeout &operator=(const CallTimeout &) = delete;
    std::chrono::milliseconds prev;
};

int clamp_ms(std::chrono::milliseconds t)
{
    return (int)std::min<int64_t>(std::max<int64_t>(t.count(), INT_MIN), INT_MAX);
}
} // namespace

ProcessGroupTutti::ProcessGroupTutti(const c10::intrusive_ptr<c10d::Store> &store, int rank,
                                     int size, std::chrono::milliseconds timeout)
    : PGBase(rank, size), timeout_(timeout), op_timeout_(timeout), owner_pid_(getpid())
{
    tutti_comm_opts_t opts;
    tutti_comm_opts_init(&opts);
    const char *env_timeout = std::getenv("TUTTI_TIMEOUT_MS"); /* set on purpose: wins */
    if (!env_timeout || !*env_timeout)
        opts.timeout_ms = (int)std::min<int64_t>(timeout.count(), INT_MAX);
    /* what bounds every op in tutti: a wait at least this long may run the op itself */
    if (opts.timeout_ms > 0)
        op_timeout_ = std::chrono::milliseconds(opts.timeout_ms);
    torch_store_ = store;
    rendezvous(*store, &opts);
    int st = tutti_comm_init(&comm_, store_, rank, size, &opts);
    if (st != TUTTI_OK) {
        /* (a failed init's explanation is the thread's: tutti.h) */
        std::string why = tutti_comm_last_error(nullptr);
        if (why.empty())
            why = tutti_store_last_error(store_);
        tutti_store_close(store_);
        TORCH_CHECK(false, "tutti backend: rank ", rank, " of ", size,
                    ": communicator set-up failed: ", tutti_status_name(st), " (", why, ")");
    }
    init(); /* torch's API-usage logging, as ProcessGroupGloo does (1.x and 2.x) */
}

/* ---- torch's store as a tutti store (tutti_store_ops_t) ---- */

namespace
{

/* store_wait's own timeout: the keys were missing when it looked last (a key that comes
 * just after must not turn it into a store failure: set-up's sliced waits go on after a
 * timeout, and failed on TUTTI_ERR_STORE, "not there after 79 ms", in a loaded run) */
struct KeysMissing : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/* Runs a c10d::Store call; a thrown error becomes TUTTI_ERR_STORE with its text, or
 * TUTTI_ERR_TIMEOUT for store_wait's timeout or when keys (those waited for) are still
 * missing after it. */
template <class Fn>
int store_call(c10d::Store *st, const std::vector<std::string> &keys, char *errbuf, size_t errlen,
               Fn &&fn)
{
    try {
        fn();
        return TUTTI_OK;
    } catch (const KeysMissing &e) {
        snprintf(errbuf, errlen, "%s", e.what());
        return TUTTI_ERR_TIMEOUT;
    } catch (const std::exception &e) {
        snprintf(errbuf, errlen, "%s", no_backtrace(e));
    }
    try {
        if (!keys.empty() && !st->check(keys))
            return TUTTI_ERR_TIMEOUT;
    } catch (const std::exception &) {
    }
    return TUTTI_ERR_STORE;
}

/* Waits for keys within timeout_ms (0: only looks, -1: a day) by polling check():
 * TCPStore's own wait with a timeout leaves its reply unread on the connection when it
 * times out, and the next call on the store then reads that reply as its own. */
void store_wait(c10d::Store *st, const std::vector<std::string> &keys, int timeout_ms)
{
    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(timeout_ms < 0 ? 86400000 : timeout_ms);
    auto pause = std::chrono::microseconds(200);
    while (!st->check(keys)) {
        if (std::chrono::steady_clock::now() >= deadline)
            throw KeysMissing(c10::str("not there after ", timeout_ms, " ms"));
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(20000));
    }
}

uint8_t *malloc_copy(const std::vector<uint8_t> &v, size_t *len_p)
{
    auto *p = static_cast<uint8_t *>(malloc(v.size() + 1));
    TORCH_CHECK(p, "out of memory");
    std::copy(v.begin(), v.end(), p);
    p[v.size()] = 0;
    *len_p = v.size();
    return p;
}

const tutti_store_ops_t *torch_store_ops()
{
    static tutti_store_ops_t ops = [] {
        tutti_store_ops_t o{};
        o.size = sizeof(o);
        o.set = [](void *ctx, const char *key, const void *value, size_t len, int, char *eb,
                   size_t el) {
            auto *st = static_cast<c10d::Store *>(ctx);
            auto *v = static_cast<const uint8_t *>(value);
            return store_call(st, {}, eb, el,
                              [&] { st->set(key, std::vector<uint8_t>(v, v + len)); });
        };
        o.get = [](void *ctx, const char *key, void **value_p, size_t *len_p, int timeout_ms,
                   char *eb, size_t el) {
            auto *st = static_cast<c10d::Store *>(ctx);
            return store_call(st, { key }, eb, el, [&] {
                store_wait(st, { key }, timeout_ms);
                *value_p = malloc_copy(st->get(key), len_p);
            });
        };
        o.add = [](void *ctx, const char *key, int64_t delta, int64_t *result_p, int, char *eb,
                   size_t el) {
            auto *st = static_cast<c10d::Store *>(ctx);
            return store_call(st, {}, eb, el, [&] {
                int64_t r = st->add(key, delta);
                if (result_p)
                    *result_p = r;
            });
        };
        o.compare_set = [](void *ctx, const char *key, const void *expected, size_t elen,
                           const void *desired, size_t dlen, void **current_p, size_t *curlen_p,
                           int, char *eb, size_t el) {
            auto *st = static_cast<c10d::Store *>(ctx);
            auto *e = static_cast<const uint8_t *>(expected);
            auto *d = static_cast<const uint8_t *>(desired);
            std::vector<uint8_t> ev(e, e + elen), dv(d, d + dlen);
            return store_call(st, {}, eb, el, [&] {
                std::vector<uint8_t> cur = st->compareSet(key, ev, dv);
                /* torch's stores answer `expected` for a missing key (a swap that took
                 * place answers `desired`): the value after is then none */
                if (elen && cur == ev && ev != dv)
                    cur.clear();
                if (current_p) {
                    size_t n;
                    *current_p = malloc_copy(cur, &n);
                    if (curlen_p)
                        *curlen_p = n;
                }
            });
        };
        o.check = [](void *ctx, const char *const *keys, size_t n, int *exists_p, int, char *eb,
                     size_t el) {
            auto *st = static_cast<c10d::Store *>(ctx);
            return store_call(st, {}, eb, el, [&] {
                *exists_p = st->check({ keys, keys + n }) ? 1 : 0;
            });
        };
        o.del = [](void *ctx, const char *key, int *deleted_p, int, char *eb, size_t el) {
            auto *st = static_cast<c10d::Store *>(ctx);
            return store_call(st, {}, eb, el, [&] {
                bool d = st->deleteKey(key);
                if (deleted_p)
                    *deleted_p = d ? 1 : 0;
            });
        };
        o.wait = [](void *ctx, const char *const *keys, size_t n, int timeout_ms, char *eb,
                    size_t el) {
            auto *st = static_cast<c10d::Store *>(ctx);
            std::vector<std::string> ks(keys, keys + n);
            return store_call(st, ks, eb, el, [&] { store_wait(st, ks, timeout_ms); });
        };
        return o;
    }();
    return &ops;
}

} // namespace

/* The communicator meets through torch's store for this group (a PrefixStore per group).
 * The arrival counter numbers this group's instances on that store, and the job id
 * taken from it keeps a re-created group's set-up apart from the last one's. */
void ProcessGroupTutti::rendezvous(c10d::Store &store, tutti_comm_opts_t *opts)
{
    int64_t arrived = store.add("tutti/arrivals", 1);
    std::string gen = std::to_string((arrived - 1) / size_);
    int st = tutti_store_open_ops(&store_, torch_store_ops(), &store, "torch");
    TORCH_CHECK(st == TUTTI_OK, "tutti backend: rank ", rank_,
                ": cannot open torch's store: ", tutti_status_name(st));
    tutti_store_set_timeout(store_, opts->timeout_ms);
    const char *env_job = std::getenv("TUTTI_JOB_ID");
    if (!env_job || !*env_job) {
        job_id_ = "torch-" + gen;
        opts->job_id = job_id_.c_str();
    }
}

/* Without the GIL: the completer threads may need it to finish (Python continuations,
 * Python objects the futures hold), and destroy_process_group drops the group with it. */
ProcessGroupTutti::~ProcessGroupTutti()
{
    if (getpid() != owner_pid_) {
        /* a forked child's copy (its interpreter's finalization, a dropped group): the
         * communicator, its threads, the completer's and the store are the parent's,
         * in use. The library would refuse the destroy; the completer's threads do not
         * exist here (joining them is undefined). All of it is left (the child's
         * memory), as the Python package leaves its communicators in a child. */
        completer_.abandon();
        return;
    }
    PyThreadState *py = Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr;
    tutti_comm_destroy(comm_); /* the queued works' callbacks have run when it returns */
    if (sparse_comm_) {
        /* the sparse calls' first stages are done: their second stages go out on
         * sparse_comm_ (from the completer) before it goes; one later than that bound
         * finds none and fails */
        std::unique_lock<std::mutex> g(sparse_mu_);
        sparse_cv_.wait_for(g, op_timeout_.load() + std::chrono::seconds(5),
                            [this] { return sparse_next_ == sparse_issued_.load(); });
        tutti_comm_t *sc = sparse_comm_;
        sparse_comm_ = nullptr;
        g.unlock();
        tutti_comm_destroy(sc);
    }
    completer_.stop();
    tutti_store_close(store_);
    if (py)
        PyEval_RestoreThread(py);
}

void ProcessGroupTutti::set_timeout(std::chrono::milliseconds timeout)
{
    check_owner("set_timeout");
    TORCH_CHECK(timeout.count() > 0 && timeout.count() <= INT_MAX,
                "tutti backend: set_timeout on rank ", rank_, ": ", timeout.count(),
                " ms: a timeout from 1 ms to ", INT_MAX, " ms (waits are always bounded)");
    {
        std::lock_guard<std::mutex> g(issue_mu_);
        int st = tutti_comm_set_timeout(comm_, (int)timeout.count());
        if (st != TUTTI_OK)
            fail("set_timeout", st);
        op_timeout_ = timeout;
        timeout_ = timeout;
        std::lock_guard<std::mutex> gs(sparse_mu_); /* (sparse_comm_ goes under it) */
        if (sparse_comm_)
            tutti_comm_set_timeout(sparse_comm_, (int)timeout.count());
    }
}

std::string ProcessGroupTutti::transport() const
{
    return tutti_comm_transport(comm_);
}

std::string ProcessGroupTutti::trace() const
{
    check_owner("trace");
    int fd = memfd_create("tutti-trace", MFD_CLOEXEC);
    TORCH_CHECK(fd >= 0, "tutti backend: trace on rank ", rank_, ": memfd_create: ",
                strerror(errno));
    int st = tutti_comm_trace_dump(comm_, fd);
    std::string out;
    off_t len = lseek(fd, 0, SEEK_END);
    if (st == TUTTI_OK && len > 0) {
        out.resize(static_cast<size_t>(len));
        if (pread(fd, &out[0], out.size(), 0) != len)
            st = TUTTI_ERR_IO;
    }
    close(fd);
    TORCH_CHECK(st == TUTTI_OK, "tutti backend: trace on rank ", rank_, ": ",
                tutti_status_name(st));
    return out;
}

void ProcessGroupTutti::check_owner(const char *name) const
{
    pid_t me = getpid();
    TORCH_CHECK(me == owner_pid_, "tutti backend: ", name, " on rank ", rank_,
                ": the process group was made by pid ", owner_pid_, " and is used in pid ", me,
                ", a forked child (a DataLoader worker?): a child makes its own process group; "
                "the parent's is refused, untouched");
}

void ProcessGroupTutti::fail(const char *name, int status)
{
    TORCH_CHECK(false, "tutti backend: ", name, " on rank ", rank_, ": ", tutti_status_name(status),
                ": ", tutti_comm_last_error(comm_));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTutti::launch(c10d::OpType type, const char *name,
                                                         std::vector<at::Tensor> outputs,
                                                         std::vector<at::Tensor> buffers,
                                                         std::function<void()> finisher,
                                                         const Call &call,
                                                         std::vector<std::vector<at::Tensor>> nested)
{
    check_owner(name); /* before issue_mu_, which a parent's thread may have held */
    std::lock_guard<std::mutex> g(issue_mu_);
    const auto group_t = op_timeout_.load();
    const auto t = call_timeout == c10d::kUnsetTimeout ? group_t : call_timeout;
    auto work = c10::make_intrusive<WorkTutti>(rank_, type, name, std::move(outputs), t,
                                               &completer_);
    if (!nested.empty())
        work->nest(std::move(nested));
    work->buffers = std::move(buffers);
    work->finisher = std::move(finisher);
    /* a call's own timeout: the communicator's for this call alone (issue_mu_ keeps
     * other calls out meanwhile) */
    const bool own = t != group_t;
    int st = own ? tutti_comm_set_timeout(comm_, clamp_ms(t)) : TUTTI_OK;
    if (st != TUTTI_OK)
        fail(name, st);
    {
        /* the group's back however the issue ends (a throw from it included) */
        struct Back {
            tutti_comm_t *comm;
            int ms;
            bool on;
            ~Back()
            {
                if (on)
                    tutti_comm_set_timeout(comm, ms);
            }
        } back{ comm_, clamp_ms(group_t), own };
        st = call(&work->handle);
    }
    if (st != TUTTI_OK)
        fail(name, st);
    /* the callback's reference, given back by the completer */
    WorkTutti *ref = c10::intrusive_ptr<WorkTutti>(work).release();
    st = tutti_work_on_done(work->handle, WorkTutti::on_done, ref);
    if (st != TUTTI_OK) {
        c10::intrusive_ptr<WorkTutti>::reclaim(ref);
        fail(name, st);
    }
    if (coalescing_)
        coalesced_.push_back(work);
    return work;
}

void ProcessGroupTutti::begin_batch()
{
    check_owner("startCoalescing");
    std::lock_guard<std::mutex> g(issue_mu_);
    /* torch's _coalescing_manager never ends a batch whose body raised: that one is
     * dropped (its works go on alone), as NCCL's backend resets its own */
    if (coalescing_)
        TORCH_WARN("tutti backend: startCoalescing on rank ", rank_, " with a batch of ",
                   coalesced_.size(), " works still open (never ended): dropped");
    coalesced_.clear();
    coalescing_ = true;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTutti::end_batch()
{
    check_owner("endCoalescing");
    std::lock_guard<std::mutex> g(issue_mu_);
    TORCH_CHECK(coalescing_, "tutti backend: endCoalescing on rank ", rank_,
                " without startCoalescing");
    coalescing_ = false;
    auto batch = c10::make_intrusive<WorkBatch>(rank_, std::move(coalesced_));
    coalesced_.clear();
    batch->arm();
    return batch;
}

/* ---- WorkBatch ---- */

WorkBatch::WorkBatch(int rank, std::vector<c10::intrusive_ptr<WorkTutti>> works)
    : WorkFuture(rank, c10d::OpType::UNKNOWN), works_(std::move(works)), left_(works_.size())
{
    for (auto &w : works_) {
        auto r = w->result();
        outputs_.insert(outputs_.end(), r.begin(), r.end());
    }
    future_ = make_future(outputs_);
}

void WorkBatch::arm()
{
    if (works_.empty()) {
        settle(*future_, c10::IValue(outputs_), nullptr, "a coalesced batch");
        return;
    }
    /* each callback holds the batch until the last has run (the works always complete:
     * tutti fails what it cannot finish, the communicator's destruction included) */
    c10::intrusive_ptr<WorkBatch> self = c10::intrusive_ptr<WorkBatch>::reclaim_copy(this);
    for (auto &w : works_) {
        w->getFuture()->addCallback([self](c10::ivalue::Future &f) {
            if (f.hasError()) {
                std::lock_guard<std::mutex> g(self->err_mu_);
                if (!self->first_error_)
                    self->first_error_ = f.exception_ptr();
            }
            if (--self->left_ == 0) {
                std::exception_ptr err;
                {
                    std::lock_guard<std::mutex> g(self->err_mu_);
                    err = self->first_error_;
                }
                self->settle(*self->future_, err ? c10::IValue() : c10::IValue(self->outputs_), err,
                             "a coalesced batch");
            }
        });
    }
}

/* Within one deadline for all (kNoTimeout: each work's own bound, the group's timeout);
 * the first failure is raised. */
bool WorkBatch::wait(std::chrono::milliseconds timeout)
{
    auto deadline = std::chrono::steady_clock::now() + timeout;
    auto left = [&] {
        if (timeout == kNoTimeout)
            return kNoTimeout;
        return std::max(std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now()),
                        std::chrono::milliseconds(1));
    };
    for (auto &w : works_)
        w->wait(left());
    /* the works are done; the batch finishes in the last one's future callback, which
     * runs just after its work finished */
    std::unique_lock<std::mutex> g(mutex_);
    TORCH_CHECK(cv_.wait_for(g, std::chrono::seconds(10), [this] { return completed_; }),
                "tutti backend: a batch of ", works_.size(), " works on rank ", rank_,
                " not finished 10 s after its works");
    if (exception_)
        std::rethrow_exception(exception_);
    return true;
}

std::vector<at::Tensor> WorkBatch::result()
{
    return outputs_;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkBatch::getFuture()
{
    return future_;
}

/* ---- collectives ---- */

c10::intrusive_ptr<c10d::Work> ProcessGroupTutti::broadcast(std::vector<at::Tensor> &tensors,
                                                            const c10d::BroadcastOptions &opts)
{
    CallTimeout own_timeout(opts.timeout); /* for its launch (gloo's per-call timeout) */
    if (tensors.size() > 1) { /* gloo's list: the root's tensors[rootTensor] into every one */
        same_shape_list(tensors, "broadcast");
        check_root(opts.rootRank, size_, "broadcast");
        TORCH_CHECK(opts.rootTensor >= 0 && opts.rootTensor < (int64_t)tensors.size(),
                    "tutti backend: broadcast: root tensor ", opts.rootTensor,
                    " is not in the list of ", tensors.size());
        bool root = rank_ == opts.rootRank;
        const at::Tensor &src = tensors[opts.rootTensor];
        carrier c = carry(src);
        at::Tensor buf = root ? contig(src) : host_empty(src.numel(), src, any_cuda(tensors));
        std::vector<at::Tensor> ts = tensors;
        return launch(c10d::OpType::BROADCAST, "broadcast", tensors, { buf },
                      [ts, buf]() mutable {
                          for (auto &t : ts)
                              if (!t.is_same(buf))
                                  write_into(t, buf.view(t.sizes()));
                      },
                      [&](tutti_work_t **w) {
                          return tutti_broadcast_async(comm_, buf.data_ptr(), buf.data_ptr(),
                                                       c.n(buf.numel()), c.dt, (int)opts.rootRank,
                                                       w);
                      });
    }
    const at::Tensor &t = single(tensors, "broadcast");
    check_root(opts.rootRank, size_, "broadcast");
    carrier c = carry(t);
    bool root = rank_ == opts.rootRank;
    at::Tensor buf = root ? contig(t) : out_buf(t);
    return launch(c10d::OpType::BROADCAST, "broadcast", tensors, { buf },
                  root ? nullptr : copy_back(t, buf),
                  [&](tutti_work_t **w) {
                      return tutti_broadcast_async(comm_, buf.data_ptr(), buf.data_ptr(),
                                                   c.n(buf.numel()), c.dt, (int)opts.rootRank, w);
                  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTutti::allreduce(std::vector<at::Tensor> &tensors,
                                                            const c10d::AllreduceOptions &opts)
{
    CallTimeout own_timeout(opts.timeout); /* for its launch (gloo's per-call timeout) */
    if (tensors.size() == 1 && tensors[0].layout() == at::kSparse)
        return allreduce_sparse_coo(tensors[0], opts);
    if (tensors.size() > 1) { /* gloo's list: reduced across it, then across the ranks */
        same_shape_list(tensors, "allreduce");
        to_reduction(tensors[0], opts.reduceOp, "allreduce"); /* refuses what op cannot do */
        c10d::ReduceOp after = opts.reduceOp; /* premultiplied in the list's sum already */
        if (after.op_ == c10d::ReduceOp::PREMUL_SUM)
            after = c10d::ReduceOp(c10d::ReduceOp::SUM);
        at::Tensor buf = reduce_list(tensors, opts.reduceOp, "allreduce");
        reduction ra = to_reduction(tensors[0], after, "allreduce");
        std::vector<at::Tensor> ts = tensors;
        return launch(c10d::OpType::ALLREDUCE, "allreduce", tensors, { buf },
                      [ts, buf]() mutable {
                          for (auto &t : ts)
                              write_into(t, buf.view(t.sizes()));
                      },
                      [&](tutti_work_t **w) {
                          return tutti_allreduce_async(comm_, TUTTI_IN_PLACE, buf.data_ptr(),
                                                       buf.numel(), ra.dt, ra.op, w);
                      });
    }
    const at::Tensor &t = single(tensors, "allreduce");
    reduction r = to_reduction(t, opts.reduceOp, "allreduce");
    at::Tensor buf = premul(contig(t), opts.reduceOp, "allreduce");
    return launch(c10d::OpType::ALLREDUCE, "allreduce", tensors, { buf }, copy_back(t, buf),
                  [&](tutti_work_t **w) {
                      return tutti_allreduce_async(comm_, TUTTI_IN_PLACE, buf.data_ptr(),
                                                   buf.numel(), r.dt, r.op, w);
                  });
}

/* Sparse (COO) allreduce, SUM, as gloo's: every rank's indices and values gathered,
 * then summed (sparse_sum, the same on every rank, so every rank gets the same tensor),
 * which replaces t's. The first stage (sizes) is issued here, in the caller's
 * order on comm_; the second (the indices and values, an allgatherv of bytes on
 * sparse_comm_) when the first is done, by sparse_ready in the sparse calls' order. */
c10::intrusive_ptr<c10d::Work> ProcessGroupTutti::allreduce_sparse_coo(
    at::Tensor &t, const c10d::AllreduceOptions &opts)
{
    check_owner("allreduce (sparse)");
    TORCH_CHECK(t.device().is_cpu() || t.device().is_cuda(),
                "tutti backend: allreduce: only CPU and CUDA tensors are supported, got ",
                t.device());
    TORCH_CHECK(opts.reduceOp.op_ == c10d::ReduceOp::SUM,
                "tutti backend: allreduce of a sparse tensor: only ReduceOp.SUM is supported "
                "(as gloo's)");
    TORCH_CHECK(t.dim() <= kSparseMaxDims, "tutti backend: allreduce of a sparse tensor: ",
                t.dim(), " dimensions, at most ", kSparseMaxDims, " are supported");
    at::Tensor in;
    {
        at::NoGradGuard no_grad;
        in = t.coalesce();
        if (in.is_cuda())
            in = in.to(at::kCPU); /* staged through host memory, as gloo's */
    }
    at::Tensor idx = in._indices().contiguous(), val = in._values().contiguous();
    size_t ib = (size_t)idx.numel() * sizeof(int64_t);
    size_t vb = (size_t)val.numel() * val.element_size();
    /* the values 16-byte aligned too (complex128's views need it) */
    at::Tensor packed = at::zeros({ (int64_t)pad16(pad16(ib) + vb) }, at::kByte);
    if (ib)
        memcpy(packed.data_ptr(), idx.data_ptr(), ib);
    if (vb)
        memcpy(packed.data_ptr<uint8_t>() + pad16(ib), val.data_ptr(), vb);
    at::Tensor meta = at::zeros({ kSparseMeta }, at::kLong);
    int64_t *m = meta.data_ptr<int64_t>();
    m[0] = kSparseMarker;
    m[1] = static_cast<int64_t>(in.scalar_type());
    m[2] = in.sparse_dim();
    m[3] = in.dense_dim();
    m[4] = in._nnz();
    m[5] = in.dim();
    for (int64_t d = 0; d < in.dim(); d++)
        m[6 + d] = in.size(d);
    at::Tensor all = at::empty({ size_ * kSparseMeta }, at::kLong);

    auto user = c10::make_intrusive<WorkSparse>(rank_, std::vector<at::Tensor>{ t },
                                                op_timeout_.load() * 2 + std::chrono::seconds(1));
    auto first = c10::make_intrusive<WorkTutti>(rank_, c10d::OpType::ALLREDUCE,
                                                "allreduce (sparse: sizes)",
                                                std::vector<at::Tensor>{}, op_timeout_.load(),
                                                &completer_);
    first->buffers = { meta, all };
    uint64_t seq;
    {
        std::lock_guard<std::mutex> g(issue_mu_);
        TORCH_CHECK(!coalescing_, "tutti backend: allreduce of a sparse tensor in a coalesced "
                                  "batch is not supported");
        if (!sparse_comm_) {
            int st = tutti_comm_split(comm_, 0, rank_, &sparse_comm_);
            if (st != TUTTI_OK)
                fail("allreduce (sparse: set-up)", st);
        }
        int st = tutti_allgather_async(comm_, meta.data_ptr(), all.data_ptr(), kSparseMeta,
                                       TUTTI_INT64, &first->handle);
        if (st != TUTTI_OK)
            fail("allreduce (sparse: sizes)", st);
        seq = sparse_issued_++;
        WorkTutti *ref = c10::intrusive_ptr<WorkTutti>(first).release();
        st = tutti_work_on_done(first->handle, WorkTutti::on_done, ref);
        if (st != TUTTI_OK) {
            c10::intrusive_ptr<WorkTutti>::reclaim(ref);
            first->complete(st); /* its error then ends the call, below */
        }
    }
    first->getFuture()->addCallback([this, seq, all, in, packed, t, user](c10::ivalue::Future &f) {
        SparseIssue issue;
        std::exception_ptr err = f.hasError() ? f.exception_ptr() : nullptr;
        /* a first stage that failed may have failed on this rank alone (its own deadline):
         * then its peers go on to the second stage. An error of sparse_stage2's is every
         * rank's (each judges the same gathered rows). */
        const bool alone = err != nullptr;
        if (!err) {
            try {
                issue = sparse_stage2(all, in, packed, t, user);
            } catch (...) {
                err = std::current_exception();
            }
        }
        if (err)
            issue = [this, user, err, alone]() -> std::function<void()> {
                if (alone)
                    sparse_skipped();
                return [user, err] { user->done(err); };
            };
        sparse_ready(seq, std::move(issue));
    });
    return user;
}

/* Issues the second stages that are ready, in the sparse calls' order; then, unlocked,
 * what each left to do (complete its work, whose callbacks may call into this group). */
void ProcessGroupTutti::sparse_ready(uint64_t seq, SparseIssue issue)
{
    std::vector<std::function<void()>> after;
    {
        std::lock_guard<std::mutex> g(sparse_mu_);
        sparse_waiting_.emplace(seq, std::move(issue));
        for (auto it = sparse_waiting_.begin();
             it != sparse_waiting_.end() && it->first == sparse_next_;
             it = sparse_waiting_.erase(it)) {
            after.push_back(it->second()); /* never throws */
            sparse_next_++;
        }
        sparse_cv_.notify_all();
    }
    for (auto &a : after)
        a(); /* never throws either (WorkSparse::done keeps callbacks' exceptions) */
}

/* Under sparse_mu_: this rank sends no second stage for a sparse call that its peers may
 * send theirs for. sparse_comm_ is revoked, so that they fail, naming this rank, instead
 * of waiting, or of pairing theirs with this rank's next one. */
void ProcessGroupTutti::sparse_skipped()
{
    if (sparse_comm_)
        tutti_comm_revoke(sparse_comm_);
}

/* From every rank's sizes (all): the second stage, which sends packed (this rank's
 * indices, then values, each 16-byte aligned) and receives every rank's, then sums them
 * into t. Ranks whose tensors differ in dtype, sizes or sparse dims are named, with the
 * same words on every rank (all compared with rank 0's), and no rank sends a second
 * stage. */
ProcessGroupTutti::SparseIssue ProcessGroupTutti::sparse_stage2(
    const at::Tensor &all, const at::Tensor &in, const at::Tensor &packed, at::Tensor t,
    c10::intrusive_ptr<WorkSparse> user)
{
    const int64_t *m = all.data_ptr<int64_t>();
    auto row = [&](int r) { return m + (size_t)r * kSparseMeta; };
    for (int r = 0; r < size_; r++) {
        const int64_t *a = row(r), *b = row(0);
        TORCH_CHECK(a[0] == kSparseMarker, "tutti backend: allreduce of a sparse tensor on rank ",
                    rank_, ": rank ", r, " gathered something else at this call");
        TORCH_CHECK(a[5] >= 0 && a[5] <= kSparseMaxDims && a[2] >= 0 && a[3] >= 0 &&
                        a[4] >= 0 && a[2] + a[3] == a[5] &&
                        std::all_of(a + 6, a + 6 + a[5], [](int64_t x) { return x >= 0; }),
                    "tutti backend: allreduce of a sparse tensor on rank ", rank_, ": rank ", r,
                    " sent malformed sizes");
        TORCH_CHECK(std::equal(a + 1, a + 4, b + 1) && a[5] == b[5] &&
                        std::equal(a + 6, a + 6 + a[5], b + 6),
                    "tutti backend: allreduce of a sparse tensor on rank ", rank_, ": rank ", r,
                    "'s tensor is ", sparse_desc(a), ", rank 0's ", sparse_desc(b),
                    " (they must agree in dtype, sizes and sparse dims)");
    }
    const int64_t sd = m[2], ndim = m[5];
    std::vector<int64_t> sizes(m + 6, m + 6 + ndim), dense(m + 6 + sd, m + 6 + ndim);
    const size_t es = in.element_size();
    /* byte counts from what the ranks sent, every sum and product checked: no count wraps,
     * and a rank's nnz is at most the number of places its sparse dims have (a coalesced
     * tensor's) */
    const size_t big = (size_t)INT64_MAX / 4;
    auto mul = [big](size_t x, size_t y) {
        size_t p;
        return __builtin_mul_overflow(x, y, &p) || p > big ? big + 1 : p;
    };
    size_t dn = 1, places = 1;
    for (int64_t d : dense)
        dn = mul(dn, (size_t)d);
    for (int64_t d = 0; d < sd; d++)
        places = mul(places, (size_t)sizes[d]); /* (more than big: no bound) */
    const size_t ie = mul((size_t)sd, sizeof(int64_t)), ve = mul(dn, es); /* bytes an element */
    std::vector<size_t> counts(size_);
    std::vector<int64_t> nnz(size_);
    size_t total = 0;
    for (int r = 0; r < size_; r++) {
        nnz[r] = row(r)[4];
        TORCH_CHECK(places > big || (size_t)nnz[r] <= places,
                    "tutti backend: allreduce of a sparse tensor on rank ", rank_, ": rank ", r,
                    " sent ", nnz[r], " elements for ", places, " places");
        counts[r] = pad16(pad16(mul((size_t)nnz[r], ie)) + mul((size_t)nnz[r], ve));
        total += counts[r];
        TORCH_CHECK(counts[r] <= big && total <= big, "tutti backend: allreduce of a sparse "
                    "tensor on rank ", rank_, ": the ranks' pieces up to rank ", r,
                    " add up to more bytes than fit");
    }
    auto vopts = in.options().layout(at::kStrided);
    /* every rank's pieces (in recv), summed by sparse_sum: the same on every rank */
    auto sum_into = [t, nnz, counts, sd, dense, sizes, dn, es,
                     vopts](const at::Tensor &recv) mutable {
        std::vector<at::Tensor> idx, val;
        int64_t off = 0;
        for (size_t r = 0; r < nnz.size(); off += (int64_t)counts[r++]) {
            /* views of rank r's bytes (indices and values 16-byte aligned) */
            int64_t n = nnz[r], ib = sd * n * (int64_t)sizeof(int64_t);
            int64_t vo = off + (int64_t)pad16((size_t)ib), vb = n * (int64_t)(dn * es);
            std::vector<int64_t> vs{ n };
            vs.insert(vs.end(), dense.begin(), dense.end());
            idx.push_back(recv.narrow(0, off, ib).view(at::kLong).view({ sd, n }));
            val.push_back(recv.narrow(0, vo, vb).view(vopts.dtype().toScalarType()).view(vs));
        }
        at::NoGradGuard no_grad;
        at::Tensor out = sparse_sum(idx, val, sizes, sd, vopts);
        /* below autograd, as gloo's: a tensor that requires grad takes it too */
        at::AutoDispatchBelowADInplaceOrView below;
        if (!t.is_cuda()) {
            t.copy_(out);
            return;
        }
        t.copy_(out.to(t.device()));
        /* done on the device before the work is: a wait() on any stream is then after it */
        c10::impl::VirtualGuardImpl(t.device().type()).getStream(t.device()).synchronize();
    };
    auto finish = [sum_into, user](std::exception_ptr err, const at::Tensor &recv) mutable {
        if (!err) {
            try {
                sum_into(recv);
            } catch (...) {
                err = std::current_exception();
            }
        }
        user->done(err);
    };
    /* run under sparse_mu_, in the sparse calls' order: the second stage issued; what is
     * left (the sum, the work's completion) returned, to run unlocked */
    return [this, packed, counts, total, finish, user]() mutable -> std::function<void()> {
        try {
            TORCH_CHECK(sparse_comm_, "tutti backend: allreduce of a sparse tensor on rank ",
                        rank_, ": the process group was destroyed before its second stage");
            if (total == 0) /* no rank has an element: nothing to move */
                return [finish]() mutable { finish(nullptr, at::empty({ 0 }, at::kByte)); };
            at::Tensor recv = at::empty({ (int64_t)total }, at::kByte);
            auto second = c10::make_intrusive<WorkTutti>(rank_, c10d::OpType::ALLREDUCE,
                                                         "allreduce (sparse: values)",
                                                         std::vector<at::Tensor>{}, op_timeout_.load(),
                                                         &completer_);
            second->buffers = { packed, recv };
            int st = tutti_allgatherv_async(sparse_comm_, packed.data_ptr(), recv.data_ptr(),
                                            counts.data(), nullptr, TUTTI_UINT8, &second->handle);
            TORCH_CHECK(st == TUTTI_OK, "tutti backend: allreduce of a sparse tensor on rank ",
                        rank_, ": ", tutti_status_name(st), ": ",
                        tutti_comm_last_error(sparse_comm_));
            WorkTutti *ref = c10::intrusive_ptr<WorkTutti>(second).release();
            st = tutti_work_on_done(second->handle, WorkTutti::on_done, ref);
            if (st != TUTTI_OK) {
                c10::intrusive_ptr<WorkTutti>::reclaim(ref);
                second->complete(st);
            }
            return [second, recv, finish]() mutable {
                second->getFuture()->addCallback([recv, finish](c10::ivalue::Future &f) mutable {
                    finish(f.hasError() ? f.exception_ptr() : nullptr, recv);
                });
            };
        } catch (...) {
            sparse_skipped(); /* this rank alone (memory, its communicator failed) */
            return [user, err = std::current_exception()] { user->done(err); };
        }
    };
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTutti::allreduce_coalesced(
    std::vector<at::Tensor> &tensors, const c10d::AllreduceCoalescedOptions &opts)
{
    CallTimeout own_timeout(opts.timeout); /* for its launch (gloo's per-call timeout) */
    TORCH_CHECK(!tensors.empty(), "tutti backend: allreduce_coalesced: no tensors");
    same_dtype(tensors, tensors[0], "allreduce_coalesced");
    reduction r = to_reduction(tensors[0], opts.reduceOp, "allreduce_coalesced");
    at::Tensor flat = premul(flatten(tensors), opts.reduceOp, "allreduce_coalesced");
    auto outs = tensors;
    return launch(
        c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", tensors, { flat },
        [flat, outs]() mutable { unflatten(flat, 0, outs); },
        [&](tutti_work_t **w) {
            return tutti_allreduce_async(comm_, TUTTI_IN_PLACE, flat.data_ptr(), flat.numel(), r.dt,
                                         r.op, w);
        });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTutti::reduce(std::vector<at::Tensor> &tensors,
                                                         const c10d::ReduceOptions &opts)
{
    CallTimeout own_timeout(opts.timeout); /* for its launch (gloo's per-call timeout) */
    const at::Tensor &t = single(tensors, "reduce");
    check_root(opts.rootRank, size_, "reduce");
    reduction r = to_reduction(t, opts.reduceOp, "reduce");
    at::Tensor buf = premul(contig(t), opts.reduceOp, "reduce");
    int root = (int)opts.rootRank;
    /* a non-root's tensor is only read */
    return launch(c10d::OpType::REDUCE, "reduce", tensors, { buf },
                  rank_ == root ? copy_back(t, buf) : nullptr,
                  [&](tutti_work_t **w) {
                      return tutti_reduce_async(comm_,
                                                rank_ == root ? TUTTI_IN_PLACE : buf.data_ptr(),
                                                rank_ == root ? buf.data_ptr() : nullptr,
                                                buf.numel(), r.dt, r.op, root, w);
                  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTutti::allgather(
    std::vector<std::vector<at::Tensor>> &outputs, std::vector<at::Tensor> &inputs,
    const c10d::AllgatherOptions &opts)
{
    CallTimeout own_timeout(opts.timeout); /* for its launch (gloo's per-call timeout) */
    if (inputs.size() > 1) { /* gloo's list: every output list gets every rank's inputs,
                                rank r's input j at r * inputs + j */
        same_shape_list(inputs, "allgather");
        const size_t k = inputs.size();
        TORCH_CHECK(outputs.size() == k, "tutti backend: allgather: ", k,
                    " inputs take as many output lists, got ", outputs.size());
        for (size_t i = 0; i < k; i++) {
            TORCH_CHECK(outputs[i].size() == k * (size_t)size_, "tutti backend: allgather: output list ",
                        i, " has ", outputs[i].size(), " tensors, needs ", k * size_,
                        " (inputs x ranks)");
            same_dtype(outputs[i], inputs[0], "allgather");
            for (size_t j = 0; j < outputs[i].size(); j++)
                TORCH_CHECK(outputs[i][j].numel() == inputs[0].numel(), "tutti backend: allgather: ",
                            "output list ", i, "'s tensor ", j, " has ", outputs[i][j].numel(),
                            " elements, the inputs ", inputs[0].numel());
        }
        at::Tensor in = flatten(inputs);
        carrier c = carry(in);
        at::Tensor flat = host_empty(size_ * in.numel(), in, false);
        std::vector<std::vector<at::Tensor>> outs = outputs;
        return launch(
            c10d::OpType::ALLGATHER, "allgather", outputs[0], { in, flat },
            [flat, outs]() mutable {
                for (auto &list : outs)
                    unflatten(flat, 0, list);
            },
            [&](tutti_work_t **w) {
                return tutti_allgather_async(comm_, in.data_ptr(), flat.data_ptr(),
                                             c.n(in.numel()), c.dt, w);
            },
            outputs);
    }
    at::Tensor in = contig(single(inputs, "allgather"));
    std::vector<size_t> counts = uneven_counts(outputs, in, size_, rank_, "allgather");
    auto outs = outputs[0];
    carrier c = carry(in);
    for (auto &n : counts)
        n = c.n((int64_t)n);
    int64_t n = counts.empty() ? size_ * in.numel() : (int64_t)(total(counts) / c.k);
    at::Tensor flat = host_empty(n, in, any_cuda(outs));
    return launch(
        c10d::OpType::ALLGATHER, "allgather", outputs[0], { in, flat },
        [flat, outs]() mutable { unflatten(flat, 0, outs); },
        [&](tutti_work_t **w) {
            if (!counts.empty()) /* uneven: the ranks' blocks back to back */
                return tutti_allgatherv_async(comm_, in.data_ptr(), flat.data_ptr(),
                                              counts.data(), nullptr, c.dt, w);
            return tutti_allgather_async(comm_, in.data_ptr(), flat.data_ptr(), c.n(in.numel()),
                                         c.dt, w);
        });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTutti::_allgather_base(at::Tensor &output,
                                                                  at::Tensor &input,
                                                                  const c10d::AllgatherOptions &opts)
{
    CallTimeout own_timeout(opts.timeout); /* for its launch (gloo's per-call timeout) */
    check_device(input, "_allgather_base");
    same_dtype({ output }, input, "_allgather_base");
    carrier c = carry(input);
    TORCH_CHECK(output.numel() == size_ * input.numel(),
                "tutti backend: _allgather_base: output of ", output.numel(), " elements, needs ",
                size_, " x ", input.numel());
    at::Tensor in = contig(input), out = out_buf(output);
    return launch(c10d::OpType::_ALLGATHER_BASE, "_allgather_base", { output }, { in, out },
                  copy_back(output, out), [&](tutti_work_t **w) {
                      return tutti_allgather_async(comm_, in.data_ptr(), out.data_ptr(),
                                                   c.n(in.numel()), c.dt, w);
                  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTutti::allgather_coalesced(
    std::vector<std::vector<at::Tensor>> &outputs, std::vector<at::Tensor> &inputs,
    const c10d::AllgatherOptions &opts)
{
    CallTimeout own_timeout(opts.timeout); /* for its launch (gloo's per-call timeout) */
    TORCH_CHECK(!inputs.empty(), "tutti backend: allgather_coalesced: no tensors");
    same_dtype(inputs, inputs[0], "allgather_coalesced");
    carrier c = carry(inputs[0]);
    TORCH_CHECK((int)outputs.size() == size_, "tutti backend: allgather_coalesced: needs ", size_,
                " output lists, got ", outputs.size());
    std::vector<at::Tensor> outs;
    for (const auto &list : outputs) {
        TORCH_CHECK(list.size() == inputs.size(),
                    "tutti backend: allgather_coalesced: an output "
                    "list of ",
                    list.size(), " tensors for ", inputs.size(), " inputs");
        same_dtype(list, inputs[0], "allgather_coalesced");
        for (size_t j = 0; j < list.size(); j++)
            TORCH_CHECK(list[j].numel() == inputs[j].numel(),
                        "tutti backend: allgather_coalesced: output tensor ", j, " has ",
                        list[j].numel(), " elements, input ", j, " has ", inputs[j].numel(),
                        " (they must match)");
        outs.insert(outs.end(), list.begin(), list.end());
    }
    at::Tensor in = flatten(inputs);
    at::Tensor flat = host_empty(size_ * in.numel(), in, any_cuda(outs));
    /* the future's value: a list per rank, as gloo's (one rank: the flat list, as
     * gloo's too) */
    std::vector<std::vector<at::Tensor>> nested;
    if (size_ > 1)
        nested = outputs;
    return launch(
        c10d::OpType::ALLGATHER_COALESCED, "allgather_coalesced", outs, { in, flat },
        [flat, outs]() mutable { unflatten(flat, 0, outs); },
        [&](tutti_work_t **w) {
            return tutti_allgather_async(comm_, in.data_ptr(), flat.data_ptr(), c.n(in.numel()),
                                         c.dt, w);
        },
        std::move(nested));
}

/* torch 2.x's batches of all_gather_into_tensor (what dist._coalescing_manager issues,
 * and gloo and NCCL take): output i is every rank's input i, rank by rank. One tutti
 * allgather of the inputs back to back; output i's rows are then columns of the result. */
c10::intrusive_ptr<c10d::Work> ProcessGroupTutti::allgather_into_tensor_coalesced(
    std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
    const c10d::AllgatherOptions &opts)
{
    CallTimeout own_timeout(opts.timeout); /* for its launch (gloo's per-call timeout) */
    const char *name = "allgather_into_tensor_coalesced";
    pairs_of_one_dtype(outputs, inputs, name);
    if (inputs.size() == 1) /* torch 2.x's functional all_gather_into_tensor: no rearranging */
        return _allgather_base(outputs[0], inputs[0], opts);
    for (size_t i = 0; i < inputs.size(); i++)
        TORCH_CHECK(outputs[i].numel() == size_ * inputs[i].numel(), "tutti backend: ", name,
                    ": output ", i, " of ", outputs[i].numel(), " elements, needs ", size_, " x ",
                    inputs[i].numel());
    carrier c = carry(inputs[0]);
    at::Tensor in = flatten(inputs);
    at::Tensor flat = host_empty(size_ * in.numel(), in, any_cuda(outputs));
    auto outs = outputs;
    int size = size_;
    return launch(
        c10d::OpType::ALLGATHER_COALESCED, name, outputs, { in, flat },
        [flat, outs, size]() mutable {
            at::Tensor rows = flat.view({ size, -1 });
            int64_t off = 0;
            for (auto &t : outs) {
                int64_t len = t.numel() / size;
                write_into(t, rows.narrow(1, off, len).reshape(t.sizes()));
                off += len;
            }
        },
        [&](tutti_work_t **w) {
            return tutti_allgather_async(comm_, in.data_ptr(), flat.data_ptr(), c.n(in.numel()),
                                         c.dt, w);
        });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTutti::gather(
    std::vector<std::vector<at::Tensor>> &outputs, std::vector<at::Tensor> &inputs,
    const c10d::GatherOptions &opts)
{
    CallTimeout own_timeout(opts.timeout); /* for its launch (gloo's per-call timeout) */
    at::Tensor in = contig(single(inputs, "gather"));
    check_root(opts.rootRank, size_, "gather");
    carrier c = carry(in);
    int root = (int)opts.rootRank;
    at::Tensor flat;
    std::vector<at::Tensor> outs;
    if (rank_ == root) {
        outs = rank_list(outputs, in, size_, "gather");
        flat = host_empty(size_ * in.numel(), in, any_cuda(outs));
    } else {
        check_no_list(outputs, "gather");
    }
    std::function<void()> fin;
    if (rank_ == root)
        fin = [flat, outs]() mutable { unflatten(flat, 0, outs); };
    return launch(c10d::OpType::GATHER, "gather", outs, { in, flat }, fin, [&](tutti_work_t **w) {
        return tutti_gather_async(comm_, in.data_ptr(), flat.defined() ? flat.data_ptr() : nullptr,
                                  c.n(in.numel()), c.dt, root, w);
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTutti::scatter(
    std::vector<at::Tensor> &outputs, std::vector<std::vector<at::Tensor>> &inputs,
    const c10d::ScatterOptions &opts)
{
    CallTimeout own_timeout(opts.timeout); /* for its launch (gloo's per-call timeout) */
    const at::Tensor &o = single(outputs, "scatter");
    check_root(opts.rootRank, size_, "scatter");
    carrier c = carry(o);
    int root = (int)opts.rootRank;
    at::Tensor flat;
    if (rank_ == root)
        flat = flatten(rank_list(inputs, o, size_, "scatter"));
    else
        check_no_list(inputs, "scatter");
    at::Tensor out = out_buf(o);
    return launch(c10d::OpType::SCATTER, "scatter", outputs, { flat, out }, copy_back(o, out),
                  [&](tutti_work_t **w) {
                      return tutti_scatter_async(comm_, flat.defined() ? flat.data_ptr() : nullptr,
                                                 out.data_ptr(), c.n(out.numel()), c.dt, root,
                                                 w);
                  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTutti::reduce_scatter(
    std::vector<at::Tensor> &outputs, std::vector<std::vector<at::Tensor>> &inputs,
    const c10d::ReduceScatterOptions &opts)
{
    CallTimeout own_timeout(opts.timeout); /* for its launch (gloo's per-call timeout) */
    const at::Tensor &o = single(outputs, "reduce_scatter");
    reduction r = to_reduction(o, opts.reduceOp, "reduce_scatter");
    std::vector<size_t> counts = uneven_counts(inputs, o, size_, rank_, "reduce_scatter");
    at::Tensor flat = premul(flatten(inputs[0]), opts.reduceOp, "reduce_scatter"),
               out = out_buf(o);
    return launch(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", outputs, { flat, out },
                  copy_back(o, out), [&](tutti_work_t **w) {
                      if (!counts.empty()) /* uneven: rank i's block is input i's */
                          return tutti_reduce_scatterv_async(comm_, flat.data_ptr(),
                                                             out.data_ptr(), counts.data(), r.dt,
                                                             r.op, w);
                      return tutti_reduce_scatter_async(comm_, flat.data_ptr(), out.data_ptr(),
                                                        out.numel(), r.dt, r.op, w);
                  });
}

/* torch 2.x's batches of reduce_scatter_tensor: output i is this rank's block of the
 * reduction of input i (size blocks of output i's length). One tutti reduce_scatter of
 * the inputs rearranged rank by rank: rank r's block is every input's block r. */
c10::intrusive_ptr<c10d::Work> ProcessGroupTutti::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
    const c10d::ReduceScatterOptions &opts)
{
    CallTimeout own_timeout(opts.timeout); /* for its launch (gloo's per-call timeout) */
    const char *name = "reduce_scatter_tensor_coalesced";
    pairs_of_one_dtype(outputs, inputs, name);
    if (inputs.size() == 1)
        return _reduce_scatter_base(outputs[0], inputs[0], opts);
    reduction r = to_reduction(inputs[0], opts.reduceOp, name);
    std::vector<at::Tensor> cols;
    for (size_t i = 0; i < inputs.size(); i++) {
        TORCH_CHECK(inputs[i].numel() == size_ * outputs[i].numel(), "tutti backend: ", name,
                    ": input ", i, " of ", inputs[i].numel(), " elements, needs ", size_, " x ",
                    outputs[i].numel());
        cols.push_back(contig(inputs[i]).view({ size_, -1 }));
    }
    at::Tensor in = premul(at::cat(cols, 1).reshape({ -1 }), opts.reduceOp, name);
    at::Tensor out = host_empty(in.numel() / size_, in, any_cuda(outputs));
    auto outs = outputs;
    return launch(
        c10d::OpType::_REDUCE_SCATTER_BASE, name, outputs, { in, out },
        [out, outs]() mutable { unflatten(out, 0, outs); },
        [&](tutti_work_t **w) {
            return tutti_reduce_scatter_async(comm_, in.data_ptr(), out.data_ptr(), out.numel(),
                                              r.dt, r.op, w);
        });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTutti::_reduce_scatter_base(
    at::Tensor &output, at::Tensor &input, const c10d::ReduceScatterOptions &opts)
{
    CallTimeout own_timeout(opts.timeout); /* for its launch (gloo's per-call timeout) */
    check_device(input, "_reduce_scatter_base");
    same_dtype({ output }, input, "_reduce_scatter_base");
    reduction r = to_reduction(input, opts.reduceOp, "_reduce_scatter_base");
    TORCH_CHECK(input.numel() == size_ * output.numel(),
                "tutti backend: _reduce_scatter_base: "
                "input of ",
                input.numel(), " elements, needs ", size_, " x ", output.numel());
    at::Tensor in = premul(contig(input), opts.reduceOp, "_reduce_scatter_base"),
               out = out_buf(output);
    return launch(c10d::OpType::_REDUCE_SCATTER_BASE, "_reduce_scatter_base", { output },
                  { in, out }, copy_back(output, out), [&](tutti_work_t **w) {
                      return tutti_reduce_scatter_async(comm_, in.data_ptr(), out.data_ptr(),
                                                        out.numel(), r.dt, r.op, w);
                  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTutti::alltoall_base(at::Tensor &output,
                                                                at::Tensor &input,
                                                                std::vector<int64_t> &outputSplits,
                                                                std::vector<int64_t> &inputSplits,
                                                                const c10d::AllToAllOptions &opts)
{
    CallTimeout own_timeout(opts.timeout); /* for its launch (gloo's per-call timeout) */
    check_device(input, "alltoall_base");
    same_dtype({ output }, input, "alltoall_base");
    carrier c = carry(input);
    std::vector<size_t> sc = split_counts(input, inputSplits, size_, "input");
    std::vector<size_t> rc = split_counts(output, outputSplits, size_, "output");
    TORCH_CHECK(total(sc) == (size_t)input.numel() && total(rc) == (size_t)output.numel(),
                "tutti backend: alltoall_base: split sizes do not cover the tensors");
    for (int i = 0; i < size_; i++) {
        sc[i] *= c.k;
        rc[i] *= c.k;
    }
    at::Tensor in = contig(input), out = out_buf(output);
    return launch(c10d::OpType::ALLTOALL_BASE, "alltoall_base", { output }, { in, out },
                  copy_back(output, out), [&](tutti_work_t **w) {
                      return tutti_alltoallv_async(comm_, in.data_ptr(), sc.data(), nullptr,
                                                   out.data_ptr(), rc.data(), nullptr, c.dt, w);
                  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTutti::alltoall(std::vector<at::Tensor> &outputs,
                                                           std::vector<at::Tensor> &inputs,
                                                           const c10d::AllToAllOptions &opts)
{
    CallTimeout own_timeout(opts.timeout); /* for its launch (gloo's per-call timeout) */
    TORCH_CHECK((int)inputs.size() == size_ && (int)outputs.size() == size_,
                "tutti backend: alltoall: needs ", size_, " input and output tensors");
    same_dtype(inputs, inputs[0], "alltoall");
    same_dtype(outputs, inputs[0], "alltoall");
    carrier c = carry(inputs[0]);
    std::vector<size_t> sc, rc;
    for (int i = 0; i < size_; i++) {
        sc.push_back(c.n(inputs[i].numel()));
        rc.push_back(c.n(outputs[i].numel()));
    }
    at::Tensor in = flatten(inputs);
    at::Tensor flat = host_empty((int64_t)(total(rc) / c.k), in, any_cuda(outputs));
    auto outs = outputs;
    return launch(
        c10d::OpType::ALLTOALL, "alltoall", outputs, { in, flat },
        [flat, outs]() mutable { unflatten(flat, 0, outs); },
        [&](tutti_work_t **w) {
            return tutti_alltoallv_async(comm_, in.data_ptr(), sc.data(), nullptr, flat.data_ptr(),
                                         rc.data(), nullptr, c.dt, w);
        });
}

/* gloo's checkTag: a negative tag is refused (cast to tutti's uint32 tags, -1 would be
 * TUTTI_ANY_TAG: a send refused by tutti, a receive of any tag) */
static void check_tag(int tag, const char *name)
{
    TORCH_CHECK(tag >= 0, "tutti backend: ", name, ": tag must be nonnegative (got ", tag, ")");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTutti::send(std::vector<at::Tensor> &tensors, int dst,
                                                       int tag)
{
    at::Tensor buf = contig(single(tensors, "send"));
    check_root(dst, size_, "send", "destination rank");
    check_tag(tag, "send");
    carrier c = carry(buf);
    return launch(c10d::OpType::SEND, "send", tensors, { buf }, nullptr, [&](tutti_work_t **w) {
        return tutti_send_async(comm_, buf.data_ptr(), c.n(buf.numel()), c.dt, dst,
                                (uint32_t)tag, w);
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTutti::recv(std::vector<at::Tensor> &tensors, int src,
                                                       int tag)
{
    check_root(src, size_, "recv", "source rank");
    return receive(c10d::OpType::RECV, "recv", tensors, src, tag);
}

/* The sender: Work::sourceRank(), from tutti_work_source. */
c10::intrusive_ptr<c10d::Work> ProcessGroupTutti::recvAnysource(std::vector<at::Tensor> &tensors,
                                                                int tag)
{
    return receive(c10d::OpType::RECVANYSOURCE, "recvAnysource", tensors, TUTTI_ANY_SOURCE, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTutti::receive(c10d::OpType type, const char *name,
                                                          std::vector<at::Tensor> &tensors, int src,
                                                          int tag)
{
    /* gloo's receive takes any message that fits the tensor's bytes (a shorter one, one
     * of another dtype), leaving the rest as it was: tutti_recv_upto of u8, into a buffer
     * that holds the tensor's elements (a staged or non-contiguous tensor's copy) */
    check_tag(tag, name);
    const at::Tensor &t = single(tensors, name);
    at::Tensor buf = contig(t);
    const size_t nbytes = (size_t)buf.numel() * buf.element_size();
    return launch(type, name, tensors, { buf }, copy_back(t, buf), [&](tutti_work_t **w) {
        return tutti_recv_upto_async(comm_, buf.data_ptr(), nbytes, TUTTI_UINT8, src,
                                     (uint32_t)tag, w);
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTutti::barrier(const c10d::BarrierOptions &opts)
{
    CallTimeout own_timeout(opts.timeout); /* for its launch (gloo's per-call timeout) */
    return launch(c10d::OpType::BARRIER, "barrier", {}, {}, nullptr,
                  [&](tutti_work_t **w) { return tutti_barrier_async(comm_, w); });
}

/* Gloo's protocol: every rank reports to rank 0, which names the ranks that did not
 * within the timeout (the first, or all of them with waitAllRanks), then releases them.
 * A failed monitored barrier aborts the communicator: the receive it left posted cannot
 * be taken back, so the group is unusable afterwards (as with gloo). */
void ProcessGroupTutti::monitoredBarrier(const c10d::BarrierOptions &opts, bool waitAllRanks)
{
    check_owner("monitoredBarrier");
    auto timeout = opts.timeout == c10d::kUnsetTimeout ? timeout_.load() : opts.timeout;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    auto left = [&] {
        auto d = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        return std::max(d, std::chrono::milliseconds(1));
    };
    std::vector<at::Tensor> token = { at::zeros({ 1 }, at::kInt) };
    if (rank_ != 0) {
        try {
            send(token, 0, kMonitorTag)->wait(left());
            recv(token, 0, kMonitorTag)->wait(left());
        } catch (const std::exception &e) {
            tutti_comm_abort(comm_);
            TORCH_CHECK(false, "tutti backend: rank ", rank_,
                        ": monitoredBarrier: rank 0 did "
                        "not release this rank within ",
                        timeout.count(), " ms: ", no_backtrace(e));
        }
        return;
    }
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (int r = 1; r < size_; r++) {
        std::vector<at::Tensor> t = { at::zeros({ 1 }, at::kInt) };
        works.push_back(recv(t, r, kMonitorTag));
    }
    std::vector<int> failed;
    std::string cause;
    for (int r = 1; r < size_ && (failed.empty() || waitAllRanks); r++) {
        try {
            works[r - 1]->wait(left());
        } catch (const std::exception &e) {
            failed.push_back(r);
            if (cause.empty())
                cause = no_backtrace(e);
        }
    }
    if (!failed.empty()) {
        tutti_comm_abort(comm_);
        std::string ranks;
        for (int r : failed)
            ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
        TORCH_CHECK(false, failed.size() == 1 ? "Rank " : "Ranks ", ranks,
                    " failed to pass monitoredBarrier in ", timeout.count(),
                    " ms (tutti backend; first cause: ", cause, ")");
    }
    for (int r = 1; r < size_; r++)
        works[r - 1] = send(token, r, kMonitorTag);
    for (auto &w : works)
        w->wait(left());
}

} // namespace tutti_torch
