//===- Mesh.cpp - ranks, layouts and MPI groups of model binaries ---------===//

#include "tdx/Runtime/Mesh.h"
#include "tdx/StateFormat/Box.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <unistd.h>

using namespace tdx::rt;

void tdx::rt::checkMpi(int code, const char *what) {
  if (code != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, text, &len);
    throw std::runtime_error(std::string("tdx: ") + what + " failed: " + std::string(text, len));
  }
}

Mesh::Mesh(std::vector<int64_t> meshShape, std::vector<std::string> axes)
    : meshShape_(std::move(meshShape)), axes_(std::move(axes)) {
  world_ = initWorld();
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
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
  // Every rank's host name, for errors that name where a rank runs.
  char name[kHostNameBytes] = {};
  ::gethostname(name, sizeof name - 1);
  std::vector<char> names(kHostNameBytes * static_cast<size_t>(world_));
  MPI_Request request;
  checkMpi(MPI_Iallgather(name, kHostNameBytes, MPI_CHAR, names.data(), kHostNameBytes, MPI_CHAR,
                          MPI_COMM_WORLD, &request),
           "exchange of host names");
  complete(&request, "exchange of host names", {});
  for (int r = 0; r < world_; ++r)
    hosts_.emplace_back(names.data() + kHostNameBytes * static_cast<size_t>(r));
}

int Mesh::initWorld() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // Open MPI's non-blocking all-reduce (libnbc) picks a binomial tree by
    // default; its ring moves each rank's half once each way and measured
    // twice as fast on 44 MB between 2 ranks here (bench_convnet_dp.py's
    // gradients: 23 ms against 43). The user's own setting wins.
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", /*overwrite=*/0);
    int provided;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  return world;
}

void Mesh::finalizeAtExit() {
  static bool registered = (std::atexit([] {
                              int initialized = 0, finalized = 0;
                              MPI_Initialized(&initialized);
                              MPI_Finalized(&finalized);
                              if (initialized && !finalized)
                                MPI_Finalize();
                            }),
                            true);
  (void)registered;
}

std::string Mesh::describeGroup(const std::vector<std::string> &axes) const {
  // The ranks that differ from this one only on `axes`, with their hosts.
  std::string out;
  int listed = 0, members = 0;
  for (int r = 0; r < world_; ++r) {
    std::vector<int64_t> c = coordsOf(r);
    bool member = true;
    for (size_t a = 0; a < axes_.size(); ++a)
      if (c[a] != coords_[a] && !axes.empty() &&
          std::find(axes.begin(), axes.end(), axes_[a]) == axes.end())
        member = false;
    if (!member)
      continue;
    ++members;
    if (listed++ < 8)
      out += (out.empty() ? "" : ", ") + std::to_string(r) + " on " + hostOf(r);
  }
  if (members > listed)
    out += ", ...";
  return "ranks " + out;
}

std::vector<int64_t> Mesh::coordsOf(int rank) const {
  std::vector<int64_t> coords(meshShape_.size());
  for (int64_t r = rank, a = static_cast<int64_t>(meshShape_.size()) - 1; a >= 0; --a) {
    coords[a] = r % meshShape_[a];
    r /= meshShape_[a];
  }
  return coords;
}

Mesh::~Mesh() {
  for (Sending &s : sending_)
    delete static_cast<MPI_Request *>(s.request);
  int finalized = 0;
  MPI_Finalized(&finalized);
  for (auto &[axes, comm] : groups_) {
    if (!finalized)
      MPI_Comm_free(static_cast<MPI_Comm *>(comm));
    delete static_cast<MPI_Comm *>(comm);
  }
}

int64_t Mesh::coord(const std::string &axis) const {
  for (size_t a = 0; a < axes_.size(); ++a)
    if (axes_[a] == axis)
      return coords_[a];
  throw std::runtime_error("tdx: the mesh has no axis '" + axis + "'");
}

Mesh::Group Mesh::group(const std::vector<std::string> &axes) {
  std::vector<bool> inGroup(axes_.size(), false);
  for (const std::string &a : axes) {
    bool found = false;
    for (size_t i = 0; i < axes_.size(); ++i)
      if (axes_[i] == a)
        inGroup[i] = found = true;
    if (!found)
      throw std::runtime_error("tdx: the mesh has no axis '" + a + "'");
  }
  int color = 0, key = 0, size = 1;
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (inGroup[i]) {
      key = key * meshShape_[i] + coords_[i];
      size *= meshShape_[i];
    } else {
      color = color * meshShape_[i] + coords_[i];
    }
  }
  auto it = groups_.find(axes);
  if (it == groups_.end()) {
    auto *comm = new MPI_Comm;
    checkMpi(MPI_Comm_split(MPI_COMM_WORLD, color, key, comm), "MPI_Comm_split");
    it = groups_.emplace(axes, comm).first;
  }
  return {it->second, size, key};
}

