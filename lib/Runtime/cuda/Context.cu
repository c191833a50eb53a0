//===- Context.cu - NCCL collectives over mesh axes, sharded init on GPU --===//
//
// One NCCL communicator per group of mesh axes, bootstrapped through the MPI
// group of the same ranks (tdx/Runtime/Mesh.h): its root makes the unique id
// and broadcasts it with a deadline. Collectives run on a stream of their
// own, ordered against the compute stream by events. Communicators are
// nonblocking: every wait polls the collective's event and NCCL's async
// error against the collective timeout, and aborts the communicators
// instead of hanging on a lost rank. Ranks that share a GPU use MPI through
// host memory instead (the last section).
//
//===----------------------------------------------------------------------===//

#include "tdx/Runtime/InitKernels.h"
#include "tdx/Runtime/cuda/Runtime.h"
#include "Nccl.cuh"

#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <climits>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <thread>

using namespace tdx::cu;

namespace {

ncclDataType_t ncclType(DType t) {
  switch (t) {
  case DType::F32: return ncclFloat32;
  case DType::F64: return ncclFloat64;
  case DType::F16: return ncclFloat16;
  case DType::BF16: return ncclBfloat16;
  case DType::I64: return ncclInt64;
  case DType::I32: return ncclInt32;
  case DType::Bool: return ncclUint8;
  case DType::I8: return ncclInt8;
  case DType::U8: return ncclUint8;
  case DType::I16:
    throw std::runtime_error("tdx: NCCL has no 16-bit integer type; cast the tensor to i32");
  case DType::C64:
  case DType::C128:
    throw std::runtime_error("tdx: NCCL has no complex type; the CUDA backend runs no complex "
                             "ops (compile for --target cpu)");
  }
  return ncclFloat32;
}

ncclRedOp_t ncclOp(int64_t reduce) {
  switch (reduce) {
  case tdx::rt::Avg: return ncclAvg;
  case tdx::rt::Max: return ncclMax;
  case tdx::rt::Min: return ncclMin;
  default: return ncclSum;
  }
}

tdx::cuda::Box boxOf(const tdx::rt::Mesh &mesh, const std::vector<int64_t> &shape,
                     const Layout &layout) {
  if (shape.size() > 8)
    throw std::runtime_error("tdx: sharded init handles tensors of rank <= 8");
  std::vector<int64_t> offset, size;
  mesh.box(shape, layout, offset, size);
  tdx::cuda::Box box;
  box.rank = static_cast<int>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    box.global[d] = shape[d];
    box.offset[d] = offset[d];
    box.size[d] = size[d];
  }
  return box;
}

} // namespace

Context::Context(std::vector<int64_t> meshShape, std::vector<std::string> axes, uint64_t seed,
                 bool verbose)
    : Mesh(std::move(meshShape), std::move(axes)), seed_(seed), verbose_(verbose) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    throw std::runtime_error("tdx: no CUDA device is visible to rank " + std::to_string(rank()) +
                             "; run the CPU build of this model (tdx-compile --target cpu)");
  checkCuda(cudaSetDevice(rank() % devices), "cudaSetDevice");
  // NCCL, unless two ranks share a device (it refuses them) or
  // TDX_CUDA_COLLECTIVES says otherwise.
  const char *asked = std::getenv("TDX_CUDA_COLLECTIVES");
  std::string choice = asked ? asked : "auto";
  if (choice != "auto" && choice != "nccl" && choice != "mpi")
    throw std::runtime_error("tdx: TDX_CUDA_COLLECTIVES is '" + choice +
                             "'; use nccl, mpi (through host memory) or auto");
  cudaDeviceProp prop;
  checkCuda(cudaGetDeviceProperties(&prop, rank() % devices), "cudaGetDeviceProperties");
  std::vector<char> uuids(16 * static_cast<size_t>(worldSize()));
  MPI_Request request;
  tdx::rt::checkMpi(MPI_Iallgather(prop.uuid.bytes, 16, MPI_BYTE, uuids.data(), 16, MPI_BYTE,
                                   MPI_COMM_WORLD, &request),
                    "exchange of device ids");
  complete(&request, "exchange of device ids", {});
  bool shared = false;
  for (int r = 0; r < worldSize(); ++r)
    shared |= r != rank() && !std::memcmp(uuids.data() + 16 * r, prop.uuid.bytes, 16);
  if (shared && choice == "nccl")
    throw std::runtime_error(
        "tdx: " + std::to_string(worldSize()) + " ranks on " + std::to_string(devices) +
        " visible GPU(s): rank " + std::to_string(rank()) + " shares GPU " +
        std::to_string(rank() % devices) + " with another rank, which NCCL refuses, and "
        "TDX_CUDA_COLLECTIVES=nccl leaves no host-memory path; run at most " +
        std::to_string(devices) + " ranks, or unset TDX_CUDA_COLLECTIVES (auto: ranks that "
        "share a GPU communicate through host memory)");
  staged_ = choice == "mpi" || (choice == "auto" && shared);
  if (verbose_ && staged_ && rank() == 0)
    std::fprintf(stderr, "tdx: collectives by MPI through host memory (%s)\n",
                 shared ? "ranks share a GPU, which NCCL refuses" : "TDX_CUDA_COLLECTIVES=mpi");
}

