//===- Runtime.h - the CUDA runtime of tdx model binaries ---------*- C++ -*-===//
//
// What the CUDA source that `tdx-translate --tdx-to-cuda` emits calls into.
// It mirrors the subset of ATen the CPU backend's source calls (the one
// emitter writes both; `namespace T` is `at` there and `tdx::cu` here):
// tensors in device memory with strided views, cuBLAS for matmul and linear,
// the row kernels of tdx/Runtime/Rows.h for softmax, norms, reductions,
// embedding and cross-entropy, emitted elementwise kernels, NCCL collectives
// over mesh-axis sub-groups (bootstrapped through MPI), sharded init with
// the same Philox generator as the CPU, and the same command line (runMain).
//
// No ATen: this header includes the CUDA runtime API and tdx's runtime
// headers only.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_RUNTIME_CUDA_RUNTIME_H
#define TDX_RUNTIME_CUDA_RUNTIME_H

#include "tdx/Runtime/InitProgram.h"
#include "tdx/Runtime/Mesh.h"
#include "tdx/Runtime/Program.h"
#include "tdx/Runtime/Rows.h"

#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace tdx::cu {

using rt::DType;
using rt::Layout;
using rt::parseLayout;
// ATen's dtype names, for the emitted source (tdx/StateFormat/DTypes.def).
#define TDX_DTYPE(Name, stored, bytes, aten, ctype, mlir, ir, runs) constexpr DType aten = DType::Name;
#include "tdx/StateFormat/DTypes.def"

/// A strided view of device memory. Default-constructed: undefined (the
/// `{}` of an optional argument).
class Tensor {
public:
  Tensor() = default;
  bool defined() const { return data_ != nullptr || storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t> &sizes() const { return shape_; }
  const std::vector<int64_t> &strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const { return shape_.at(wrap(d)); }
  int64_t numel() const;
  int64_t nbytes() const { return numel() * rt::dtypeSize(dtype_); }
  bool isContiguous() const;
  void *data() const { return data_; }

  static Tensor empty(const std::vector<int64_t> &shape, DType dtype);
  // Views (no copy) and copies, as ATen's methods of the same names.
  Tensor reshape(const std::vector<int64_t> &shape) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor permute(const std::vector<int64_t> &perm) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step) const;
  Tensor expand(const std::vector<int64_t> &sizes) const;
  Tensor contiguous() const;
  /// The host value of a one-element integer tensor.
  template <class I> I item() const;
  int64_t wrap(int64_t d) const { return d < 0 ? d + dim() : d; }

private:
  std::shared_ptr<void> storage_;
  void *data_ = nullptr;
  DType dtype_ = DType::F32;
  std::vector<int64_t> shape_, strides_;
};
template <> int64_t Tensor::item<int64_t>() const;

// Creation.
Tensor full(const std::vector<int64_t> &shape, double value, DType dtype);
Tensor zeros(const std::vector<int64_t> &shape, DType dtype);
Tensor arange(double start, double end, double step, DType dtype);
Tensor scalar_tensor(double value, DType dtype);
/// A dense tensor from host values (converted to `dtype`).
Tensor constant(const std::vector<double> &values, const std::vector<int64_t> &shape,
                DType dtype);

// Compute, with ATen's semantics.
/// torch.cat (tdx.concat).
Tensor concat(const std::vector<Tensor> &xs, int64_t dim);
Tensor matmul(const Tensor &a, const Tensor &b);
Tensor linear(const Tensor &x, const Tensor &w, const Tensor &bias = {});
Tensor sum(const Tensor &x);
Tensor sum(const Tensor &x, const std::vector<int64_t> &dims, bool keepdim);
Tensor mean(const Tensor &x);
Tensor mean(const Tensor &x, const std::vector<int64_t> &dims, bool keepdim);
Tensor amax(const Tensor &x);
Tensor amax(const Tensor &x, const std::vector<int64_t> &dims, bool keepdim);
Tensor softmax(const Tensor &x, int64_t dim);
Tensor log_softmax(const Tensor &x, int64_t dim);
Tensor layer_norm(const Tensor &x, const std::vector<int64_t> &normalizedShape, const Tensor &w,
                  const Tensor &b, double eps);