int Mesh::groupIndexOf(const std::vector<std::string> &axes,
                       const std::vector<int64_t> &coords) const {
  if (coords.size() != axes.size())
    throw std::runtime_error("tdx: " + std::to_string(coords.size()) + " coordinates for " +
                             std::to_string(axes.size()) + " mesh axes");
  int key = 0;
  for (size_t i = 0; i < axes_.size(); ++i)
    for (size_t j = 0; j < axes.size(); ++j)
      if (axes[j] == axes_[i]) {
        if (coords[j] < 0 || coords[j] >= meshShape_[i])
          throw std::runtime_error("tdx: coordinate " + std::to_string(coords[j]) +
                                   " is outside mesh axis '" + axes_[i] + "'");
        key = key * static_cast<int>(meshShape_[i]) + static_cast<int>(coords[j]);
      }
  return key;
}

std::pair<int, int> Mesh::permutePeers(const std::vector<int64_t> &pairs, int index) {
  int to = -1, from = -1;
  for (size_t i = 0; i + 1 < pairs.size(); i += 2) {
    if (pairs[i] == index)
      to = static_cast<int>(pairs[i + 1]);
    if (pairs[i + 1] == index)
      from = static_cast<int>(pairs[i]);
  }
  return {to, from};
}

void Mesh::complete(void *request, const char *what, const std::vector<std::string> &axes) {
  MPI_Request *r = static_cast<MPI_Request *>(request);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_);
  for (int64_t spins = 0;; ++spins) {
    int done = 0;
    checkMpi(MPI_Test(r, &done, MPI_STATUS_IGNORE), what);
    if (done)
      return;
    if (spins % 1024 == 1023) {
      if (std::chrono::steady_clock::now() > deadline)
        timedOut(what, axes);
      std::this_thread::yield();
    }
  }
}

void Mesh::timedOut(const char *what, const std::vector<std::string> &axes) const {
  std::string group;
  for (const std::string &a : axes)
    group += (group.empty() ? "" : ",") + a;
  throw std::runtime_error(std::string("tdx: ") + what + " over mesh axes {" +
                           (group.empty() ? "all" : group) + "} did not complete in " +
                           std::to_string(static_cast<int64_t>(timeout_)) +
                           " s: a rank of its group (" + describeGroup(axes) +
                           ") is lost, stuck or cut off (raise the limit with " + timeoutHint_ +
                           ")");
}

namespace {
/// MPI guarantees tags up to 32767; that one is tdx.collective_permute's.
int mpiTag(int64_t tag) { return static_cast<int>(tag % Mesh::kPermuteTag); }
} // namespace

void Mesh::sendBytes(std::shared_ptr<const void> keep, const void *data, int64_t bytes,
                     const std::vector<std::string> &axes, int64_t peer, int64_t tag) {
  Group g = group(axes);
  auto *request = new MPI_Request;
  checkMpi(MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, static_cast<int>(peer),
                     mpiTag(tag), *static_cast<MPI_Comm *>(g.comm), request),
           "send");
  addBytes(bytes);
  sending_.push_back({std::move(keep), request, axes});
}

int64_t Mesh::probeBytes(const std::vector<std::string> &axes, int64_t peer, int64_t tag) {
  Group g = group(axes);
  auto start = std::chrono::steady_clock::now();
  auto deadline = start + std::chrono::duration<double>(timeout_);
  MPI_Status status;
  for (int64_t spins = 0;; ++spins) {
    int found = 0;
    checkMpi(MPI_Iprobe(static_cast<int>(peer), mpiTag(tag), *static_cast<MPI_Comm *>(g.comm),
                        &found, &status),
             "recv");
    if (found)
      break;
    if (spins % 1024 == 1023) {
      if (std::chrono::steady_clock::now() > deadline)
        timedOut("recv", axes);
      std::this_thread::yield();
    }
  }
  waited_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int count = 0;
  checkMpi(MPI_Get_count(&status, MPI_BYTE, &count), "recv");
  return count;
}