Context::~Context() {
  for (auto &[axes, comm] : nccl_)
    ncclCommDestroy(static_cast<ncclComm_t>(comm));
  for (auto &[key, c] : channels_) {
    ncclCommDestroy(static_cast<ncclComm_t>(c.comm));
    cudaEventDestroy(static_cast<cudaEvent_t>(c.event));
    cudaStreamDestroy(static_cast<cudaStream_t>(c.stream));
  }
  if (ready_)
    cudaEventDestroy(static_cast<cudaEvent_t>(ready_));
  if (commStream_) {
    cudaEventDestroy(static_cast<cudaEvent_t>(done_));
    cudaStreamDestroy(static_cast<cudaStream_t>(commStream_));
  }
}

void *Context::comm(const std::vector<std::string> &axes, const Group &g) {
  auto it = nccl_.find(axes);
  if (it != nccl_.end())
    return it->second;
  ncclUniqueId id;
  if (g.index == 0)
    checkNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  MPI_Request request;
  tdx::rt::checkMpi(MPI_Ibcast(&id, sizeof(id), MPI_BYTE, 0, *static_cast<MPI_Comm *>(g.comm),
                               &request),
                    "broadcast of the NCCL id");
  complete(&request, "NCCL set-up", axes);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t c = nullptr;
  checkNccl(ncclCommInitRankConfig(&c, g.size, id, g.index, &config), "ncclCommInitRankConfig");
  nccl_[axes] = c;
  synchronize("NCCL set-up", axes);
  return c;
}

void Context::orderAfterCompute(void *stream) {
  if (!ready_) {
    cudaEvent_t ready;
    checkCuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
    ready_ = ready;
  }
  checkCuda(cudaEventRecord(static_cast<cudaEvent_t>(ready_), nullptr), "cudaEventRecord");
  checkCuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                                static_cast<cudaEvent_t>(ready_), 0),
            "cudaStreamWaitEvent");
}

void *Context::beginCollective() {
  if (!commStream_) {
    cudaStream_t stream;
    cudaEvent_t done;
    checkCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    checkCuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
    commStream_ = stream, done_ = done;
  }
  orderAfterCompute(commStream_);
  return commStream_;
}

void Context::endCollective(const char *what, const std::vector<std::string> &axes) {
  auto done = static_cast<cudaEvent_t>(done_);
  checkCuda(cudaEventRecord(done, static_cast<cudaStream_t>(commStream_)), "cudaEventRecord");
  checkCuda(cudaStreamWaitEvent(nullptr, done, 0), "cudaStreamWaitEvent");
  synchronize(what, axes, done_);
}

void Context::synchronize(const char *what, const std::vector<std::string> &axes, void *event) {
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(collectiveTimeout());
  for (;;) {
    bool pending = false;
    std::vector<ncclComm_t> comms;
    for (auto &[a, c] : nccl_)
      comms.push_back(static_cast<ncclComm_t>(c));
    for (auto &[key, c] : channels_)
      comms.push_back(static_cast<ncclComm_t>(c.comm));
    for (ncclComm_t c : comms) {
      ncclResult_t state = ncclSuccess;
      checkNccl(ncclCommGetAsyncError(c, &state), "async error query");
      if (state == ncclInProgress)
        pending = true;
      else if (state != ncclSuccess) {
        abortCommunicators();
        checkNccl(state, what);
      }
    }
    cudaError_t e = event ? cudaEventQuery(static_cast<cudaEvent_t>(event))
                          : cudaStreamQuery(nullptr);
    if (e != cudaErrorNotReady)
      checkCuda(e, what);
    if (!pending && e == cudaSuccess)
      return;
    if (std::chrono::steady_clock::now() > deadline) {
      abortCommunicators();
      timedOut(what, axes);
    }
    std::this_thread::yield();
  }
}

