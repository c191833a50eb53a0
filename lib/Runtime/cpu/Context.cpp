//===- Context.cpp - collectives on MPI, sharded init, gathering ----------===//

#include "tdx/Runtime/Runtime.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <memory>
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

/// A collective between start and wait: its buffer (the result), the input
/// MPI reads until then (a reduce_scatter's or all_gather's), its request,
/// and what wait does to the buffer (Avg divides; a reduce_scatter's or
/// all_gather's has its dim in front: wait moves it back).
struct Context::InFlight {
  MPI_Request request = MPI_REQUEST_NULL;
  /// A permutation's send (its receive is `request`).
  MPI_Request send = MPI_REQUEST_NULL;
  at::Tensor buffer, input;
  /// A ragged all-to-all's counts and displacements, alive until it ends.
  std::vector<int> counts;
  std::vector<std::string> axes;
  const char *what;
  int64_t reduce, size, index, dim = -1;
  bool done = false;
};

Context::Context(std::vector<int64_t> meshShape, std::vector<std::string> axes, uint64_t seed,
                 bool verbose)
    : Mesh(std::move(meshShape), std::move(axes)), seed_(seed), verbose_(verbose) {}

Context::~Context() = default;

at::Tensor Context::allReduce(const at::Tensor &x, const std::vector<std::string> &axes,
                              int64_t reduce) {
  return wait(startAllReduce(x, axes, reduce));
}

/// A collective to start: what it is, over which group, its reduction.
std::unique_ptr<Context::InFlight> Context::inFlight(const char *what,
                                                     const std::vector<std::string> &axes,
                                                     int64_t reduce, void **comm) {
  auto [group_, size, index] = group(axes);
  *comm = group_;
  auto f = std::make_unique<InFlight>();
  f->axes = axes;
  f->what = what;
  f->reduce = reduce;
  f->size = size;
  f->index = index;
  return f;
}

/// Keeps a started collective until wait() (--no-overlap: completed here).
int64_t Context::track(std::unique_ptr<InFlight> f) {
  if (!overlap()) {
    complete(&f->request, f->what, f->axes);
    if (f->send != MPI_REQUEST_NULL)
      complete(&f->send, f->what, f->axes);
    f->done = true;
  }
  inFlight_.push_back(std::move(f));
  return static_cast<int64_t>(inFlight_.size()) - 1;
}

int64_t Context::startAllReduce(const at::Tensor &x, const std::vector<std::string> &axes,
                                int64_t reduce) {
  Profile::Scope timed(&Profile::collectives);
  void *comm;
  std::unique_ptr<InFlight> f = inFlight("all_reduce", axes, reduce, &comm);
  f->buffer = x.contiguous().clone();
  addBytes(f->buffer.nbytes());
  checkMpi(MPI_Iallreduce(MPI_IN_PLACE, f->buffer.data_ptr(), static_cast<int>(f->buffer.numel()),
                          mpiType(f->buffer.scalar_type()), mpiOp(reduce),
                          *static_cast<MPI_Comm *>(comm), &f->request),
           "all_reduce");
  return track(std::move(f));
}

int64_t Context::startReduceScatter(const at::Tensor &x, const std::vector<std::string> &axes,
                                    int64_t reduce, int64_t dim) {
  Profile::Scope timed(&Profile::collectives);
  void *comm;
  std::unique_ptr<InFlight> f = inFlight("reduce_scatter", axes, reduce, &comm);
  f->dim = dim = at::maybe_wrap_dim(dim, x.dim());
  // Each rank's torch.chunk of `dim` is a contiguous range of rows once
  // `dim` is in front; this rank's lands in the result (a new tensor, the
  // step plan's slot for it), and MPI reads the input until wait().
  f->input = (dim == 0 ? x : x.transpose(0, dim)).contiguous();
  int64_t rows = f->input.size(0), row = rows ? f->input.numel() / rows : 0;
  std::vector<int> counts(f->size);
  for (int r = 0; r < f->size; ++r) {
    auto [start, end] = chunkRange(rows, f->size, r);
    counts[r] = static_cast<int>((end - start) * row);
  }
  std::vector<int64_t> shape = f->input.sizes().vec();
  auto [start, end] = chunkRange(rows, f->size, f->index);
  shape[0] = end - start;
  f->buffer = at::empty(shape, f->input.options());
  addBytes(f->input.nbytes());
  checkMpi(MPI_Ireduce_scatter(f->input.data_ptr(), f->buffer.data_ptr(), counts.data(),
                               mpiType(f->input.scalar_type()), mpiOp(reduce),
                               *static_cast<MPI_Comm *>(comm), &f->request),
           "reduce_scatter");
  return track(std::move(f));
}