void Mesh::fillOpenDim(std::vector<int64_t> &shape, int64_t itemBytes, int64_t bytes) {
  auto open = std::find(shape.begin(), shape.end(), -1);
  if (open == shape.end())
    return;
  int64_t rest = 1;
  for (int64_t d : shape)
    rest *= d == -1 ? 1 : d;
  *open = rest ? bytes / itemBytes / rest : 0;
}

void Mesh::completeShape(std::vector<int64_t> &shape, int64_t itemBytes,
                         const std::vector<std::string> &axes, int64_t peer, int64_t tag) {
  if (std::find(shape.begin(), shape.end(), -1) != shape.end())
    fillOpenDim(shape, itemBytes, probeBytes(axes, peer, tag));
}

void Mesh::recvBytes(void *data, int64_t bytes, const std::vector<std::string> &axes,
                     int64_t peer, int64_t tag) {
  Group g = group(axes);
  auto start = std::chrono::steady_clock::now();
  MPI_Request request;
  checkMpi(MPI_Irecv(data, static_cast<int>(bytes), MPI_BYTE, static_cast<int>(peer), mpiTag(tag),
                     *static_cast<MPI_Comm *>(g.comm), &request),
           "recv");
  complete(&request, "recv", axes);
  waited_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void Mesh::finishSends() {
  for (Sending &s : sending_) {
    std::unique_ptr<MPI_Request> request(static_cast<MPI_Request *>(s.request));
    complete(request.get(), "send", s.axes);
  }
  sending_.clear();
}

int64_t Mesh::sumOverWorld(int64_t value) {
  int64_t total = 0;
  MPI_Request request;
  checkMpi(MPI_Iallreduce(&value, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD, &request),
        "all_reduce");
  complete(&request, "all_reduce", {});
  return total;
}

void Mesh::reportSteps(double initMs, double stepMs, int64_t steps, double firstMs) {
  long long total = sumOverWorld(bytesCommunicated());
  if (rank_ == 0) {
    std::printf("tdx: %d ranks: init %.3f ms, step %.3f ms, %lld bytes communicated", world_,
                initMs, stepMs / steps, total / steps);
    if (firstMs >= 0)
      std::printf(" (first step %.3f ms, a warm-up, not in the mean)", firstMs);
    std::printf("\n");
    std::fflush(stdout);
  }
}

void Mesh::finish() {
  barrier();
  MPI_Finalize();
}

int tdx::rt::endRank(const std::exception &error) {
  int initialized = 0, rank = 0;
  MPI_Initialized(&initialized);
  if (initialized)
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string message = error.what();
  if (message.rfind("tdx: ", 0) == 0)
    message = message.substr(5);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::fprintf(stderr, "tdx: rank %d (host %s): %s\n", rank, host, message.c_str());
  std::fflush(stderr);
  if (initialized) {
    // MPI_Abort asks mpirun to end every rank; where it cannot be reached
    // (this host's link is cut) the rank ends on its own all the same.
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(5));
      std::_Exit(1);
    }).detach();
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return 1;
}

std::string Mesh::broadcastFromRoot(std::string bytes) {
  int64_t n = static_cast<int64_t>(bytes.size());
  MPI_Request request;
  checkMpi(MPI_Ibcast(&n, 1, MPI_INT64_T, 0, MPI_COMM_WORLD, &request), "broadcast");
  complete(&request, "broadcast", {});
  bytes.resize(static_cast<size_t>(n));
  if (n > 0) {
    checkMpi(MPI_Ibcast(bytes.data(), static_cast<int>(n), MPI_BYTE, 0, MPI_COMM_WORLD, &request),
             "broadcast");
    complete(&request, "broadcast", {});
  }
  return bytes;
}

void Mesh::barrier() {
  MPI_Request request;
  checkMpi(MPI_Ibarrier(MPI_COMM_WORLD, &request), "barrier");
  complete(&request, "barrier", {});
}

void Mesh::box(const std::vector<int64_t> &globalShape, const Layout &layout,
                  std::vector<int64_t> &offset, std::vector<int64_t> &size) const {
  boxAt(coords_, globalShape, layout, offset, size);
}

std::vector<int64_t> Mesh::localShape(const std::vector<int64_t> &globalShape,
                                      const Layout &layout) const {
  std::vector<int64_t> offset, size;
  box(globalShape, layout, offset, size);
  return size;
}

