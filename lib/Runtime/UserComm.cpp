//===- UserComm.cpp - the communication users write: tdx.mpi's C ABI ------===//
//
// python/tdx/mpi.py (mpi4torch's API) runs each call of an eager SPMD job
// through these functions, on the job's MPI and the runtime's Mesh: its
// groups over mesh axes, its collective deadline, and its errors that name
// the ranks of a group and their hosts. They move dense buffers of one
// element type; shapes, autograd and the checks that every rank called the
// same thing live in Python.
//
// A communicator is a group of the mesh over some of its axes, with four
// MPI communicators: collectives and forward messages, their headers, and
// the same two for the messages autograd's backward sends, so that no tag a
// user picks can match a message of the other kind.
//
// Every function returns 0, or nonzero with tdx_comm_error() saying why (a
// timeout names the group and the peer); none waits past the deadline.
//
//===----------------------------------------------------------------------===//

#include "tdx/Runtime/Mesh.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstdint>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

using namespace tdx::rt;

namespace {

std::string &lastError() {
  static std::string error;
  return error;
}

template <class F> int guarded(F f) {
  try {
    f();
    return 0;
  } catch (const std::exception &e) {
    lastError() = e.what();
    return 1;
  }
}

/// tdx.mpi's element types (python/tdx/mpi.py's _DTYPES).
MPI_Datatype mpiType(int dtype) {
  switch (dtype) {
  case 0: return MPI_FLOAT;
  case 1: return MPI_DOUBLE;
  case 2: return MPI_INT8_T;
  case 3: return MPI_UINT8_T;
  case 4: return MPI_INT16_T;
  case 5: return MPI_INT32_T;
  case 6: return MPI_INT64_T;
  case 7: return MPI_C_BOOL;
  case 8: return MPI_UINT16_T; // float16 and bfloat16, moved (never reduced) as bits
  }
  throw std::runtime_error("tdx.mpi: unknown element type code " + std::to_string(dtype));
}

/// tdx.mpi's reductions (python/tdx/mpi.py's MPI_* constants).
MPI_Op mpiOp(int op) {
  switch (op) {
  case 0: return MPI_SUM;
  case 1: return MPI_MAX;
  case 2: return MPI_MIN;
  case 3: return MPI_PROD;
  case 4: return MPI_LAND;
  case 5: return MPI_BAND;
  case 6: return MPI_LOR;
  case 7: return MPI_BOR;
  case 8: return MPI_LXOR;
  case 9: return MPI_BXOR;
  }
  throw std::runtime_error("tdx.mpi: unknown reduction code " + std::to_string(op));
}

int count(int64_t n, const char *what) {
  if (n < 0 || n > INT_MAX)
    throw std::runtime_error(std::string("tdx.mpi: ") + what + " moves " + std::to_string(n) +
                             " elements; one call moves at most 2^31-1 (split the tensor)");
  return static_cast<int>(n);
}

/// Counts and displacements of a v-collective, in elements.
struct Counts {
  std::vector<int> counts, displs;
  Counts(const int64_t *n, int size, const char *what) {
    int64_t at = 0;
    for (int r = 0; r < size; ++r) {
      counts.push_back(count(n[r], what));
      displs.push_back(count(at, what));
      at += n[r];
    }
    count(at, what);
  }
};

struct Comm {
  std::unique_ptr<Mesh> mesh;
  std::vector<std::string> axes;
  std::string name; // "dp", or "world"
  MPI_Comm data = MPI_COMM_NULL, headers = MPI_COMM_NULL, backData = MPI_COMM_NULL,
           backHeaders = MPI_COMM_NULL;
  int size = 1, index = 0;
  int64_t bytes = 0;

  ~Comm() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized)
      for (MPI_Comm *c : {&headers, &backData, &backHeaders})
        if (*c != MPI_COMM_NULL)
          MPI_Comm_free(c);
  }

  /// Waits for `r` with the deadline; a timeout names `what`.
  void complete(MPI_Request &r, const std::string &what) {
    mesh->complete(&r, what.c_str(), axes);
  }
  int64_t itemBytes(int dtype) {
    int n = 0;
    MPI_Type_size(mpiType(dtype), &n);
    return n;
  }
};