void Context::send(const at::Tensor &x, const std::vector<std::string> &axes, int64_t peer,
                   int64_t tag, bool /*sized*/) {
  Profile::Scope timed(&Profile::collectives);
  auto keep = std::make_shared<at::Tensor>(x.contiguous().clone());
  const void *data = keep->data_ptr();
  sendBytes(std::move(keep), data, static_cast<int64_t>(x.nbytes()), axes, peer, tag);
}

at::Tensor Context::recv(std::vector<int64_t> shape, at::ScalarType dtype,
                         const std::vector<std::string> &axes, int64_t peer, int64_t tag) {
  Profile::Scope timed(&Profile::collectives);
  completeShape(shape, static_cast<int64_t>(c10::elementSize(dtype)), axes, peer, tag);
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(dtype));
  recvBytes(out.data_ptr(), static_cast<int64_t>(out.nbytes()), axes, peer, tag);
  return out;
}

void Context::progress() {
  Profile::Scope timed(&Profile::collectives);
  // One MPI_Testsome drives MPI's progress engine once for all of them.
  std::vector<MPI_Request> requests;
  std::vector<InFlight *> owners;
  for (std::unique_ptr<InFlight> &f : inFlight_)
    if (f && !f->done) {
      requests.push_back(f->request);
      owners.push_back(f.get());
    }
  if (requests.empty())
    return;
  int count = 0;
  std::vector<int> finished(requests.size());
  checkMpi(MPI_Testsome(static_cast<int>(requests.size()), requests.data(), &count,
                        finished.data(), MPI_STATUSES_IGNORE),
           owners.front()->what);
  for (int i = 0; i < count && count != MPI_UNDEFINED; ++i) {
    owners[finished[i]]->request = MPI_REQUEST_NULL;
    owners[finished[i]]->done = true;
  }
}

at::Tensor Context::wait(int64_t handle) {
  Profile::Scope timed(&Profile::collectives);
  if (handle < 0 || handle >= static_cast<int64_t>(inFlight_.size()) || !inFlight_[handle])
    throw std::logic_error("tdx: wait on a collective that was not started or was waited for");
  std::unique_ptr<InFlight> f = std::move(inFlight_[handle]);
  if (!f->done)
    complete(&f->request, f->what, f->axes);
  if (f->send != MPI_REQUEST_NULL)
    complete(&f->send, f->what, f->axes);
  // Handles are dense per step: the table empties when its last one is waited.
  if (std::all_of(inFlight_.begin(), inFlight_.end(), [](auto &p) { return !p; }))
    inFlight_.clear();
  if (f->reduce == Avg)
    f->buffer.div_(f->size);
  if (f->dim > 0)
    return f->buffer.transpose(0, f->dim).contiguous();
  return std::move(f->buffer);
}

at::Tensor Context::allGather(const at::Tensor &x, const std::vector<std::string> &axes,
                              int64_t dim) {
  return wait(startAllGather(x, axes, dim, -1));
}