void Context::abortCommunicators() {
  for (auto &[axes, c] : nccl_)
    ncclCommAbort(static_cast<ncclComm_t>(c));
  nccl_.clear();
  for (auto &[key, c] : channels_)
    ncclCommAbort(static_cast<ncclComm_t>(c.comm));
  channels_.clear(); // their streams and events are left to the process's end
}

/// A collective between start and wait: its input (kept until it is done),
/// result, completion event, and the chunk a reduce_scatter keeps.
struct Context::InFlight {
  Tensor in, out;
  cudaEvent_t done = nullptr;
  std::vector<std::string> axes;
  const char *what;
  int64_t size, index, dim = -1;
};

Tensor Context::allReduce(const Tensor &x, const std::vector<std::string> &axes, int64_t reduce) {
  return wait(startAllReduce(x, axes, reduce));
}

int64_t Context::startAllReduce(const Tensor &x, const std::vector<std::string> &axes,
                                int64_t reduce) {
  Group g = group(axes);
  auto f = std::make_unique<InFlight>();
  f->in = x.contiguous();
  f->axes = axes;
  f->what = "all_reduce";
  f->size = g.size;
  f->index = g.index;
  addBytes(f->in.nbytes());
  // Through host memory the result is made on the compute stream, and is
  // ready where it is made.
  cudaStream_t stream = nullptr;
  if (staged_) {
    f->out = hostAllReduce(f->in, g, reduce, axes);
  } else {
    auto c = static_cast<ncclComm_t>(comm(axes, g));
    f->out = Tensor::empty(x.sizes(), x.dtype());
    stream = static_cast<cudaStream_t>(beginCollective());
    checkNccl(ncclAllReduce(f->in.data(), f->out.data(), static_cast<size_t>(f->in.numel()),
                            ncclType(x.dtype()), ncclOp(reduce), c, stream),
              "all_reduce");
  }
  checkCuda(cudaEventCreateWithFlags(&f->done, cudaEventDisableTiming), "cudaEventCreate");
  checkCuda(cudaEventRecord(f->done, stream), "cudaEventRecord");
  if (!overlap())
    synchronize(f->what, f->axes, f->done);
  inFlight_.push_back(std::move(f));
  return static_cast<int64_t>(inFlight_.size()) - 1;
}

int64_t Context::startReduceScatter(const Tensor &x, const std::vector<std::string> &axes,
                                    int64_t reduce, int64_t dim) {
  int64_t handle = startAllReduce(x, axes, reduce);
  inFlight_[handle]->what = "reduce_scatter";
  inFlight_[handle]->dim = dim;
  return handle;
}

Tensor Context::wait(int64_t handle) {
  if (handle < 0 || handle >= static_cast<int64_t>(inFlight_.size()) || !inFlight_[handle])
    throw std::logic_error("tdx: wait on a collective that was not started or was waited for");
  std::unique_ptr<InFlight> f = std::move(inFlight_[handle]);
  if (std::all_of(inFlight_.begin(), inFlight_.end(), [](auto &p) { return !p; }))
    inFlight_.clear();
  checkCuda(cudaStreamWaitEvent(nullptr, f->done, 0), "cudaStreamWaitEvent");
  synchronize(f->what, f->axes, f->done);
  cudaEventDestroy(f->done);
  if (f->dim >= 0)
    return chunk(f->out, f->size, f->index, f->dim);
  return f->out;
}

