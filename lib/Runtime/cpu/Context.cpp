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

void check(int code, const char *what) {
  if (code != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, text, &len);
    throw std::runtime_error(std::string("tdx: ") + what + " failed: " + std::string(text, len));
  }
}

std::pair<int64_t, int64_t> chunkRange(int64_t n, int64_t k, int64_t c) {
  int64_t size = k ? (n + k - 1) / k : n;
  int64_t start = std::min(n, c * size);
  return {start, std::min(n, start + size)};
}

} // namespace

void Context::complete(void *request, const char *what, const std::vector<std::string> &axes) {
  MPI_Request *r = static_cast<MPI_Request *>(request);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_);
  for (int64_t spins = 0;; ++spins) {
    int done = 0;
    check(MPI_Test(r, &done, MPI_STATUS_IGNORE), what);
    if (done)
      return;
    if (spins % 1024 == 1023) {
      if (std::chrono::steady_clock::now() > deadline) {
        std::string group;
        for (const std::string &a : axes)
          group += (group.empty() ? "" : ",") + a;
        throw std::runtime_error(
            std::string("tdx: ") + what + " over mesh axes {" + (group.empty() ? "all" : group) +
            "} did not complete in " + std::to_string(static_cast<int64_t>(timeout_)) +
            " s: a rank of its group is lost or stuck (raise the limit with "
            "--collective-timeout S)");
      }
      std::this_thread::yield();
    }
  }
}

Layout tdx::rt::parseLayout(const std::string &text) {
  Layout out;
  size_t i = 0;
  while ((i = text.find_first_of("SRP", i)) != std::string::npos) {
    if (text.compare(i, 6, "Shard(") == 0) {
      out.push_back({'S', std::stoll(text.substr(i + 6))});
      i += 6;
    } else if (text.compare(i, 9, "Replicate") == 0) {
      out.push_back({'R', 0});
      i += 9;
    } else if (text.compare(i, 7, "Partial") == 0) {
      std::string rest = text.substr(i + 7, 6);
      int64_t r = rest.rfind("(max", 0) == 0 ? Max
                  : rest.rfind("(min", 0) == 0 ? Min
                  : rest.rfind("(avg", 0) == 0 ? Avg
                                               : Sum;
      out.push_back({'P', r});
      i += 7;
    } else {
      ++i;
    }
  }
  return out;
}

Context::Context(std::vector<int64_t> meshShape, std::vector<std::string> axes, uint64_t seed,
                 bool verbose)
    : meshShape_(std::move(meshShape)), axes_(std::move(axes)), seed_(seed), verbose_(verbose) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_);
  int64_t ranks = std::accumulate(meshShape_.begin(), meshShape_.end(), int64_t{1},
                                  std::multiplies<int64_t>());
  if (ranks != world_) {
    std::ostringstream os;
    os << "tdx: this program runs on a mesh of " << ranks << " ranks (";
    for (size_t a = 0; a < meshShape_.size(); ++a)
      os << (a ? " x " : "") << axes_[a] << "=" << meshShape_[a];
    os << ") but " << world_ << " were started; run it with mpirun -np " << ranks;
    throw std::runtime_error(os.str());
  }
  coords_ = coordsOf(rank_);
}

std::vector<int64_t> Context::coordsOf(int rank) const {
  std::vector<int64_t> coords(meshShape_.size());
  for (int64_t r = rank, a = static_cast<int64_t>(meshShape_.size()) - 1; a >= 0; --a) {
    coords[a] = r % meshShape_[a];
    r /= meshShape_[a];
  }
  return coords;
}

Context::~Context() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  for (auto &[axes, comm] : groups_) {
    if (!finalized)
      MPI_Comm_free(static_cast<MPI_Comm *>(comm));
    delete static_cast<MPI_Comm *>(comm);
  }
}

int64_t Context::coord(const std::string &axis) const {
  for (size_t a = 0; a < axes_.size(); ++a)
    if (axes_[a] == axis)
      return coords_[a];
  throw std::runtime_error("tdx: the mesh has no axis '" + axis + "'");
}