Tensor rms_norm(const Tensor &x, const std::vector<int64_t> &normalizedShape, const Tensor &w,
                double eps);
Tensor embedding(const Tensor &weight, const Tensor &ids);
/// Fused attention (tdx.sdpa): (output, log-sum-exp of each query row).
std::tuple<Tensor, Tensor> sdpa(const Tensor &q, const Tensor &k, const Tensor &v,
                                const Tensor &mask, bool causal, std::optional<double> scale);
/// Its backward (tdx.sdpa_backward): (dq, dk, dv) from the output's gradient,
/// the inputs, and the forward's output and log-sum-exp.
std::tuple<Tensor, Tensor, Tensor> sdpa_backward(const Tensor &grad, const Tensor &q,
                                                 const Tensor &k, const Tensor &v,
                                                 const Tensor &out, const Tensor &lse,
                                                 const Tensor &mask, bool causal,
                                                 std::optional<double> scale);
/// at::convolution (not transposed; 1-D or 2-D): im2col (tdx/Runtime/Conv.h)
/// and one strided-batched cuBLAS gemm over the groups per batch element.
Tensor convolution(const Tensor &x, const Tensor &w, const Tensor &bias,
                   const std::vector<int64_t> &stride, const std::vector<int64_t> &padding,
                   const std::vector<int64_t> &dilation, bool transposed,
                   const std::vector<int64_t> &outputPadding, int64_t groups);
Tensor max_pool2d(const Tensor &x, const std::vector<int64_t> &kernel,
                  const std::vector<int64_t> &stride, const std::vector<int64_t> &padding,
                  const std::vector<int64_t> &dilation, bool ceilMode);
Tensor avg_pool2d(const Tensor &x, const std::vector<int64_t> &kernel,
                  const std::vector<int64_t> &stride, const std::vector<int64_t> &padding,
                  bool ceilMode, bool countIncludePad);
/// reduction: 0 none, 1 mean, 2 sum (at::Reduction); `weight` must be undefined.
Tensor cross_entropy_loss(const Tensor &logits, const Tensor &target, const Tensor &weight,
                          int64_t reduction, int64_t ignoreIndex, double smoothing);

/// Copies `src` into the same-shaped view `dst` (a slice, a transpose).
void copyInto(const Tensor &dst, const Tensor &src);

/// A non-tensor argument of a generic aten op, as the emitter spells it
/// (`Arg()` is None).
struct Arg {
  enum Kind { None, Bool, Int, Double, Ints, Bools, String } kind = None;
  bool b = false;
  int64_t i = 0;
  double d = 0;
  std::vector<int64_t> ints;
  std::vector<bool> bools;
  std::string s;
  Arg() = default;
  Arg(bool v) : kind(Bool), b(v) {}
  Arg(int64_t v) : kind(Int), i(v) {}
  Arg(double v) : kind(Double), d(v) {}
  Arg(std::vector<int64_t> v) : kind(Ints), ints(std::move(v)) {}
  Arg(std::vector<bool> v) : kind(Bools), bools(std::move(v)) {}
  Arg(std::string v) : kind(String), s(std::move(v)) {}
};
using Args = std::map<std::string, Arg>;

/// Runs the generic aten op `schema` (a row of tdx/Runtime/cuda/AtenOps.def)
/// on its tensor operands in schema order and its other arguments by name;
/// its results in order (an output nothing reads may be undefined).
std::vector<Tensor> callAten(const std::string &schema, const std::vector<Tensor> &tensors,
                             const Args &args);
namespace aten {
#define TDX_CUDA_ATEN(schema, fn)                                                              \
  std::vector<Tensor> fn(const std::vector<Tensor> &tensors, const Args &args);
#include "tdx/Runtime/cuda/AtenOps.def"
} // namespace aten

/// Launches an emitted elementwise kernel over `it` (one thread per element).
using KernelLaunch = void (*)(const tdx::kern::Iter &it, cudaStream_t stream);
/// Runs it over `shape` (-1: the inputs' broadcast size there): inputs
/// broadcast, outputs new and dense.
std::vector<Tensor> elementwise(std::vector<int64_t> shape, const std::vector<Tensor> &inputs,
                                const std::vector<DType> &outputTypes, KernelLaunch launch);