Tensor Context::allGather(const Tensor &x, const std::vector<std::string> &axes, int64_t dim) {
  Group g = group(axes);
  const int size = g.size, index = g.index;
  dim = x.wrap(dim);
  Tensor front = x.transpose(0, dim).contiguous();
  // Pieces may differ along `dim` (torch.chunk): exchange their sizes first.
  int64_t mine = front.dim() ? front.size(0) : 1;
  std::vector<int64_t> sizes(size);
  MPI_Request request;
  tdx::rt::checkMpi(MPI_Iallgather(&mine, 1, MPI_INT64_T, sizes.data(), 1, MPI_INT64_T,
                                   *static_cast<MPI_Comm *>(g.comm), &request),
                    "all_gather");
  complete(&request, "all_gather", axes);
  std::vector<int64_t> shape = front.sizes();
  int64_t row = mine ? front.numel() / mine : 0, total = 0;
  if (!mine) {
    row = 1;
    for (size_t d = 1; d < shape.size(); ++d)
      row *= shape[d];
  }
  for (int64_t s : sizes)
    total += s;
  shape[0] = total;
  addBytes(front.nbytes());
  if (staged_) {
    std::vector<Tensor> received;
    for (int r = 0; r < size; ++r) {
      shape[0] = sizes[r];
      received.push_back(Tensor::empty(shape, x.dtype()));
    }
    hostExchange(std::vector<Tensor>(size, front), received, g, "all_gather", axes);
    return tdx::cu::concat(received, 0).transpose(0, dim).contiguous();
  }
  Tensor gathered = Tensor::empty(shape, x.dtype());
  auto c = static_cast<ncclComm_t>(comm(axes, g));
  int64_t item = tdx::rt::dtypeSize(x.dtype()), at = 0;
  auto stream = static_cast<cudaStream_t>(beginCollective());
  checkNccl(ncclGroupStart(), "group start");
  for (int r = 0; r < size; ++r) {
    char *slot = static_cast<char *>(gathered.data()) + at * row * item;
    checkNccl(ncclBroadcast(r == index ? front.data() : slot, slot,
                            static_cast<size_t>(sizes[r] * row), ncclType(x.dtype()), r, c,
                            stream),
              "all_gather");
    at += sizes[r];
  }
  checkNccl(ncclGroupEnd(), "all_gather");
  endCollective("all_gather", axes);
  return gathered.transpose(0, dim).contiguous();
}

Tensor Context::broadcast(const Tensor &x, const std::vector<std::string> &axes,
                          const std::vector<int64_t> &root) {
  Group g = group(axes);
  const int from = groupIndexOf(axes, root);
  Tensor in = x.contiguous();
  if (g.index == from)
    addBytes(in.nbytes() * (g.size - 1));
  if (staged_) {
    std::vector<Tensor> pieces(g.size), received(g.size);
    for (int r = 0; r < g.size; ++r) {
      pieces[r] = g.index == from ? in : Tensor::empty({0}, x.dtype());
      received[r] = Tensor::empty(r == from ? x.sizes() : std::vector<int64_t>{0}, x.dtype());
    }
    hostExchange(pieces, received, g, "broadcast", axes);
    return received[from];
  }
  Tensor out = Tensor::empty(x.sizes(), x.dtype());
  auto c = static_cast<ncclComm_t>(comm(axes, g));
  auto stream = static_cast<cudaStream_t>(beginCollective());
  checkNccl(ncclBroadcast(in.data(), out.data(), static_cast<size_t>(in.numel()),
                          ncclType(x.dtype()), from, c, stream),
            "broadcast");
  endCollective("broadcast", axes);
  return out;
}

Tensor Context::permute(const Tensor &x, const std::vector<std::string> &axes,
                        const std::vector<int64_t> &pairs) {
  Group g = group(axes);
  auto [to, from] = permutePeers(pairs, g.index);
  Tensor in = x.contiguous();
  Tensor out = from >= 0 ? Tensor::empty(x.sizes(), x.dtype()) : tdx::cu::zeros(x.sizes(), x.dtype());
  if (to >= 0)
    addBytes(in.nbytes());
  if (staged_) {
    std::vector<Tensor> pieces(g.size), received(g.size);
    for (int r = 0; r < g.size; ++r) {
      pieces[r] = r == to ? in : Tensor::empty({0}, x.dtype());
      received[r] = r == from ? out : Tensor::empty({0}, x.dtype());
    }
    hostExchange(pieces, received, g, "collective_permute", axes);
    return out;
  }
  auto c = static_cast<ncclComm_t>(comm(axes, g));
  auto stream = static_cast<cudaStream_t>(beginCollective());
  checkNccl(ncclGroupStart(), "group start");
  if (to >= 0)
    checkNccl(ncclSend(in.data(), static_cast<size_t>(in.numel()), ncclType(x.dtype()), to, c,
                       stream),
              "collective_permute");
  if (from >= 0)
    checkNccl(ncclRecv(out.data(), static_cast<size_t>(out.numel()), ncclType(x.dtype()), from,
                       c, stream),
              "collective_permute");
  checkNccl(ncclGroupEnd(), "collective_permute");
  endCollective("collective_permute", axes);
  return out;
}

