//===- Context.cpp - collectives on MPI, sharded init, gathering ----------===//

#include "tdx/Runtime/Philox.h"
#include "tdx/Runtime/Runtime.h"

#include <mpi.h>

#include <chrono>
#include <numeric>
#include <thread>
#include <sstream>
#include <stdexcept>

using namespace tdx::rt;

namespace {

MPI_Datatype mpiType(at::ScalarType t) {
  switch (t) {
  case at::kFloat:
    return MPI_FLOAT;
  case at::kDouble:
    return MPI_DOUBLE;
  case at::kLong:
    return MPI_INT64_T;
  case at::kInt:
    return MPI_INT32_T;
  default:
    throw std::runtime_error(std::string("tdx: collectives on ") + c10::toString(t) +
                             " tensors are not supported; use float, double, int32 or int64");
  }
}

MPI_Op mpiOp(int64_t reduce) {
  switch (reduce) {
  case Max:
    return MPI_MAX;
  case Min:
    return MPI_MIN;
  default:
    return MPI_SUM;
  }
}

} // namespace

Context::Context(std::vector<int64_t> meshShape, std::vector<std::string> axes, uint64_t seed,
                 bool verbose)
    : Mesh(std::move(meshShape), std::move(axes)), seed_(seed), verbose_(verbose) {}

at::Tensor Context::allReduce(const at::Tensor &x, const std::vector<std::string> &axes,
                              int64_t reduce) {
  Profile::Scope timed(&Profile::collectives);
  auto [group_, size, index] = group(axes);
  MPI_Comm comm = *static_cast<MPI_Comm *>(group_);
  at::Tensor out = x.contiguous().clone();
  addBytes(out.nbytes());
  MPI_Request request;
  checkMpi(MPI_Iallreduce(MPI_IN_PLACE, out.data_ptr(), static_cast<int>(out.numel()),
                       mpiType(out.scalar_type()), mpiOp(reduce), comm, &request),
        "all_reduce");
  complete(&request, "all_reduce", axes);
  if (reduce == Avg)
    out.div_(size);
  return out;
}

at::Tensor Context::allGather(const at::Tensor &x, const std::vector<std::string> &axes,
                              int64_t dim) {
  Profile::Scope timed(&Profile::collectives);
  auto [group_, size, index] = group(axes);
  MPI_Comm comm = *static_cast<MPI_Comm *>(group_);
  // Pieces may differ along `dim` (torch.chunk): gather the sizes first.
  at::Tensor front = x.transpose(0, dim).contiguous();
  int64_t mine = front.size(0);
  std::vector<int64_t> sizes(size);
  MPI_Request request;
  checkMpi(MPI_Iallgather(&mine, 1, MPI_INT64_T, sizes.data(), 1, MPI_INT64_T, comm, &request),
        "all_gather");
  complete(&request, "all_gather", axes);
  int64_t row = mine ? front.nbytes() / mine : 0;
  if (!row) {
    std::vector<int64_t> shape = front.sizes().vec();
    shape[0] = 1;
    row = at::empty(shape, front.options()).nbytes();
  }
  std::vector<int> counts(size), displs(size);
  int64_t total = 0;
  for (int r = 0; r < size; ++r) {
    counts[r] = static_cast<int>(sizes[r] * row);
    displs[r] = static_cast<int>(total * row);
    total += sizes[r];
  }
  std::vector<int64_t> shape = front.sizes().vec();
  shape[0] = total;
  at::Tensor gathered = at::empty(shape, front.options());
  addBytes(front.nbytes());
  checkMpi(MPI_Iallgatherv(front.data_ptr(), static_cast<int>(front.nbytes()), MPI_BYTE,
                        gathered.data_ptr(), counts.data(), displs.data(), MPI_BYTE, comm,
                        &request),
        "all_gather");
  complete(&request, "all_gather", axes);
  return gathered.transpose(0, dim).contiguous();
}

at::Tensor Context::chunk(const at::Tensor &x, int64_t chunks, int64_t index, int64_t dim) {
  auto [start, end] = chunkRange(x.size(dim), chunks, index);
  return x.narrow(dim, start, end - start).contiguous();
}

at::Tensor Context::reduceScatter(const at::Tensor &x, const std::vector<std::string> &axes,
                                  int64_t reduce, int64_t dim) {
  Profile::Scope timed(&Profile::collectives);
  auto [group_, size, index] = group(axes);
  return chunk(allReduce(x, axes, reduce), size, index, dim);
}

