//===- PointToPoint.cu - a pipeline's messages over NCCL channels --------===//
//
// tdx.send and tdx.recv between the ranks of a pipeline axis. Each pair of
// ranks that talks, in each direction, gets a channel: a two-rank NCCL
// communicator and a stream of its own, made before the step runs
// (pipelineChannel, called by every rank in one order). A channel carries
// one direction only and NCCL matches its messages in order, so a send
// waits for nothing but its value (the channel's stream follows the compute
// stream), the compute stream waits on the device for a recv, and the host
// never blocks: tdx-schedule-pipeline lays each rank's recvs from a peer in
// the peer's send order, and every recv after its send in one global
// order, so the streams cannot wait on each other in a cycle. finishSends
// waits for the channels with the collective deadline, so a lost peer ends
// the step with an error instead of a hang. Where collectives go through
// host memory (ranks sharing a GPU), so do these (Context.cu's collectives through host memory).
//
//===----------------------------------------------------------------------===//

#include "tdx/Runtime/cuda/Runtime.h"
#include "Nccl.cuh"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <thread>

using namespace tdx::cu;

namespace {
/// The MPI tag of a channel's NCCL id (pipeline messages use tag % 32768;
/// a channel is made before its ranks send anything on the group).
constexpr int kChannelTag = 32767;
} // namespace

void Context::settle(void *comm, const char *what, const std::vector<std::string> &axes) {
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(collectiveTimeout());
  for (;;) {
    ncclResult_t state = ncclSuccess;
    checkNccl(ncclCommGetAsyncError(static_cast<ncclComm_t>(comm), &state), what);
    if (state == ncclSuccess)
      return;
    if (state != ncclInProgress) {
      abortCommunicators();
      checkNccl(state, what);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      abortCommunicators();
      timedOut(what, axes);
    }
    std::this_thread::yield();
  }
}

void Context::pipelineChannel(const std::vector<std::string> &axes, int64_t from, int64_t to) {
  Group g = group(axes);
  if (staged_ || (g.index != from && g.index != to) || channels_.count({axes, from, to}))
    return;
  const bool sender = g.index == from;
  ncclUniqueId id;
  if (sender)
    checkNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  auto mpiComm = *static_cast<MPI_Comm *>(g.comm);
  MPI_Request request;
  if (sender)
    tdx::rt::checkMpi(MPI_Isend(&id, sizeof(id), MPI_BYTE, static_cast<int>(to), kChannelTag,
                                mpiComm, &request),
                      "sending the NCCL id");
  else
    tdx::rt::checkMpi(MPI_Irecv(&id, sizeof(id), MPI_BYTE, static_cast<int>(from), kChannelTag,
                                mpiComm, &request),
                      "receiving the NCCL id");
  complete(&request, "pipeline set-up", axes);

  Channel c;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  checkNccl(ncclCommInitRankConfig(&comm, 2, id, sender ? 0 : 1, &config),
            "ncclCommInitRankConfig");
  c.comm = comm;
  cudaStream_t stream;
  cudaEvent_t event;
  checkCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  checkCuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  c.stream = stream, c.event = event;
  channels_[{axes, from, to}] = c;
  settle(comm, "pipeline set-up", axes);

  // A first message: NCCL connects a pair on its first message, which
  // waits for the peer; here both ranks stand at this channel.
  Tensor one = Tensor::empty({1}, DType::U8);
  enqueue(channels_[{axes, from, to}], "pipeline set-up", axes, [&](void *handle, void *st) {
    auto nc = static_cast<ncclComm_t>(handle);
    auto ns = static_cast<cudaStream_t>(st);
    return sender ? ncclSend(one.data(), 1, ncclUint8, 1, nc, ns)
                  : ncclRecv(one.data(), 1, ncclUint8, 0, nc, ns);
  });
  checkCuda(cudaEventRecord(event, stream), "cudaEventRecord");
  synchronize("pipeline set-up", axes, event);
}

void Context::enqueue(Channel &c, const char *what, const std::vector<std::string> &axes,
                      const std::function<int(void *, void *)> &op) {
  orderAfterCompute(c.stream);
  checkNccl(static_cast<ncclResult_t>(op(c.comm, c.stream)), what);
  settle(c.comm, what, axes);
}

Context::Channel &Context::channel(const std::vector<std::string> &axes, int64_t from,
                                   int64_t to) {
  auto it = channels_.find({axes, from, to});
  if (it == channels_.end())
    throw std::logic_error("tdx: no pipeline channel from rank " + std::to_string(from) +
                           " to " + std::to_string(to) +
                           " of its group; the step makes each before it runs "
                           "(pipelineChannel)");
  return it->second;
}

void Context::send(const Tensor &x, const std::vector<std::string> &axes, int64_t peer,
                   int64_t tag, bool sized) {
  if (staged_)
    return hostSend(x, axes, peer, tag);
  Group g = group(axes);
  Channel &c = channel(axes, g.index, peer);
  Tensor in = x.contiguous();
  if (sized) {
    auto bytes = std::make_shared<int64_t>(in.nbytes());
    const void *data = bytes.get();
    sendBytes(std::move(bytes), data, sizeof(int64_t), axes, peer, tag);
  }
  enqueue(c, "send", axes, [&](void *comm, void *stream) {
    return ncclSend(in.data(), static_cast<size_t>(in.nbytes()), ncclUint8, 1,
                    static_cast<ncclComm_t>(comm), static_cast<cudaStream_t>(stream));
  });
  addBytes(in.nbytes());
  inTransit_.push_back(std::move(in)); // read by the channel until finishSends
}

Tensor Context::recv(std::vector<int64_t> shape, DType dtype, const std::vector<std::string> &axes,
                     int64_t peer, int64_t tag) {
  if (staged_)
    return hostRecv(std::move(shape), dtype, axes, peer, tag);
  Group g = group(axes);
  Channel &c = channel(axes, peer, g.index);
  if (std::find(shape.begin(), shape.end(), -1) != shape.end()) {
    int64_t bytes = 0;
    recvBytes(&bytes, sizeof(bytes), axes, peer, tag);
    fillOpenDim(shape, tdx::rt::dtypeSize(dtype), bytes);
  }
  Tensor out = Tensor::empty(shape, dtype);
  // (`out`'s memory may be what the compute stream's queued work just
  // freed: enqueue orders the channel after it.)
  enqueue(c, "recv", axes, [&](void *comm, void *stream) {
    return ncclRecv(out.data(), static_cast<size_t>(out.nbytes()), ncclUint8, 0,
                    static_cast<ncclComm_t>(comm), static_cast<cudaStream_t>(stream));
  });
  auto done = static_cast<cudaEvent_t>(c.event);
  checkCuda(cudaEventRecord(done, static_cast<cudaStream_t>(c.stream)), "cudaEventRecord");
  checkCuda(cudaStreamWaitEvent(nullptr, done, 0), "cudaStreamWaitEvent");
  return out;
}

void Context::finishSends() {
  for (auto &[key, c] : channels_) {
    checkCuda(cudaEventRecord(static_cast<cudaEvent_t>(c.event),
                              static_cast<cudaStream_t>(c.stream)),
              "cudaEventRecord");
    synchronize("send", std::get<0>(key), c.event);
  }
  inTransit_.clear();
  Mesh::finishSends();
}