int64_t Context::completedAtStart(Tensor out, const std::vector<std::string> &axes,
                                  const char *what) {
  auto f = std::make_unique<InFlight>();
  f->out = std::move(out);
  f->axes = axes;
  f->what = what;
  checkCuda(cudaEventCreateWithFlags(&f->done, cudaEventDisableTiming), "cudaEventCreate");
  checkCuda(cudaEventRecord(f->done, nullptr), "cudaEventRecord");
  inFlight_.push_back(std::move(f));
  return static_cast<int64_t>(inFlight_.size()) - 1;
}

int64_t Context::startAllGather(const Tensor &x, const std::vector<std::string> &axes,
                                int64_t dim, int64_t total) {
  // Not asynchronous on CUDA yet: gathered here, so wait() orders nothing
  // more. `total` is what the CPU runtime uses to skip the size exchange.
  (void)total;
  return completedAtStart(allGather(x, axes, dim), axes, "all_gather");
}

int64_t Context::startPermute(const Tensor &x, const std::vector<std::string> &axes,
                              const std::vector<int64_t> &pairs) {
  return completedAtStart(permute(x, axes, pairs), axes, "collective_permute");
}

Tensor Context::chunk(const Tensor &x, int64_t chunks, int64_t index, int64_t dim) {
  dim = x.wrap(dim);
  auto [start, end] = tdx::rt::chunkRange(x.size(dim), chunks, index);
  // A new tensor even where the piece is contiguous: a view would keep all
  // of `x` alive as long as the piece, which the step's plan does not expect.
  Tensor piece = x.slice(dim, start, end, 1);
  Tensor out = Tensor::empty(piece.sizes(), piece.dtype());
  copyInto(out, piece);
  return out;
}

Tensor Context::reduceScatter(const Tensor &x, const std::vector<std::string> &axes,
                              int64_t reduce, int64_t dim) {
  return wait(startReduceScatter(x, axes, reduce, dim));
}

Tensor Context::allToAll(const Tensor &x, const std::vector<std::string> &axes, int64_t split,
                         int64_t concat) {
  Group g = group(axes);
  const int size = g.size, index = g.index;
  split = x.wrap(split);
  // Everyone's shape, to know the pieces received.
  std::vector<int64_t> shape = x.sizes(), shapes(size * shape.size());
  MPI_Request request;
  tdx::rt::checkMpi(MPI_Iallgather(shape.data(), static_cast<int>(shape.size()), MPI_INT64_T,
                                   shapes.data(), static_cast<int>(shape.size()), MPI_INT64_T,
                                   *static_cast<MPI_Comm *>(g.comm), &request),
                    "all_to_all");
  complete(&request, "all_to_all", axes);
  std::vector<Tensor> send, received;
  for (int r = 0; r < size; ++r) {
    send.push_back(chunk(x, size, r, split));
    std::vector<int64_t> s(shapes.begin() + r * shape.size(),
                           shapes.begin() + (r + 1) * shape.size());
    auto [start, end] = tdx::rt::chunkRange(s[split], size, index);
    s[split] = end - start;
    received.push_back(Tensor::empty(s, x.dtype()));
    addBytes(send.back().nbytes());
  }
  if (staged_) {
    hostExchange(send, received, g, "all_to_all", axes);
    return tdx::cu::concat(received, concat);
  }
  auto c = static_cast<ncclComm_t>(comm(axes, g));
  auto stream = static_cast<cudaStream_t>(beginCollective());
  checkNccl(ncclGroupStart(), "group start");
  for (int r = 0; r < size; ++r) {
    checkNccl(ncclSend(send[r].data(), static_cast<size_t>(send[r].numel()), ncclType(x.dtype()),
                       r, c, stream),
              "all_to_all");
    checkNccl(ncclRecv(received[r].data(), static_cast<size_t>(received[r].numel()),
                       ncclType(x.dtype()), r, c, stream),
              "all_to_all");
  }
  checkNccl(ncclGroupEnd(), "all_to_all");
  endCollective("all_to_all", axes);
  return tdx::cu::concat(received, concat);
}