int64_t Context::startAllGather(const at::Tensor &x, const std::vector<std::string> &axes,
                                int64_t dim, int64_t total) {
  Profile::Scope timed(&Profile::collectives);
  void *group_;
  std::unique_ptr<InFlight> f = inFlight("all_gather", axes, Sum, &group_);
  MPI_Comm comm = *static_cast<MPI_Comm *>(group_);
  f->dim = dim = at::maybe_wrap_dim(dim, x.dim());
  // Rows of `dim` in front; MPI reads them until wait().
  f->input = (dim == 0 ? x : x.transpose(0, dim)).contiguous();
  int64_t mine = f->input.size(0);
  std::vector<int64_t> sizes(f->size);
  if (total >= 0) {
    // Every rank's torch.chunk of the gathered size.
    for (int r = 0; r < f->size; ++r) {
      auto [start, end] = chunkRange(total, f->size, r);
      sizes[r] = end - start;
    }
  } else {
    // Not known to the program (uneven pieces): exchange them first.
    MPI_Request request;
    checkMpi(MPI_Iallgather(&mine, 1, MPI_INT64_T, sizes.data(), 1, MPI_INT64_T, comm, &request),
             "all_gather");
    complete(&request, "all_gather", axes);
  }
  if (sizes[f->index] != mine)
    throw std::runtime_error("tdx: all_gather over " + std::to_string(f->size) +
                             " ranks: this rank holds " + std::to_string(mine) +
                             " rows of dim " + std::to_string(dim) + " where the program says " +
                             std::to_string(sizes[f->index]));
  std::vector<int64_t> shape = f->input.sizes().vec();
  shape[0] = 1;
  int64_t row = f->input.element_size(), rows = 0;
  for (size_t d = 1; d < shape.size(); ++d)
    row *= shape[d];
  std::vector<int> counts(f->size), displs(f->size);
  for (int r = 0; r < f->size; ++r) {
    counts[r] = static_cast<int>(sizes[r] * row);
    displs[r] = static_cast<int>(rows * row);
    rows += sizes[r];
  }
  shape[0] = rows;
  f->buffer = at::empty(shape, f->input.options());
  addBytes(f->input.nbytes());
  checkMpi(MPI_Iallgatherv(f->input.data_ptr(), static_cast<int>(f->input.nbytes()), MPI_BYTE,
                           f->buffer.data_ptr(), counts.data(), displs.data(), MPI_BYTE, comm,
                           &f->request),
           "all_gather");
  return track(std::move(f));
}

at::Tensor Context::chunk(const at::Tensor &x, int64_t chunks, int64_t index, int64_t dim) {
  auto [start, end] = chunkRange(x.size(dim), chunks, index);
  // A new tensor even where the piece is contiguous: a view would keep all
  // of `x` alive as long as the piece, which the step's plan does not expect.
  return x.narrow(dim, start, end - start).clone(at::MemoryFormat::Contiguous);
}