void *Context::group(const std::vector<std::string> &axes, int &size, int &index) {
  std::vector<bool> inGroup(axes_.size(), false);
  for (const std::string &a : axes) {
    bool found = false;
    for (size_t i = 0; i < axes_.size(); ++i)
      if (axes_[i] == a)
        inGroup[i] = found = true;
    if (!found)
      throw std::runtime_error("tdx: the mesh has no axis '" + a + "'");
  }
  int color = 0, key = 0;
  size = 1;
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (inGroup[i]) {
      key = key * meshShape_[i] + coords_[i];
      size *= meshShape_[i];
    } else {
      color = color * meshShape_[i] + coords_[i];
    }
  }
  index = key;
  auto it = groups_.find(axes);
  if (it == groups_.end()) {
    auto *comm = new MPI_Comm;
    check(MPI_Comm_split(MPI_COMM_WORLD, color, key, comm), "MPI_Comm_split");
    it = groups_.emplace(axes, comm).first;
  }
  return it->second;
}

at::Tensor Context::allReduce(const at::Tensor &x, const std::vector<std::string> &axes,
                              int64_t reduce) {
  int size, index;
  MPI_Comm comm = *static_cast<MPI_Comm *>(group(axes, size, index));
  at::Tensor out = x.contiguous().clone();
  bytes_ += out.nbytes();
  MPI_Request request;
  check(MPI_Iallreduce(MPI_IN_PLACE, out.data_ptr(), static_cast<int>(out.numel()),
                       mpiType(out.scalar_type()), mpiOp(reduce), comm, &request),
        "all_reduce");
  complete(&request, "all_reduce", axes);
  if (reduce == Avg)
    out.div_(size);
  return out;
}