Tensor Context::init(const tdx::rt::InitProgram &program0, const Layout &layout) const {
  using tdx::rt::InitProgram;
  InitProgram program = tdx::rt::withSeed(program0, seed());
  const InitProgram::Node &r = program.result();
  tdx::cuda::Box box = boxOf(*this, r.shape, layout);
  std::vector<int64_t> size(box.size, box.size + box.rank);
  bool device = program.nodes.size() == 1 && r.dtype == DType::F32;
  if (device && (r.kind == InitProgram::Full || r.kind == InitProgram::Empty))
    return tdx::cu::full(size, r.kind == InitProgram::Full ? r.p[0] : 0.0, r.dtype);
  Tensor t = Tensor::empty(size, r.dtype);
  float *out = static_cast<float *>(t.data());
  if (device && r.kind == InitProgram::Uniform)
    checkCuda(static_cast<cudaError_t>(
                  tdx::cuda::launchUniform(out, box, r.seed, r.stream, r.p[0], r.p[1])),
              "uniform init");
  else if (device && r.kind == InitProgram::Normal)
    checkCuda(static_cast<cudaError_t>(
                  tdx::cuda::launchNormal(out, box, r.seed, r.stream, r.p[0], r.p[1])),
              "normal init");
  else if (device && r.kind == InitProgram::TruncNormal)
    checkCuda(static_cast<cudaError_t>(tdx::cuda::launchTruncNormal(
                  out, box, r.seed, r.stream, r.p[0], r.p[1], r.p[2], r.p[3])),
              "trunc_normal init");
  else {
    // Any other program: evaluated on the host for this box alone.
    std::vector<char> host(t.nbytes());
    program.fillBox(std::vector<int64_t>(box.offset, box.offset + box.rank), size, host.data());
    if (!host.empty())
      checkCuda(cudaMemcpy(t.data(), host.data(), host.size(), cudaMemcpyHostToDevice),
                "cudaMemcpy");
  }
  return t;
}

//===- Collectives through host memory ----------------------------------===//
//
// NCCL refuses a communicator with two ranks on one GPU. Where ranks share
// a device (a multi-rank program checked on a one-GPU machine), or where
// TDX_CUDA_COLLECTIVES=mpi asks for it, the context moves each collective's
// input to the host, runs the MPI collective of the same meaning there (with
// the collective deadline, as the CPU runtime does) and copies the result
// back. Slow, but the sharded program around it is the one NCCL would run.
//
//===----------------------------------------------------------------------===//

namespace {

MPI_Datatype mpiType(DType t) {
  switch (t) {
  case DType::F32: return MPI_FLOAT;
  case DType::F64: return MPI_DOUBLE;
  case DType::I64: return MPI_INT64_T;
  case DType::I32: return MPI_INT32_T;
  default:
    throw std::runtime_error(
        std::string("tdx: an all_reduce of ") + tdx::rt::dtypeName(t) +
        " through host memory (ranks sharing a GPU) is not supported; reduce float32, "
        "float64, int32 or int64, or give each rank its own GPU");
  }
}

template <typename T> void divide(void *data, int64_t n, int64_t by) {
  T *p = static_cast<T *>(data);
  for (int64_t i = 0; i < n; ++i)
    p[i] /= static_cast<T>(by);
}

int count(int64_t bytes, const char *what) {
  if (bytes > INT_MAX)
    throw std::runtime_error(std::string("tdx: a ") + what +
                             " piece over 2 GiB cannot go through host memory; give each rank "
                             "its own GPU (NCCL)");
  return static_cast<int>(bytes);
}

} // namespace