at::Tensor Context::reduceScatter(const at::Tensor &x, const std::vector<std::string> &axes,
                                  int64_t reduce, int64_t dim) {
  return wait(startReduceScatter(x, axes, reduce, dim));
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

at::Tensor Context::raggedAllToAll(const at::Tensor &x, const at::Tensor &inputOffsets,
                                   const at::Tensor &sendSizes, const at::Tensor &outputOffsets,
                                   const at::Tensor &recvSizes, int64_t rows,
                                   const std::vector<std::string> &axes,
                                   const std::string &site) {
  return wait(startRaggedAllToAll(x, inputOffsets, sendSizes, outputOffsets, recvSizes, rows, axes,
                                  site));
}

int64_t Context::startRaggedAllToAll(const at::Tensor &x, const at::Tensor &inputOffsets,
                                     const at::Tensor &sendSizes,
                                     const at::Tensor &outputOffsets,
                                     const at::Tensor &recvSizes, int64_t rows,
                                     const std::vector<std::string> &axes,
                                     const std::string &site) {
  Profile::Scope timed(&Profile::collectives);
  Group g = group(axes);
  MPI_Comm comm = *static_cast<MPI_Comm *>(g.comm);
  const int size = g.size, index = g.index;
  auto fail = [&](const std::string &why) {
    return std::runtime_error("tdx: ragged_all_to_all at " + site + " (rank " +
                              std::to_string(index) + " of its group): " + why);
  };
  auto entries = [&](const at::Tensor &t, const char *name) {
    at::Tensor c = t.to(at::kLong).contiguous();
    if (c.numel() != size)
      throw fail(std::string(name) + " has " + std::to_string(c.numel()) + " entries for " +
                 std::to_string(size) + " ranks");
    return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + size);
  };
  std::vector<int64_t> inOff = entries(inputOffsets, "input_offsets"),
                       send = entries(sendSizes, "send_sizes"),
                       outOff = entries(outputOffsets, "output_offsets"),
                       recv = entries(recvSizes, "recv_sizes");
  at::Tensor in = x.contiguous();
  std::vector<int64_t> shape = in.sizes().vec();
  int64_t rowBytes = static_cast<int64_t>(in.element_size());
  for (size_t d = 1; d < shape.size(); ++d)
    rowBytes *= shape[d];
  const int64_t inRows = shape[0];
  shape[0] = rows;
  // Each rank's ranges inside its buffers, the received ones disjoint.
  std::vector<std::pair<int64_t, int64_t>> landed;
  for (int r = 0; r < size; ++r) {
    if (send[r] < 0 || inOff[r] < 0 || inOff[r] + send[r] > inRows)
      throw fail("sends rows [" + std::to_string(inOff[r]) + ", " +
                 std::to_string(inOff[r] + send[r]) + ") to rank " + std::to_string(r) +
                 ", outside its " + std::to_string(inRows) + " input rows");
    if (recv[r] < 0 || outOff[r] < 0 || outOff[r] + recv[r] > rows)
      throw fail("receives rank " + std::to_string(r) + "'s rows at [" +
                 std::to_string(outOff[r]) + ", " + std::to_string(outOff[r] + recv[r]) +
                 "), outside its " + std::to_string(rows) + " output rows");
    if (recv[r])
      landed.push_back({outOff[r], outOff[r] + recv[r]});
  }
  std::sort(landed.begin(), landed.end());
  for (size_t i = 1; i < landed.size(); ++i)
    if (landed[i].first < landed[i - 1].second)
      throw fail("two ranks' rows land on output rows [" + std::to_string(landed[i].first) +
                 ", " + std::to_string(landed[i - 1].second) + ")");
  // What each sender says it sends this rank, against recv_sizes.
  std::vector<int64_t> told(size);
  MPI_Request request;
  checkMpi(MPI_Ialltoall(send.data(), 1, MPI_INT64_T, told.data(), 1, MPI_INT64_T, comm,
                         &request),
           "ragged_all_to_all");
  complete(&request, "ragged_all_to_all", axes);
  for (int r = 0; r < size; ++r)
    if (told[r] != recv[r])
      throw fail("rank " + std::to_string(r) + " sends it " + std::to_string(told[r]) +
                 " rows, recv_sizes says " + std::to_string(recv[r]) +
                 " (exchange the send sizes with an all_to_all first)");
  void *comm_;
  std::unique_ptr<InFlight> f = inFlight("ragged_all_to_all", axes, Sum, &comm_);
  f->counts.assign(4 * static_cast<size_t>(size), 0);
  int *sendCounts = f->counts.data(), *sendDispls = sendCounts + size,
      *recvCounts = sendDispls + size, *recvDispls = recvCounts + size;
  int64_t sent = 0;
  for (int r = 0; r < size; ++r) {
    for (int64_t v : {send[r] * rowBytes, inOff[r] * rowBytes, recv[r] * rowBytes,
                      outOff[r] * rowBytes})
      if (v > INT_MAX)
        throw fail(std::to_string(v) + " bytes: over MPI's 2 GiB count");
    sendCounts[r] = static_cast<int>(send[r] * rowBytes);
    sendDispls[r] = static_cast<int>(inOff[r] * rowBytes);
    recvCounts[r] = static_cast<int>(recv[r] * rowBytes);
    recvDispls[r] = static_cast<int>(outOff[r] * rowBytes);
    sent += send[r] * rowBytes;
  }
  f->input = in;
  f->buffer = at::zeros(shape, in.options());
  addBytes(sent);
  checkMpi(MPI_Ialltoallv(in.data_ptr(), sendCounts, sendDispls, MPI_BYTE, f->buffer.data_ptr(),
                          recvCounts, recvDispls, MPI_BYTE, comm, &f->request),
           "ragged_all_to_all");
  return track(std::move(f));
}