/// Blocks per grid for one thread per element (256 per block).
unsigned blocksFor(int64_t n);
/// Throws "tdx: <what> failed: <CUDA's message>" unless `e` is cudaSuccess.
void checkCuda(cudaError_t e, const std::string &what);
/// Throws naming `what` if the last launch failed.
void checkLaunch(const char *what);

/// A rank of a model binary on its GPU (rank modulo the visible devices).
class Context : public rt::Mesh {
public:
  Context(std::vector<int64_t> meshShape, std::vector<std::string> axes, uint64_t seed,
          bool verbose);
  ~Context();

  uint64_t seed() const { return seed_; }
  bool verbose() const { return verbose_; }

  // Collectives over the ranks that differ only on `axes`: NCCL, or MPI
  // through host memory where ranks share a GPU (NCCL refuses two ranks on
  // one device) or TDX_CUDA_COLLECTIVES=mpi asks for it.
  Tensor allReduce(const Tensor &x, const std::vector<std::string> &axes, int64_t reduce);
  Tensor allGather(const Tensor &x, const std::vector<std::string> &axes, int64_t dim);
  Tensor reduceScatter(const Tensor &x, const std::vector<std::string> &axes, int64_t reduce,
                       int64_t dim);
  /// Overlap (as the CPU runtime's): an all_reduce or reduce_scatter is
  /// enqueued on the communication stream where its input is ready; wait()
  /// orders the compute stream after it where its result is first used, so
  /// the kernels enqueued in between run beside it. NCCL moves it on its
  /// own: progress() has nothing to do.
  int64_t startAllReduce(const Tensor &x, const std::vector<std::string> &axes, int64_t reduce);
  int64_t startReduceScatter(const Tensor &x, const std::vector<std::string> &axes,
                             int64_t reduce, int64_t dim);
  /// The CPU runtime's call; on CUDA the gather completes where it starts.
  int64_t startAllGather(const Tensor &x, const std::vector<std::string> &axes, int64_t dim,
                         int64_t total);
  Tensor wait(int64_t handle);
  void progress() {}
  Tensor allToAll(const Tensor &x, const std::vector<std::string> &axes, int64_t split,
                  int64_t concat);
  static Tensor chunk(const Tensor &x, int64_t chunks, int64_t index, int64_t dim);
  /// tdx.broadcast and tdx.collective_permute, as the CPU runtime's.
  Tensor broadcast(const Tensor &x, const std::vector<std::string> &axes,
                   const std::vector<int64_t> &root);
  Tensor permute(const Tensor &x, const std::vector<std::string> &axes,
                 const std::vector<int64_t> &pairs);
  /// The CPU runtime's call; on CUDA the permutation completes where it
  /// starts, as an all_gather's does.
  int64_t startPermute(const Tensor &x, const std::vector<std::string> &axes,
                       const std::vector<int64_t> &pairs);
  /// tdx.send and tdx.recv (PointToPoint.cu) over the NCCL channel from
  /// one rank of `axes`' group to another (pipelineChannel): a send is
  /// enqueued on the channel's stream after the compute stream's work so
  /// far and never holds the compute stream; a recv is enqueued there and
  /// the compute stream waits for it on the device. A channel matches its
  /// messages in order (tdx-schedule-pipeline receives in send order).
  /// `sized`: the receiver's type leaves a dim open, so the byte count also
  /// goes by MPI. Where collectives go through host memory, so do these
  /// (rt::Mesh::sendBytes, the CPU runtime's code).
  void send(const Tensor &x, const std::vector<std::string> &axes, int64_t peer, int64_t tag,
            bool sized);
  Tensor recv(std::vector<int64_t> shape, DType dtype, const std::vector<std::string> &axes,
              int64_t peer, int64_t tag);
  /// Makes the channel from group rank `from` to `to` of `axes` (a
  /// two-rank NCCL communicator, its stream, and a first message so its
  /// connection is made here, not under a schedule). Every rank calls it
  /// for every channel the program uses, in one order; the two ranks of a
  /// channel make it, the others only the group.
  void pipelineChannel(const std::vector<std::string> &axes, int64_t from, int64_t to);
  /// Waits (with the collective deadline) for this rank's sends and
  /// receives, then for its MPI sends (rt::Mesh::finishSends).
  void finishSends();