at::Tensor Context::allGather(const at::Tensor &x, const std::vector<std::string> &axes,
                              int64_t dim) {
  int size, index;
  MPI_Comm comm = *static_cast<MPI_Comm *>(group(axes, size, index));
  // Pieces may differ along `dim` (torch.chunk): gather the sizes first.
  at::Tensor front = x.transpose(0, dim).contiguous();
  int64_t mine = front.size(0);
  std::vector<int64_t> sizes(size);
  MPI_Request request;
  check(MPI_Iallgather(&mine, 1, MPI_INT64_T, sizes.data(), 1, MPI_INT64_T, comm, &request),
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
  bytes_ += front.nbytes();
  check(MPI_Iallgatherv(front.data_ptr(), static_cast<int>(front.nbytes()), MPI_BYTE,
                        gathered.data_ptr(), counts.data(), displs.data(), MPI_BYTE, comm,
                        &request),
        "all_gather");
  complete(&request, "all_gather", axes);
  return gathered.transpose(0, dim).contiguous();
}

int64_t Context::sumOverWorld(int64_t value) {
  int64_t total = 0;
  MPI_Request request;
  check(MPI_Iallreduce(&value, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD, &request),
        "all_reduce");
  complete(&request, "all_reduce", {});
  return total;
}

void Context::barrier() {
  MPI_Request request;
  check(MPI_Ibarrier(MPI_COMM_WORLD, &request), "barrier");
  complete(&request, "barrier", {});
}

at::Tensor Context::chunk(const at::Tensor &x, int64_t chunks, int64_t index, int64_t dim) {
  auto [start, end] = chunkRange(x.size(dim), chunks, index);
  return x.narrow(dim, start, end - start).contiguous();
}

at::Tensor Context::reduceScatter(const at::Tensor &x, const std::vector<std::string> &axes,
                                  int64_t reduce, int64_t dim) {
  int size, index;
  group(axes, size, index);
  return chunk(allReduce(x, axes, reduce), size, index, dim);
}

at::Tensor Context::allToAll(const at::Tensor &x, const std::vector<std::string> &axes,
                             int64_t split, int64_t concat) {
  int size, index;
  MPI_Comm comm = *static_cast<MPI_Comm *>(group(axes, size, index));
  // Everyone's shape, to know the pieces received.
  std::vector<int64_t> shape = x.sizes().vec(), shapes(size * shape.size());
  MPI_Request request;
  check(MPI_Iallgather(shape.data(), static_cast<int>(shape.size()), MPI_INT64_T, shapes.data(),
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
  bytes_ += sendBuffer.nbytes();
  check(MPI_Ialltoallv(sendBuffer.data_ptr(), sendCounts.data(), sendDispls.data(), MPI_BYTE,
                       recvBuffer.data_ptr(), recvCounts.data(), recvDispls.data(), MPI_BYTE,
                       comm, &request),
        "all_to_all");
  complete(&request, "all_to_all", axes);
  for (int r = 0; r < size; ++r)
    std::memcpy(received[r].data_ptr(),
                static_cast<uint8_t *>(recvBuffer.data_ptr()) + recvDispls[r], recvCounts[r]);
  return at::cat(received, concat);
}

void Context::box(const std::vector<int64_t> &globalShape, const Layout &layout,
                  std::vector<int64_t> &offset, std::vector<int64_t> &size) const {
  boxAt(coords_, globalShape, layout, offset, size);
}

void Context::boxAt(const std::vector<int64_t> &coords, const std::vector<int64_t> &globalShape,
                    const Layout &layout, std::vector<int64_t> &offset,
                    std::vector<int64_t> &size) const {
  offset.assign(globalShape.size(), 0);
  size = globalShape;
  for (size_t a = 0; a < layout.size() && a < meshShape_.size(); ++a) {
    if (layout[a].kind != 'S')
      continue;
    int64_t d = layout[a].value;
    auto [start, end] = chunkRange(size[d], meshShape_[a], coords[a]);
    offset[d] += start;
    size[d] = end - start;
  }
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
  int64_t nbytes = mine.nbytes();
  std::vector<int64_t> counts(world_);
  MPI_Request request;
  check(MPI_Igather(&nbytes, 1, MPI_INT64_T, counts.data(), 1, MPI_INT64_T, 0, MPI_COMM_WORLD,
                    &request),
        "gather");
  complete(&request, "gather", {});
  std::vector<int> recvCounts(world_), displs(world_);
  int64_t total = 0;
  for (int r = 0; r < world_; ++r) {
    recvCounts[r] = static_cast<int>(counts[r]);
    displs[r] = static_cast<int>(total);
    total += counts[r];
  }
  at::Tensor buffer = at::empty({rank_ == 0 ? total : 0}, at::TensorOptions().dtype(at::kByte));
  check(MPI_Igatherv(mine.data_ptr(), static_cast<int>(nbytes), MPI_BYTE, buffer.data_ptr(),
                     recvCounts.data(), displs.data(), MPI_BYTE, 0, MPI_COMM_WORLD, &request),
        "gather");
  complete(&request, "gather", {});
  if (rank_ != 0)
    return at::Tensor();
  at::Tensor out = at::zeros(globalShape, mine.options());
  for (int r = 0; r < world_; ++r) {
    // Replicated copies beyond coordinate 0 hold nothing new.
    std::vector<int64_t> coords = coordsOf(r);
    bool duplicate = false;
    for (size_t a = 0; a < layout.size(); ++a)
      duplicate |= layout[a].kind == 'R' && coords[a] != 0;
    std::vector<int64_t> offset, size;
    boxAt(coords, globalShape, layout, offset, size);
    if (duplicate)
      continue;
    at::Tensor part = at::empty(size, mine.options());
    if (recvCounts[r] != static_cast<int64_t>(part.nbytes()))
      throw std::runtime_error("gather: rank " + std::to_string(r) + " holds " +
                               std::to_string(recvCounts[r]) + " bytes but its box of the "
                               "global tensor under its layout has " +
                               std::to_string(part.nbytes()) + " (program and layout disagree)");
    std::memcpy(part.data_ptr(), static_cast<uint8_t *>(buffer.data_ptr()) + displs[r],
                recvCounts[r]);
    at::Tensor view = out;
    for (size_t d = 0; d < offset.size(); ++d)
      view = view.narrow(d, offset[d], size[d]);
    view.add_(part);
  }
  return out;
}