/// A started message: a payload and its header (dtype, numel, the
/// sender's flags: 1 when autograd will send a gradient back).
struct Request {
  Comm *comm;
  bool send;
  int peer, tag;
  bool backward;
  MPI_Request header = MPI_REQUEST_NULL, payload = MPI_REQUEST_NULL;
  int64_t head[3] = {0, 0, 0};
};

std::map<int64_t, std::unique_ptr<Request>> &requests() {
  static std::map<int64_t, std::unique_ptr<Request>> all;
  return all;
}

std::string peerName(const Comm &c, int peer) {
  std::ostringstream os;
  os << "rank " << peer << " of communicator " << c.name;
  return os.str();
}

} // namespace

extern "C" {

const char *tdx_comm_error() { return lastError().c_str(); }

/// The size of MPI's world (initializing MPI as model binaries do).
int tdx_comm_world_size() {
  int size = 0;
  guarded([&] { size = Mesh::initWorld(); });
  Mesh::finalizeAtExit();
  return size;
}

/// The group over `groupAxes` (comma-separated, all of a mesh's axes for
/// its whole world) of the mesh `shape` x `axes` (comma-separated), with a
/// deadline of `timeout` s per call. Every rank calls it, in one order.
void *tdx_comm_open(const int64_t *shape, int ndims, const char *axes, const char *groupAxes,
                    const char *name, double timeout) {
  auto split = [](const std::string &csv) {
    std::vector<std::string> out;
    std::stringstream ss(csv);
    for (std::string item; std::getline(ss, item, ',');)
      if (!item.empty())
        out.push_back(item);
    return out;
  };
  Mesh::finalizeAtExit();
  auto c = std::make_unique<Comm>();
  int rc = guarded([&] {
    c->mesh = std::make_unique<Mesh>(std::vector<int64_t>(shape, shape + ndims), split(axes));
    c->mesh->setCollectiveTimeout(timeout);
    c->mesh->setTimeoutHint("tdx.mpi.set_timeout(seconds) or TDX_COLLECTIVE_TIMEOUT");
    c->axes = split(groupAxes);
    c->name = name;
    Mesh::Group g = c->mesh->group(c->axes);
    c->data = *static_cast<MPI_Comm *>(g.comm);
    c->size = g.size;
    c->index = g.index;
    for (MPI_Comm *d : {&c->headers, &c->backData, &c->backHeaders})
      checkMpi(MPI_Comm_dup(c->data, d), "tdx.mpi: MPI_Comm_dup");
  });
  return rc ? nullptr : c.release();
}

void tdx_comm_close(void *c) { delete static_cast<Comm *>(c); }
int tdx_comm_rank(void *c) { return static_cast<Comm *>(c)->index; }
int tdx_comm_size(void *c) { return static_cast<Comm *>(c)->size; }
int tdx_comm_world_rank(void *c) { return static_cast<Comm *>(c)->mesh->rank(); }
long long tdx_comm_bytes(void *c) { return static_cast<Comm *>(c)->bytes; }
void tdx_comm_set_timeout(void *c, double seconds) {
  static_cast<Comm *>(c)->mesh->setCollectiveTimeout(seconds);
}

int tdx_comm_allreduce(void *cp, const void *send, void *recv, int64_t n, int dtype, int op,
                       const char *what) {
  auto &c = *static_cast<Comm *>(cp);
  return guarded([&] {
    MPI_Request r;
    checkMpi(MPI_Iallreduce(send, recv, count(n, what), mpiType(dtype), mpiOp(op), c.data, &r),
             what);
    c.bytes += n * c.itemBytes(dtype);
    c.complete(r, what);
  });
}

int tdx_comm_reduce(void *cp, const void *send, void *recv, int64_t n, int dtype, int op, int root,
                    const char *what) {
  auto &c = *static_cast<Comm *>(cp);
  return guarded([&] {
    MPI_Request r;
    checkMpi(MPI_Ireduce(send, recv, count(n, what), mpiType(dtype), mpiOp(op), root, c.data, &r),
             what);
    c.bytes += n * c.itemBytes(dtype);
    c.complete(r, what);
  });
}

int tdx_comm_bcast(void *cp, void *buf, int64_t n, int dtype, int root, const char *what) {
  auto &c = *static_cast<Comm *>(cp);
  return guarded([&] {
    MPI_Request r;
    checkMpi(MPI_Ibcast(buf, count(n, what), mpiType(dtype), root, c.data, &r), what);
    if (c.index == root)
      c.bytes += n * c.itemBytes(dtype);
    c.complete(r, what);
  });
}

/// Every rank's `send` (counts[r] elements from rank r) concatenated in
/// rank order, on every rank (root < 0) or on `root`.
int tdx_comm_gatherv(void *cp, const void *send, void *recv, const int64_t *counts, int dtype,
                     int root, const char *what) {
  auto &c = *static_cast<Comm *>(cp);
  return guarded([&] {
    Counts v(counts, c.size, what);
    MPI_Request r;
    int mine = v.counts[static_cast<size_t>(c.index)];
    if (root < 0)
      checkMpi(MPI_Iallgatherv(send, mine, mpiType(dtype), recv, v.counts.data(), v.displs.data(),
                               mpiType(dtype), c.data, &r),
               what);
    else
      checkMpi(MPI_Igatherv(send, mine, mpiType(dtype), recv, v.counts.data(), v.displs.data(),
                            mpiType(dtype), root, c.data, &r),
               what);
    c.bytes += mine * c.itemBytes(dtype);
    c.complete(r, what);
  });
}

/// Rank r gets counts[r] elements of root's `send` (in rank order).
int tdx_comm_scatterv(void *cp, const void *send, void *recv, const int64_t *counts, int dtype,
                      int root, const char *what) {
  auto &c = *static_cast<Comm *>(cp);
  return guarded([&] {
    Counts v(counts, c.size, what);
    MPI_Request r;
    checkMpi(MPI_Iscatterv(send, v.counts.data(), v.displs.data(), mpiType(dtype), recv,
                           v.counts[static_cast<size_t>(c.index)], mpiType(dtype), root, c.data,
                           &r),
             what);
    if (c.index == root) {
      int64_t all = 0;
      for (int k : v.counts)
        all += k;
      c.bytes += all * c.itemBytes(dtype);
    }
    c.complete(r, what);
  });
}

/// The sum over ranks of `send` (counts[r] elements for rank r, in rank
/// order), each rank keeping its part.
int tdx_comm_reduce_scatterv(void *cp, const void *send, void *recv, const int64_t *counts,
                             int dtype, int op, const char *what) {
  auto &c = *static_cast<Comm *>(cp);
  return guarded([&] {
    Counts v(counts, c.size, what);
    MPI_Request r;
    checkMpi(MPI_Ireduce_scatter(send, recv, v.counts.data(), mpiType(dtype), mpiOp(op), c.data,
                                 &r),
             what);
    int64_t all = 0;
    for (int k : v.counts)
      all += k;
    c.bytes += all * c.itemBytes(dtype);
    c.complete(r, what);
  });
}

/// Sends sendCounts[r] elements (in rank order) to rank r and receives
/// recvCounts[r] from it.
int tdx_comm_alltoallv(void *cp, const void *send, const int64_t *sendCounts, void *recv,
                       const int64_t *recvCounts, int dtype, const char *what) {
  auto &c = *static_cast<Comm *>(cp);
  return guarded([&] {
    Counts s(sendCounts, c.size, what), v(recvCounts, c.size, what);
    MPI_Request r;
    checkMpi(MPI_Ialltoallv(send, s.counts.data(), s.displs.data(), mpiType(dtype), recv,
                            v.counts.data(), v.displs.data(), mpiType(dtype), c.data, &r),
             what);
    int64_t all = 0;
    for (size_t k = 0; k < s.counts.size(); ++k)
      if (static_cast<int>(k) != c.index)
        all += s.counts[k];
    c.bytes += all * c.itemBytes(dtype);
    c.complete(r, what);
  });
}

/// Starts sending `n` elements to `peer` (synchronous mode: the wait
/// completes only once the peer receives, so a send nobody receives times
/// out naming its peer and tag instead of vanishing). Returns the request's
/// id, or 0 on error. `buf` must live until the wait.
long long tdx_comm_isend(void *cp, const void *buf, int64_t n, int dtype, int peer, int tag,
                         int backward, int flags) {
  auto &c = *static_cast<Comm *>(cp);
  static long long next = 0;
  long long id = 0;
  guarded([&] {
    auto r = std::make_unique<Request>();
    *r = Request{&c, true, peer, tag, backward != 0};
    r->head[0] = dtype;
    r->head[1] = n;
    r->head[2] = flags;
    const char *what = "Isend";
    checkMpi(MPI_Isend(r->head, 3, MPI_INT64_T, peer, tag, backward ? c.backHeaders : c.headers,
                       &r->header),
             what);
    checkMpi(MPI_Issend(buf, count(n, what), mpiType(dtype), peer, tag,
                        backward ? c.backData : c.data, &r->payload),
             what);
    c.bytes += n * c.itemBytes(dtype);
    id = ++next;
    requests()[id] = std::move(r);
  });
  return id;
}

/// Starts receiving `n` elements of `dtype` from `peer` into `buf`.
long long tdx_comm_irecv(void *cp, void *buf, int64_t n, int dtype, int peer, int tag,
                         int backward, int /*flags: the sender's*/) {
  auto &c = *static_cast<Comm *>(cp);
  static long long next = 0;
  long long id = 0;
  guarded([&] {
    auto r = std::make_unique<Request>();
    *r = Request{&c, false, peer, tag, backward != 0};
    const char *what = "Irecv";
    checkMpi(MPI_Irecv(r->head, 3, MPI_INT64_T, peer, tag, backward ? c.backHeaders : c.headers,
                       &r->header),
             what);
    checkMpi(MPI_Irecv(buf, count(n, what), mpiType(dtype), peer, tag,
                       backward ? c.backData : c.data, &r->payload),
             what);
    id = -(++next); // receives are negative ids, sends positive
    requests()[id] = std::move(r);
  });
  return id;
}

/// Waits for request `id` (with the deadline). A receive writes the
/// sender's header to `got` (dtype, numel, flags) and fails unless its
/// `dtype` and `n` are as expected.
int tdx_comm_wait(long long id, int dtype, int64_t n, int64_t *got) {
  return guarded([&] {
    auto it = requests().find(id);
    if (it == requests().end())
      throw std::runtime_error("tdx.mpi: Wait on a handle that was already waited for");
    std::unique_ptr<Request> r = std::move(it->second);
    requests().erase(it);
    Comm &c = *r->comm;
    std::string dir = r->send ? "Isend to " : "Irecv from ";
    std::string what = dir + peerName(c, r->peer) + " with tag " + std::to_string(r->tag) +
                       (r->backward ? " (the backward of a Wait)" : "") +
                       (r->send ? ": the peer never received it (no matching Irecv/Recv)"
                                : ": the peer never sent it (no matching Isend/Send)");
    c.complete(r->header, what);
    if (!r->send)
      std::copy(r->head, r->head + 3, got);
    if (!r->send && (r->head[0] != dtype || r->head[1] != n)) {
      // The message is taken all the same (a longer one ends truncated),
      // so that the sender's wait completes and only this rank errs.
      try {
        c.complete(r->payload, what);
      } catch (const std::exception &) {
      }
      throw std::runtime_error("tdx.mpi: the message does not fit the receive");
    }
    c.complete(r->payload, what);
  });
}

} // extern "C"
