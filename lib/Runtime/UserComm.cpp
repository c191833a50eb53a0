//===- UserComm.cpp - the communication users write: tdx.mpi's C ABI ------===//
//
// tdx.mpi (mpi4torch's API; python/tdx/_mpi_eager.py) runs each call of an
// eager SPMD job through these functions, on the job's MPI and the runtime's Mesh: its
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

/// tdx.mpi's element types (python/tdx/_mpi_base.py's _DTYPES).
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

/// tdx.mpi's reductions (python/tdx/_mpi_base.py's MPI_* constants).
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
  int64_t total = 0;
  Counts(const int64_t *n, int size, const char *what) {
    for (int r = 0; r < size; ++r) {
      counts.push_back(count(n[r], what));
      displs.push_back(count(total, what));
      total += n[r];
    }
    count(total, what);
  }
};

/// A group over mesh axes and its four MPI communicators (freed by
/// MPI_Finalize: a Python process keeps its communicators to its end).
struct Comm {
  std::unique_ptr<Mesh> mesh;
  std::vector<std::string> axes;
  std::string name; // "dp", or "COMM_WORLD"
  MPI_Comm data = MPI_COMM_NULL, headers = MPI_COMM_NULL, backData = MPI_COMM_NULL,
           backHeaders = MPI_COMM_NULL;
  int size = 1, index = 0;

  /// Waits for `r` with the deadline; a timeout names `what`.
  void complete(MPI_Request &r, const std::string &what) {
    mesh->complete(&r, what.c_str(), axes);
  }
};

int64_t itemBytes(int dtype) {
  int n = 0;
  MPI_Type_size(mpiType(dtype), &n);
  return n;
}

/// Runs one nonblocking collective to completion with the deadline:
/// `post(c, r)` starts it; this rank sends `sent` elements of `dtype`.
template <class Post>
int collective(void *cp, int dtype, int64_t sent, const char *what, Post post) {
  auto &c = *static_cast<Comm *>(cp);
  return guarded([&] {
    MPI_Request r;
    checkMpi(post(c, &r), what);
    c.mesh->addBytes(sent * itemBytes(dtype));
    c.complete(r, what);
  });
}

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