  /// Sharded init: this rank's box of the global tensor `program` makes
  /// (seeds mixed with --seed). One random or constant F32 op runs on the
  /// device, one thread per local element; other programs are evaluated on
  /// the host for the box alone and copied.
  Tensor init(const rt::InitProgram &program, const Layout &layout) const;

  /// Waits for the device (or, given a cudaEvent_t, for that event) with the
  /// collective deadline; a NCCL error or the deadline aborts the
  /// communicators and throws.
  void synchronize(const char *what, const std::vector<std::string> &axes = {},
                   void *event = nullptr);

private:
  struct InFlight;
  std::vector<std::unique_ptr<InFlight>> inFlight_;
  /// A handle whose collective completed where it started (`out`).
  int64_t completedAtStart(Tensor out, const std::vector<std::string> &axes, const char *what);
  uint64_t seed_;
  bool verbose_;
  /// Collectives run on their own stream: it waits for the compute stream's
  /// work so far (event `ready_`), and the compute stream waits on the
  /// device for the collective (event `done_`), so communication can
  /// overlap compute that does not depend on it.
  void *commStream_ = nullptr, *ready_ = nullptr, *done_ = nullptr;
  /// The communication stream (a cudaStream_t), ordered after the compute
  /// stream's work so far.
  void *beginCollective();
  /// Orders the compute stream after the collective and waits for it with
  /// the deadline.
  void endCollective(const char *what, const std::vector<std::string> &axes);
  std::map<std::vector<std::string>, void *> nccl_; // axes -> ncclComm_t
  /// A pipeline channel (pipelineChannel): its ncclComm_t, cudaStream_t,
  /// and a cudaEvent_t for what runs there.
  struct Channel {
    void *comm = nullptr, *stream = nullptr, *event = nullptr;
  };
  std::map<std::tuple<std::vector<std::string>, int64_t, int64_t>, Channel> channels_;
  /// The channel from `from` to `to` (made by pipelineChannel).
  Channel &channel(const std::vector<std::string> &axes, int64_t from, int64_t to);
  /// Enqueues `op` (an NCCL call on the channel's communicator and stream,
  /// returning its ncclResult_t) after the compute stream's work so far,
  /// and waits until it is enqueued.
  void enqueue(Channel &c, const char *what, const std::vector<std::string> &axes,
               const std::function<int(void *, void *)> &op);
  /// Sends in flight on channels: kept until finishSends.
  std::vector<Tensor> inTransit_;
  /// Orders `stream` (a cudaStream_t) after the compute stream's work so far.
  void orderAfterCompute(void *stream);
  /// Waits (with the deadline) until an operation a nonblocking
  /// communicator answered with ncclInProgress is enqueued.
  void settle(void *comm, const char *what, const std::vector<std::string> &axes);
  /// Aborts every NCCL communicator (an error or the deadline): the
  /// ranks blocked in one return.
  void abortCommunicators();
  /// The NCCL communicator (made on first use) of `axes`' group `g`.
  void *comm(const std::vector<std::string> &axes, const Group &g);
  /// Collectives by MPI through host memory (Context.cu), decided
  /// once for all ranks when the context is made.
  bool staged_ = false;
  Tensor hostAllReduce(const Tensor &x, const Group &g, int64_t reduce,
                       const std::vector<std::string> &axes);
  /// `pieces[r]` goes to group rank r, `received[r]` (allocated) comes from it.
  void hostExchange(const std::vector<Tensor> &pieces, const std::vector<Tensor> &received,
                    const Group &g, const char *what, const std::vector<std::string> &axes);
  void hostSend(const Tensor &x, const std::vector<std::string> &axes, int64_t peer,
                int64_t tag);
  Tensor hostRecv(std::vector<int64_t> shape, DType dtype, const std::vector<std::string> &axes,
                  int64_t peer, int64_t tag);
};

using Program = rt::BasicProgram<Context, Tensor, DType>;
using State = Program::State;

/// The driver of a model binary (the CPU binary's command line). Returns
/// the process exit code.
int runMain(int argc, char **argv, const Program &program);

} // namespace tdx::cu

#endif // TDX_RUNTIME_CUDA_RUNTIME_H