at::Tensor Context::broadcast(const at::Tensor &x, const std::vector<std::string> &axes,
                              const std::vector<int64_t> &root) {
  Profile::Scope timed(&Profile::collectives);
  Group g = group(axes);
  int from = groupIndexOf(axes, root);
  at::Tensor out = x.contiguous().clone();
  if (out.nbytes() > static_cast<size_t>(INT_MAX))
    throw std::runtime_error("tdx: broadcast of " + std::to_string(out.nbytes()) +
                             " bytes: over MPI's 2 GiB count");
  if (g.index == from)
    addBytes(static_cast<int64_t>(out.nbytes()) * (g.size - 1));
  MPI_Request request;
  checkMpi(MPI_Ibcast(out.data_ptr(), static_cast<int>(out.nbytes()), MPI_BYTE, from,
                      *static_cast<MPI_Comm *>(g.comm), &request),
           "broadcast");
  complete(&request, "broadcast", axes);
  return out;
}

at::Tensor Context::permute(const at::Tensor &x, const std::vector<std::string> &axes,
                            const std::vector<int64_t> &pairs) {
  return wait(startPermute(x, axes, pairs));
}

int64_t Context::startPermute(const at::Tensor &x, const std::vector<std::string> &axes,
                              const std::vector<int64_t> &pairs) {
  Profile::Scope timed(&Profile::collectives);
  void *group_;
  std::unique_ptr<InFlight> f = inFlight("collective_permute", axes, Sum, &group_);
  MPI_Comm comm = *static_cast<MPI_Comm *>(group_);
  auto [to, from] = permutePeers(pairs, static_cast<int>(f->index));
  f->input = x.contiguous();
  f->buffer = from >= 0 ? at::empty_like(f->input) : at::zeros_like(f->input);
  if (f->input.nbytes() > static_cast<size_t>(INT_MAX))
    throw std::runtime_error("tdx: collective_permute of " + std::to_string(f->input.nbytes()) +
                             " bytes: over MPI's 2 GiB count");
  const int bytes = static_cast<int>(f->input.nbytes());
  if (from >= 0)
    checkMpi(MPI_Irecv(f->buffer.data_ptr(), bytes, MPI_BYTE, from, kPermuteTag, comm,
                       &f->request),
             "collective_permute");
  if (to >= 0) {
    checkMpi(MPI_Isend(f->input.data_ptr(), bytes, MPI_BYTE, to, kPermuteTag, comm, &f->send),
             "collective_permute");
    addBytes(bytes);
  }
  return track(std::move(f));
}

at::Tensor Context::init(const InitProgram &program, const Layout &layout) const {
  const InitProgram::Node &r = program.result();
  std::vector<int64_t> offset, size;
  box(r.shape, layout, offset, size);
  at::Tensor out = at::empty(size, at::TensorOptions().dtype(scalarTypeOf(r.dtype)));
  withSeed(program, seed()).fillBox(offset, size, out.data_ptr());
  return out;
}

at::Tensor Context::gather(const at::Tensor &local, const std::vector<int64_t> &globalShape,
                           const Layout &layout) {
  at::Tensor mine = local.contiguous();
  std::vector<char> bytes = Mesh::gather(mine.data_ptr(), mine.nbytes(), globalShape,
                                         dtypeOf(mine.scalar_type()), layout);
  if (rank() != 0)
    return at::Tensor();
  return at::from_blob(bytes.data(), globalShape, mine.options()).clone();
}