/// Posts a message's header and payload; returns its id, or 0 on error.
/// Sends are synchronous (Issend): their wait completes only once the peer
/// receives, so a send nobody receives times out naming its peer and tag
/// instead of vanishing.
long long post(void *cp, bool send, void *buf, int64_t n, int dtype, int peer, int tag,
               bool backward, int flags) {
  auto &c = *static_cast<Comm *>(cp);
  static long long next = 0;
  long long id = 0;
  guarded([&] {
    auto r = std::make_unique<Request>();
    *r = Request{&c, send, peer, tag, backward};
    const char *what = send ? "Isend" : "Irecv";
    MPI_Comm headers = backward ? c.backHeaders : c.headers, data = backward ? c.backData : c.data;
    if (send) {
      r->head[0] = dtype;
      r->head[1] = n;
      r->head[2] = flags;
      checkMpi(MPI_Isend(r->head, 3, MPI_INT64_T, peer, tag, headers, &r->header), what);
      checkMpi(MPI_Issend(buf, count(n, what), mpiType(dtype), peer, tag, data, &r->payload),
               what);
      c.mesh->addBytes(n * itemBytes(dtype));
    } else {
      checkMpi(MPI_Irecv(r->head, 3, MPI_INT64_T, peer, tag, headers, &r->header), what);
      checkMpi(MPI_Irecv(buf, count(n, what), mpiType(dtype), peer, tag, data, &r->payload),
               what);
    }
    id = ++next;
    requests()[id] = std::move(r);
  });
  return id;
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

int tdx_comm_rank(void *c) { return static_cast<Comm *>(c)->index; }
int tdx_comm_size(void *c) { return static_cast<Comm *>(c)->size; }
long long tdx_comm_bytes(void *c) { return static_cast<Comm *>(c)->mesh->bytesCommunicated(); }
void tdx_comm_set_timeout(void *c, double seconds) {
  static_cast<Comm *>(c)->mesh->setCollectiveTimeout(seconds);
}

int tdx_comm_allreduce(void *cp, const void *send, void *recv, int64_t n, int dtype, int op,
                       const char *what) {
  return collective(cp, dtype, n, what, [&](Comm &c, MPI_Request *r) {
    return MPI_Iallreduce(send, recv, count(n, what), mpiType(dtype), mpiOp(op), c.data, r);
  });
}

int tdx_comm_reduce(void *cp, const void *send, void *recv, int64_t n, int dtype, int op, int root,
                    const char *what) {
  return collective(cp, dtype, n, what, [&](Comm &c, MPI_Request *r) {
    return MPI_Ireduce(send, recv, count(n, what), mpiType(dtype), mpiOp(op), root, c.data, r);
  });
}

int tdx_comm_bcast(void *cp, void *buf, int64_t n, int dtype, int root, const char *what) {
  int64_t sent = static_cast<Comm *>(cp)->index == root ? n : 0;
  return collective(cp, dtype, sent, what, [&](Comm &c, MPI_Request *r) {
    return MPI_Ibcast(buf, count(n, what), mpiType(dtype), root, c.data, r);
  });
}

/// Every rank's `send` (counts[r] elements from rank r) concatenated in
/// rank order, on every rank (root < 0) or on `root`.
int tdx_comm_gatherv(void *cp, const void *send, void *recv, const int64_t *counts, int dtype,
                     int root, const char *what) {
  int64_t mine = counts[static_cast<Comm *>(cp)->index];
  return collective(cp, dtype, mine, what, [&](Comm &c, MPI_Request *r) {
    Counts v(counts, c.size, what);
    MPI_Datatype t = mpiType(dtype);
    return root < 0 ? MPI_Iallgatherv(send, count(mine, what), t, recv, v.counts.data(),
                                      v.displs.data(), t, c.data, r)
                    : MPI_Igatherv(send, count(mine, what), t, recv, v.counts.data(),
                                   v.displs.data(), t, root, c.data, r);
  });
}

/// Rank r gets counts[r] elements of root's `send` (in rank order).
int tdx_comm_scatterv(void *cp, const void *send, void *recv, const int64_t *counts, int dtype,
                      int root, const char *what) {
  auto &comm = *static_cast<Comm *>(cp);
  int64_t sent = 0;
  if (comm.index == root)
    for (int k = 0; k < comm.size; ++k)
      sent += counts[k];
  return collective(cp, dtype, sent, what, [&](Comm &c, MPI_Request *r) {
    Counts v(counts, c.size, what);
    return MPI_Iscatterv(send, v.counts.data(), v.displs.data(), mpiType(dtype), recv,
                         v.counts[static_cast<size_t>(c.index)], mpiType(dtype), root, c.data, r);
  });
}

/// The sum over ranks of `send` (counts[r] elements for rank r, in rank
/// order), each rank keeping its part.
int tdx_comm_reduce_scatterv(void *cp, const void *send, void *recv, const int64_t *counts,
                             int dtype, int op, const char *what) {
  auto &comm = *static_cast<Comm *>(cp);
  Counts v(counts, comm.size, what);
  return collective(cp, dtype, v.total, what, [&](Comm &c, MPI_Request *r) {
    return MPI_Ireduce_scatter(send, recv, v.counts.data(), mpiType(dtype), mpiOp(op), c.data, r);
  });
}

/// Sends sendCounts[r] elements (in rank order) to rank r and receives
/// recvCounts[r] from it.
int tdx_comm_alltoallv(void *cp, const void *send, const int64_t *sendCounts, void *recv,
                       const int64_t *recvCounts, int dtype, const char *what) {
  auto &comm = *static_cast<Comm *>(cp);
  Counts s(sendCounts, comm.size, what), v(recvCounts, comm.size, what);
  int64_t sent = s.total - sendCounts[comm.index]; // what stays here moves nowhere
  return collective(cp, dtype, sent, what, [&](Comm &c, MPI_Request *r) {
    return MPI_Ialltoallv(send, s.counts.data(), s.displs.data(), mpiType(dtype), recv,
                          v.counts.data(), v.displs.data(), mpiType(dtype), c.data, r);
  });
}

/// Starts sending `n` elements to `peer`; `buf` must live until the wait.
long long tdx_comm_isend(void *cp, const void *buf, int64_t n, int dtype, int peer, int tag,
                         int backward, int flags) {
  return post(cp, true, const_cast<void *>(buf), n, dtype, peer, tag, backward != 0, flags);
}

/// Starts receiving `n` elements of `dtype` from `peer` into `buf`.
long long tdx_comm_irecv(void *cp, void *buf, int64_t n, int dtype, int peer, int tag,
                         int backward, int /*flags: the sender's*/) {
  return post(cp, false, buf, n, dtype, peer, tag, backward != 0, 0);
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