at::Tensor Context::allToAll(const at::Tensor &x, const std::vector<std::string> &axes,
                             int64_t split, int64_t concat) {
  Profile::Scope timed(&Profile::collectives);
  auto [group_, size, index] = group(axes);
  MPI_Comm comm = *static_cast<MPI_Comm *>(group_);
  // Everyone's shape, to know the pieces received.
  std::vector<int64_t> shape = x.sizes().vec(), shapes(size * shape.size());
  MPI_Request request;
  checkMpi(MPI_Iallgather(shape.data(), static_cast<int>(shape.size()), MPI_INT64_T, shapes.data(),
                       static_cast<int>(shape.size()), MPI_INT64_T, comm, &request),
        "all_to_all");
  complete(&request, "all_to_all", axes);
  std::vector<at::Tensor> send;
  std::vector<int> sendCounts(size), sendDispls(size), recvCounts(size), recvDispls(size);
  int64_t offset = 0;
  for (int r = 0; r < size; ++r) {
    send.push_back(chunk(x, size, r, split));
    sendCounts[r] = static_cast<int>(send.back().nbytes());
    sendDispls[r] = static_cast<int>(offset);
    offset += send.back().nbytes();
  }
  at::Tensor sendBuffer = at::cat(send.empty() ? std::vector<at::Tensor>{} : [&] {
    std::vector<at::Tensor> flat;
    for (auto &t : send)
      flat.push_back(t.reshape({-1}));
    return flat;
  }());
  std::vector<at::Tensor> received;
  offset = 0;
  for (int r = 0; r < size; ++r) {
    std::vector<int64_t> s(shapes.begin() + r * shape.size(), shapes.begin() + (r + 1) * shape.size());
    auto [start, end] = chunkRange(s[split], size, index);
    s[split] = end - start;
    received.push_back(at::empty(s, x.options()));
    recvCounts[r] = static_cast<int>(received.back().nbytes());
    recvDispls[r] = static_cast<int>(offset);
    offset += received.back().nbytes();
  }
  at::Tensor recvBuffer = at::empty({offset}, x.options().dtype(at::kByte));
  addBytes(sendBuffer.nbytes());
  checkMpi(MPI_Ialltoallv(sendBuffer.data_ptr(), sendCounts.data(), sendDispls.data(), MPI_BYTE,
                       recvBuffer.data_ptr(), recvCounts.data(), recvDispls.data(), MPI_BYTE,
                       comm, &request),
        "all_to_all");
  complete(&request, "all_to_all", axes);
  for (int r = 0; r < size; ++r)
    std::memcpy(received[r].data_ptr(),
                static_cast<uint8_t *>(recvBuffer.data_ptr()) + recvDispls[r], recvCounts[r]);
  return at::cat(received, concat);
}

namespace {
template <typename Fn>
at::Tensor fillBox(const Context &ctx, const std::vector<int64_t> &shape, const Layout &layout,
                   at::ScalarType dtype, Fn value) {
  std::vector<int64_t> offset, size;
  ctx.box(shape, layout, offset, size);
  // Values are computed in double and rounded once to `dtype`, a block at a
  // time: the workspace is one block, whatever the shard's size.
  constexpr int64_t kBlock = 1 << 16;
  at::Tensor out = at::empty(size, at::TensorOptions().dtype(dtype));
  at::Tensor flat = out.view({-1});
  int64_t n = out.numel();
  at::Tensor block = at::empty({std::min(n, kBlock)}, at::TensorOptions().dtype(at::kDouble));
  double *data = block.data_ptr<double>();
  std::vector<int64_t> local(size.size(), 0);
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    int64_t count = std::min(kBlock, n - begin);
    for (int64_t e = 0; e < count; ++e) {
      uint64_t g = 0;
      for (size_t d = 0; d < size.size(); ++d)
        g = g * shape[d] + offset[d] + local[d];
      data[e] = value(g);
      for (int64_t d = static_cast<int64_t>(size.size()) - 1; d >= 0; --d) {
        if (++local[d] < size[d])
          break;
        local[d] = 0;
      }
    }
    flat.narrow(0, begin, count).copy_(block.narrow(0, 0, count));
  }
  return out;
}
} // namespace

at::Tensor Context::uniform(const std::vector<int64_t> &shape, const Layout &layout,
                            at::ScalarType dtype, uint64_t seed, uint64_t stream, double low,
                            double high) const {
  return fillBox(*this, shape, layout, dtype, [&](uint64_t i) {
    return low + (high - low) * tdx::rng::uniform01(seed, stream, i);
  });
}

at::Tensor Context::normal(const std::vector<int64_t> &shape, const Layout &layout,
                           at::ScalarType dtype, uint64_t seed, uint64_t stream, double mean,
                           double std) const {
  return fillBox(*this, shape, layout, dtype, [&](uint64_t i) {
    return mean + std * tdx::rng::standardNormal(seed, stream, i);
  });
}

at::Tensor Context::truncNormal(const std::vector<int64_t> &shape, const Layout &layout,
                                at::ScalarType dtype, uint64_t seed, uint64_t stream, double mean,
                                double std, double a, double b) const {
  return fillBox(*this, shape, layout, dtype, [&](uint64_t i) {
    return tdx::rng::truncNormal(seed, stream, i, mean, std, a, b);
  });
}

at::Tensor Context::full(const std::vector<int64_t> &shape, const Layout &layout,
                         at::ScalarType dtype, double value) const {
  std::vector<int64_t> offset, size;
  box(shape, layout, offset, size);
  return at::full(size, value, at::TensorOptions().dtype(dtype));
}

at::Tensor Context::gather(const at::Tensor &local, const std::vector<int64_t> &globalShape,
                           const Layout &layout) {
  at::Tensor mine = local.contiguous();
  DType dtype = mine.scalar_type() == at::kFloat    ? DType::F32
                : mine.scalar_type() == at::kDouble ? DType::F64
                : mine.scalar_type() == at::kLong   ? DType::I64
                : mine.scalar_type() == at::kInt    ? DType::I32
                : mine.scalar_type() == at::kBool   ? DType::Bool
                : mine.scalar_type() == at::kHalf   ? DType::F16
                                                    : DType::BF16;
  std::vector<char> bytes = Mesh::gather(mine.data_ptr(), mine.nbytes(), globalShape, dtype, layout);
  if (rank() != 0)
    return at::Tensor();
  return at::from_blob(bytes.data(), globalShape, mine.options()).clone();
}