Tensor Context::hostAllReduce(const Tensor &x, const Group &g, int64_t reduce,
                              const std::vector<std::string> &axes) {
  Tensor in = x.contiguous();
  MPI_Datatype type = mpiType(in.dtype());
  synchronize("all_reduce", axes);
  std::vector<char> host(static_cast<size_t>(in.nbytes()));
  if (!host.empty())
    checkCuda(cudaMemcpy(host.data(), in.data(), host.size(), cudaMemcpyDeviceToHost),
              "all_reduce: copy to the host");
  MPI_Op op = reduce == tdx::rt::Max ? MPI_MAX : reduce == tdx::rt::Min ? MPI_MIN : MPI_SUM;
  MPI_Request request;
  tdx::rt::checkMpi(MPI_Iallreduce(MPI_IN_PLACE, host.data(), count(in.numel(), "all_reduce"),
                                   type, op, *static_cast<MPI_Comm *>(g.comm), &request),
                    "all_reduce");
  complete(&request, "all_reduce", axes);
  if (reduce == tdx::rt::Avg) {
    switch (in.dtype()) {
    case DType::F32: divide<float>(host.data(), in.numel(), g.size); break;
    case DType::F64: divide<double>(host.data(), in.numel(), g.size); break;
    case DType::I64: divide<int64_t>(host.data(), in.numel(), g.size); break;
    default: divide<int32_t>(host.data(), in.numel(), g.size); break;
    }
  }
  Tensor out = Tensor::empty(in.sizes(), in.dtype());
  if (!host.empty())
    checkCuda(cudaMemcpy(out.data(), host.data(), host.size(), cudaMemcpyHostToDevice),
              "all_reduce: copy to the device");
  return out;
}

void Context::hostExchange(const std::vector<Tensor> &pieces, const std::vector<Tensor> &received,
                           const Group &g, const char *what,
                           const std::vector<std::string> &axes) {
  std::vector<int> sendCounts(g.size), sendAt(g.size), recvCounts(g.size), recvAt(g.size);
  int64_t sent = 0, got = 0;
  for (int r = 0; r < g.size; ++r) {
    sendAt[r] = count(sent, what), recvAt[r] = count(got, what);
    sendCounts[r] = count(pieces[r].nbytes(), what);
    recvCounts[r] = count(received[r].nbytes(), what);
    sent += sendCounts[r], got += recvCounts[r];
  }
  synchronize(what, axes);
  std::vector<char> out(static_cast<size_t>(sent)), in(static_cast<size_t>(got));
  for (int r = 0; r < g.size; ++r)
    if (sendCounts[r])
      checkCuda(cudaMemcpy(out.data() + sendAt[r], pieces[r].contiguous().data(),
                           static_cast<size_t>(sendCounts[r]), cudaMemcpyDeviceToHost),
                "copy to the host");
  MPI_Request request;
  tdx::rt::checkMpi(MPI_Ialltoallv(out.data(), sendCounts.data(), sendAt.data(), MPI_BYTE,
                                   in.data(), recvCounts.data(), recvAt.data(), MPI_BYTE,
                                   *static_cast<MPI_Comm *>(g.comm), &request),
                    what);
  complete(&request, what, axes);
  for (int r = 0; r < g.size; ++r)
    if (recvCounts[r])
      checkCuda(cudaMemcpy(received[r].data(), in.data() + recvAt[r],
                           static_cast<size_t>(recvCounts[r]), cudaMemcpyHostToDevice),
                "copy to the device");
}

void Context::hostSend(const Tensor &x, const std::vector<std::string> &axes, int64_t peer,
                       int64_t tag) {
  synchronize("send", axes);
  auto keep = std::make_shared<std::vector<char>>(static_cast<size_t>(x.nbytes()));
  if (!keep->empty())
    checkCuda(cudaMemcpy(keep->data(), x.contiguous().data(), keep->size(),
                         cudaMemcpyDeviceToHost),
              "copy to the host");
  const void *data = keep->data();
  sendBytes(std::move(keep), data, x.nbytes(), axes, peer, tag);
}

Tensor Context::hostRecv(std::vector<int64_t> shape, DType dtype,
                         const std::vector<std::string> &axes, int64_t peer, int64_t tag) {
  completeShape(shape, rt::dtypeSize(dtype), axes, peer, tag);
  Tensor out = Tensor::empty(shape, dtype);
  std::vector<char> host(static_cast<size_t>(out.nbytes()));
  recvBytes(host.data(), out.nbytes(), axes, peer, tag);
  if (!host.empty())
    checkCuda(cudaMemcpy(out.data(), host.data(), host.size(), cudaMemcpyHostToDevice),
              "copy to the device");
  return out;
}