void Mesh::boxAt(const std::vector<int64_t> &coords, const std::vector<int64_t> &globalShape,
                 const Layout &layout, std::vector<int64_t> &offset,
                 std::vector<int64_t> &size) const {
  boxOf(meshShape_, coords, globalShape, layout, offset, size);
}

namespace {
template <class T> void addInto(char *dst, const char *src, int64_t n) {
  T *d = reinterpret_cast<T *>(dst);
  const T *s = reinterpret_cast<const T *>(src);
  for (int64_t i = 0; i < n; ++i)
    d[i] += s[i];
}
} // namespace

std::vector<char> Mesh::gather(const void *local, int64_t localBytes,
                               const std::vector<int64_t> &globalShape, DType dtype,
                               const Layout &layout) {
  std::vector<int64_t> counts(world_);
  MPI_Request request;
  checkMpi(MPI_Igather(&localBytes, 1, MPI_INT64_T, counts.data(), 1, MPI_INT64_T, 0,
                       MPI_COMM_WORLD, &request),
           "gather");
  complete(&request, "gather", {});
  std::vector<int> recvCounts(world_), displs(world_);
  int64_t total = 0;
  for (int r = 0; r < world_; ++r) {
    recvCounts[r] = static_cast<int>(counts[r]);
    displs[r] = static_cast<int>(total);
    total += counts[r];
  }
  std::vector<char> buffer(rank_ == 0 ? total : 0);
  checkMpi(MPI_Igatherv(local, static_cast<int>(localBytes), MPI_BYTE, buffer.data(),
                        recvCounts.data(), displs.data(), MPI_BYTE, 0, MPI_COMM_WORLD, &request),
           "gather");
  complete(&request, "gather", {});
  if (rank_ != 0)
    return {};
  int64_t item = dtypeSize(dtype), elements = 1;
  for (int64_t d : globalShape)
    elements *= d;
  std::vector<char> out(elements * item, 0);
  bool partial = false;
  for (const Placement &p : layout) {
    partial |= p.kind == 'P';
    // The compiler reduces every other kind before a result leaves the
    // program (tdx-propagate-sharding); adding boxes is only right for sums.
    if (p.kind == 'P' && p.value != Reduce::Sum)
      throw std::runtime_error("tdx: gather: an output is Partial with a reduction other than "
                               "sum; place the function's result Replicate or Partial(sum)");
  }
  if (partial && (dtype == DType::F16 || dtype == DType::BF16 || dtype == DType::Bool))
    throw std::runtime_error(std::string("tdx: cannot sum partial ") + dtypeName(dtype) +
                             " outputs on the host; return them reduced");
  for (int r = 0; r < world_; ++r) {
    // Replicated copies beyond coordinate 0 hold nothing new; a pipeline
    // stage's state is current on its stage's ranks only.
    std::vector<int64_t> coords = coordsOf(r);
    bool duplicate = false;
    for (size_t a = 0; a < layout.size(); ++a)
      duplicate |= (layout[a].kind == 'R' && coords[a] != 0) ||
                   (layout[a].kind == 'T' && coords[a] != layout[a].value);
    if (duplicate)
      continue;
    std::vector<int64_t> offset, size;
    boxAt(coords, globalShape, layout, offset, size);
    int64_t boxBytes = item;
    for (int64_t s : size)
      boxBytes *= s;
    if (recvCounts[r] != boxBytes)
      throw std::runtime_error("tdx: gather: rank " + std::to_string(r) + " holds " +
                               std::to_string(recvCounts[r]) + " bytes but its box of the "
                               "global tensor under its layout has " + std::to_string(boxBytes) +
                               " (program and layout disagree)");
    const char *part = buffer.data() + displs[r];
    forEachBoxRun(globalShape, offset, size, [&](int64_t global, int64_t local, int64_t run) {
      char *dst = out.data() + global * item;
      const char *src = part + local * item;
      if (!partial) {
        std::memcpy(dst, src, run * item);
        return;
      }
      switch (dtype) {
      case DType::F32: addInto<float>(dst, src, run); break;
      case DType::F64: addInto<double>(dst, src, run); break;
      case DType::I64: addInto<int64_t>(dst, src, run); break;
      case DType::I32: addInto<int32_t>(dst, src, run); break;
      default:
        throw std::runtime_error(std::string("tdx: cannot sum partial ") + dtypeName(dtype) +
                                 " outputs on the host; return them reduced");
      }
    });
  }
  return out;
}
