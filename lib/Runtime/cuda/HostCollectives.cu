//===- HostCollectives.cu - MPI collectives through host memory ----------===//
//
// NCCL refuses a communicator with two ranks on one GPU. Where ranks share
// a device (a multi-rank program checked on a one-GPU machine), or where
// TDX_CUDA_COLLECTIVES=mpi asks for it, the context moves each collective's
// input to the host, runs the MPI collective of the same meaning there (with
// the collective deadline, as the CPU runtime does) and copies the result
// back. Slow, but the sharded program around it is the one NCCL would run.
//
//===----------------------------------------------------------------------===//

#include "tdx/Runtime/cuda/Runtime.h"

#include <mpi.h>

#include <climits>
#include <memory>
#include <cstring>
#include <stdexcept>

using namespace tdx::cu;

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
