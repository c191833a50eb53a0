//===- Runtime.h - the CPU runtime of tdx model binaries ---------*- C++ -*-===//
//
// What the C++ that `tdx-translate --tdx-to-cpp` emits calls into: compute
// through ATen (numerics as in PyTorch eager), collectives over mesh-axis
// sub-groups on MPI, sharded init through the counter-based generator, and
// the driver (`runMain`) that gives every model binary the same command line:
//
//   mpirun -np N ./model --inputs in.safetensors --outputs out.safetensors
//                        [--params FILE|DIR] [--seed S] [--verbose]
//
// This header includes ATen and MPI; only emitted programs and the runtime
// include it.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_RUNTIME_RUNTIME_H
#define TDX_RUNTIME_RUNTIME_H

#include <ATen/ATen.h>

#define TDX_KERNEL_VECTORIZED
#include "tdx/Runtime/AtenDTypes.h"
#include "tdx/Runtime/FusedRows.h"
#include "tdx/Runtime/InitProgram.h"
#include "tdx/Runtime/Kernel.h"
#include "tdx/Runtime/Mesh.h"
#include "tdx/Runtime/Program.h"

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace tdx::rt {

/// A rank of a model binary: the mesh (tdx/Runtime/Mesh.h) plus collectives
/// and sharded init on ATen tensors.
class Context : public Mesh {
public:
  Context(std::vector<int64_t> meshShape, std::vector<std::string> axes, uint64_t seed,
          bool verbose);

  uint64_t seed() const { return seed_; }
  bool verbose() const { return verbose_; }

  ~Context();

  // Collectives over the ranks that differ only on `axes`.
  at::Tensor allReduce(const at::Tensor &x, const std::vector<std::string> &axes, int64_t reduce);

  /// Overlap: an all_reduce or reduce_scatter started where its input is
  /// ready (nonblocking MPI) and waited for where its result is first used;
  /// the emitted step calls progress() after every op while one is in
  /// flight, since MPI moves a nonblocking collective only inside MPI calls.
  /// start* returns the handle wait() takes once.
  int64_t startAllReduce(const at::Tensor &x, const std::vector<std::string> &axes,
                         int64_t reduce);
  int64_t startReduceScatter(const at::Tensor &x, const std::vector<std::string> &axes,
                             int64_t reduce, int64_t dim);
  at::Tensor wait(int64_t handle);
  void progress();
  at::Tensor allGather(const at::Tensor &x, const std::vector<std::string> &axes, int64_t dim);
  /// An all_gather started where it stands (a prefetched parameter's:
  /// tdx-prefetch-all-gathers); `total` is the gathered size of `dim`
  /// when the program knows it (each rank then holds its torch.chunk of
  /// it), -1 to exchange the sizes first.
  int64_t startAllGather(const at::Tensor &x, const std::vector<std::string> &axes, int64_t dim,
                         int64_t total);
  at::Tensor reduceScatter(const at::Tensor &x, const std::vector<std::string> &axes,
                           int64_t reduce, int64_t dim);
  at::Tensor allToAll(const at::Tensor &x, const std::vector<std::string> &axes, int64_t split,
                      int64_t concat);
  /// tdx.ragged_all_to_all: rows [inputOffsets[j], + sendSizes[j]) of `x`
  /// to group rank j; the recvSizes[i] rows from rank i at
  /// outputOffsets[i] of a zero `rows`-row result. Checks every range and
  /// that each size agrees with its sender's, naming `site`.
  at::Tensor raggedAllToAll(const at::Tensor &x, const at::Tensor &inputOffsets,
                            const at::Tensor &sendSizes, const at::Tensor &outputOffsets,
                            const at::Tensor &recvSizes, int64_t rows,
                            const std::vector<std::string> &axes, const std::string &site);
  /// ... started (the checks done, the rows in flight): wait() gives it.
  int64_t startRaggedAllToAll(const at::Tensor &x, const at::Tensor &inputOffsets,
                              const at::Tensor &sendSizes, const at::Tensor &outputOffsets,
                              const at::Tensor &recvSizes, int64_t rows,
                              const std::vector<std::string> &axes, const std::string &site);
  /// tdx.broadcast: every rank of the group gets the value of the rank at
  /// coordinates `root` (one per axis, in `axes`' order).
  at::Tensor broadcast(const at::Tensor &x, const std::vector<std::string> &axes,
                       const std::vector<int64_t> &root);
  /// tdx.collective_permute along one axis: `pairs` are (source, target)
  /// coordinates, flattened; a rank no pair targets gets zeros.
  at::Tensor permute(const at::Tensor &x, const std::vector<std::string> &axes,
                     const std::vector<int64_t> &pairs);
  /// The permutation started where it stands (its receive and send
  /// posted), waited for where its result is first read: the compute in
  /// between overlaps the transfer, as an Isend/Irecv's does.
  int64_t startPermute(const at::Tensor &x, const std::vector<std::string> &axes,
                       const std::vector<int64_t> &pairs);
  /// tdx.send and tdx.recv (Mesh::sendBytes): `shape` may have one -1 dim,
  /// which the message's size gives (an MPI message carries its size, so
  /// `sized`, which says the receiver leaves a dim open, changes nothing).
  void send(const at::Tensor &x, const std::vector<std::string> &axes, int64_t peer, int64_t tag,
            bool sized);
  at::Tensor recv(std::vector<int64_t> shape, at::ScalarType dtype,
                  const std::vector<std::string> &axes, int64_t peer, int64_t tag);
  /// This rank's torch.chunk piece of dim `dim` over `chunks` pieces.
  static at::Tensor chunk(const at::Tensor &x, int64_t chunks, int64_t index, int64_t dim);

  /// Sharded init: this rank's box of the global tensor `program` makes
  /// (its seeds mixed with --seed), filled in place: no global tensor, no
  /// workspace.
  at::Tensor init(const InitProgram &program, const Layout &layout) const;

  /// The global tensor on rank 0 (undefined elsewhere) from every rank's part.
  at::Tensor gather(const at::Tensor &local, const std::vector<int64_t> &globalShape,
                    const Layout &layout);

private:
  struct InFlight;
  std::unique_ptr<InFlight> inFlight(const char *what, const std::vector<std::string> &axes,
                                     int64_t reduce, void **comm);
  int64_t track(std::unique_ptr<InFlight> f);
  uint64_t seed_;
  bool verbose_;
  std::vector<std::unique_ptr<InFlight>> inFlight_;
};

/// Calls an ATen operator by schema name ("aten::triu", "aten::add.Tensor")
/// through the dispatcher: Tensor arguments from `tensors` in schema order,
/// the others from `args` by schema name (converted to the schema's type:
/// a device from its name, an int to a float, a list of optional tensors to
/// Tensor[]) or from the schema's defaults. Every failure, the operator's
/// own included, is a std::runtime_error naming the operator (and the
/// argument where one is at fault).
/// torch.cat (tdx.concat), into a new dense tensor. Where every piece is
/// one element thick along `dim` and nothing follows it (torch.stack along
/// the last dim, as rotary embeddings interleave), each piece is copied
/// into its strided slice of the result: at::cat copies those one element
/// at a time, 4x slower.
at::Tensor concat(const std::vector<at::Tensor> &xs, int64_t dim);

/// `shapes` are the results' shapes capture recorded (-1: a dim not known
/// until run time; {-2}: a result nothing reads, not checked); a defined
/// result of another shape, or one without storage, is an error naming the
/// op.
std::vector<at::Tensor> callAten(const std::string &schema, const std::vector<at::Tensor> &tensors,
                                 const std::vector<std::pair<std::string, c10::IValue>> &args,
                                 const std::vector<std::vector<int64_t>> &shapes = {});

/// --profile: where a step's time goes. Top-level ATen calls are timed
/// through ATen's RecordFunction, fused kernels and collectives by scopes;
/// what runs inside a timed call is not counted again.
struct Profile {
  /// Seconds: ATen calls, fused kernels, and collectives (the time the step
  /// spends starting, driving and waiting for them: what overlap does not
  /// hide; --no-overlap shows them whole).
  double aten = 0, kernels = 0, collectives = 0;
  std::map<std::string, double> byOp;             // top-level ATen op -> seconds
  static Profile &totals();
  static void enable();
  /// Prints where `steps` steps that took `seconds` went, and the top ATen
  /// calls.
  void print(double seconds, int64_t steps) const;
  /// Times its lifetime into `bucket` unless it is nested in a timed call.
  class Scope {
  public:
    explicit Scope(double Profile::*bucket);
    ~Scope();

  private:
    double Profile::*bucket_;
    int64_t start_ = -1;
  };
};

/// The step memory pool: ATen's CPU allocator in a model binary keeps freed
/// blocks for the next tensor of their size, so after the first step a
/// program's steps take every tensor from the pool (no allocation reaches
/// the C library). It counts the bytes of live tensors as ATen asks for them
/// (now, and the peak since resetPeak()), the blocks it got from the system
/// and their bytes (whole 64-byte lines).
struct TensorMemory {
  static void install();
  static int64_t current();
  static int64_t peak();
  static void resetPeak();
  static int64_t systemAllocations();
  static int64_t pooled();
  /// Allocates the step's arena of `bytes` (tdx/Runtime/Arena.h), freeing
  /// any earlier one; the allocator then places the planned tensors in it.
  static void reserveArena(int64_t bytes);
  /// A copy of `t` in memory the pool does not hand out again, for what
  /// outlives the steps (the outputs the driver keeps of every step).
  static at::Tensor unpooled(const at::Tensor &t);
};

/// One row of an emitted elementwise kernel: `operands[i]` points at the
/// row's first element of input i (then the outputs), `strides[i]` is input
/// i's element stride along the row (0 when broadcast; outputs are dense).
using KernelRow = void (*)(char *const *operands, const int64_t *strides, int64_t n);

/// Runs an emitted elementwise kernel over `shape` (-1: the broadcast size of
/// the inputs there): every input is broadcast to it, every output is a new
/// dense tensor of its dtype. Dims that are contiguous for every operand are
/// merged so rows are as long as possible; rows run in parallel on ATen's
/// intra-op threads. With `wholeRows`, a row is exactly the last dim (a
/// kernel that ends in a row op, tdx/Runtime/FusedRows.h).
std::vector<at::Tensor> elementwise(std::vector<int64_t> shape,
                                    const std::vector<at::Tensor> &inputs,
                                    const std::vector<at::ScalarType> &outputTypes, KernelRow row,
                                    bool wholeRows = false);

/// A dense tensor of `dtype` from host values.
inline at::Tensor constant(const std::vector<double> &values, const std::vector<int64_t> &shape,
                           at::ScalarType dtype) {
  return at::tensor(values, at::kDouble).to(dtype).reshape(shape);
}

/// x / sqrt(mean(x^2 over the normalized dims) + eps) * w (w may be undefined).
inline at::Tensor rms_norm(const at::Tensor &x, const std::vector<int64_t> &normalizedShape,
                           const at::Tensor &w, double eps) {
  std::vector<int64_t> dims;
  for (int64_t d = -static_cast<int64_t>(normalizedShape.size()); d < 0; ++d)
    dims.push_back(d);
  at::Tensor y = x * at::rsqrt(x.pow(2).mean(dims, true) + eps);
  return w.defined() ? y * w : y;
}

using Program = BasicProgram<Context, at::Tensor, at::ScalarType>;
using State = Program::State;

/// The driver of a model binary. Returns the process exit code.
int runMain(int argc, char **argv, const Program &program);


} // namespace tdx::rt

#endif // TDX_RUNTIME_RUNTIME_H
