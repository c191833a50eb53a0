//===- Mesh.h - ranks, layouts and MPI groups of model binaries ---*- C++ -*-===//
//
// What the CPU and the CUDA runtime share about the device mesh, without
// ATen or CUDA: the rank's coordinates, the box of a global tensor a rank
// holds under a layout, MPI sub-groups over mesh axes, waiting for a
// nonblocking request with a deadline (a lost or stuck rank never hangs),
// and gathering every rank's part of a tensor to rank 0.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_RUNTIME_MESH_H
#define TDX_RUNTIME_MESH_H

#include "tdx/Runtime/Arena.h"
#include "tdx/StateFormat/Box.h"
#include "tdx/Runtime/Placement.h"
#include "tdx/StateFormat/Safetensors.h"

#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tdx::rt {

class Mesh {
public:
  /// Initializes MPI if needed; throws when the world size is not the mesh's.
  Mesh(std::vector<int64_t> meshShape, std::vector<std::string> axes);
  /// Initializes MPI if needed (as a Mesh does) and returns the world's size.
  static int initWorld();
  /// Ends MPI when the process exits, where a Python process owns its exit
  /// (tdx.runner's programs, tdx.mpi); registered once.
  static void finalizeAtExit();
  ~Mesh();
  Mesh(const Mesh &) = delete;
  Mesh &operator=(const Mesh &) = delete;

  int rank() const { return rank_; }
  int worldSize() const { return world_; }
  int64_t coord(const std::string &axis) const;
  const std::vector<int64_t> &coords() const { return coords_; }
  const std::vector<int64_t> &meshShape() const { return meshShape_; }
  std::vector<int64_t> coordsOf(int rank) const;

  /// The offsets and sizes of this rank's (or `coords`') box of `globalShape`.
  void box(const std::vector<int64_t> &globalShape, const Layout &layout,
           std::vector<int64_t> &offset, std::vector<int64_t> &size) const;
  void boxAt(const std::vector<int64_t> &coords, const std::vector<int64_t> &globalShape,
             const Layout &layout, std::vector<int64_t> &offset, std::vector<int64_t> &size) const;
  /// The sizes of this rank's box of `globalShape` (an uneven split may
  /// leave it no rows).
  std::vector<int64_t> localShape(const std::vector<int64_t> &globalShape,
                                  const Layout &layout) const;

  /// The ranks that differ from this one only on `axes`: an MPI_Comm* (made
  /// on first use), the group's size and this rank's index in it.
  struct Group {
    void *comm;
    int size;
    int index;
  };
  Group group(const std::vector<std::string> &axes);
  /// The index in group(axes) of the rank at `coords` (one per axis of
  /// `axes`, in its order).
  int groupIndexOf(const std::vector<std::string> &axes, const std::vector<int64_t> &coords) const;
  /// The ranks `pairs` (source, target group indices, flattened) names for
  /// the rank at group index `index`: whom it sends to and receives from
  /// (-1: none). tdx.collective_permute on every backend.
  static std::pair<int, int> permutePeers(const std::vector<int64_t> &pairs, int index);
  /// The MPI tag of tdx.collective_permute's messages (pipeline tags are
  /// below it).
  static constexpr int kPermuteTag = 32767;

  /// Waits for an MPI_Request* at most the collective timeout, then throws
  /// naming `what` and the group's axes (the driver then aborts every rank).
  void complete(void *request, const char *what, const std::vector<std::string> &axes);
  void setCollectiveTimeout(double seconds) { timeout_ = seconds; }
  /// How the timeout error tells the user to raise the limit (default: the
  /// binaries' --collective-timeout S).
  void setTimeoutHint(std::string hint) { timeoutHint_ = std::move(hint); }
  /// Whether a started collective may run beside the ops before its wait
  /// (--no-overlap: no, it completes where it starts).
  void setOverlap(bool overlap) { overlap_ = overlap; }
  /// The emitted step's memory plan: the arena slots of the next op's
  /// results (tdx/Runtime/Arena.h), and placed() once the op has run.
  void place(std::initializer_list<Arena::Slot> slots) { Arena::get().expect(slots); }
  void placed() { Arena::get().expect({}); }
  bool overlap() const { return overlap_; }
  double collectiveTimeout() const { return timeout_; }
  /// Throws the timeout error for `what` over `axes`.
  [[noreturn]] void timedOut(const char *what, const std::vector<std::string> &axes) const;

  /// The index of this call of the program's function (from 0), which its
  /// random ops draw with (InitProgram.h's atCall).
  uint64_t nextCall() { return calls_++; }
  /// The calls made so far; a resumed run starts from a checkpoint's count.
  uint64_t calls() const { return calls_; }
  void setCalls(uint64_t calls) { calls_ = calls; }

  /// The sum of `value` over all ranks (every rank gets it).
  int64_t sumOverWorld(int64_t value);
  void barrier();
  /// Rank 0's `bytes`, on every rank (the others' argument is ignored).
  std::string broadcastFromRoot(std::string bytes);
  /// Rank 0 prints a run's one line: the ranks, the init time, the mean
  /// step time and the bytes all ranks sent per step. Every rank calls it:
  /// it sums over them. `firstMs` >= 0: a warm-up step's time, printed but
  /// not in the mean.
  void reportSteps(double initMs, double stepMs, int64_t steps, double firstMs = -1);
  /// Waits for every rank, then ends MPI: a model binary's last step.
  void finish();

  /// Rank 0 gets the global tensor (row-major bytes of `dtype`) from every
  /// rank's dense local part under `layout`; Partial parts are summed.
  /// Other ranks get an empty vector.
  std::vector<char> gather(const void *local, int64_t localBytes,
                           const std::vector<int64_t> &globalShape, DType dtype,
                           const Layout &layout);

  /// Pipeline messages (tdx.send / tdx.recv) along one mesh axis to the
  /// rank at coordinate `peer` there. A send never waits: `keep` owns the
  /// bytes until finishSends() (the receiver may post its recv much later;
  /// a send that waited could deadlock a 1F1B schedule).
  void sendBytes(std::shared_ptr<const void> keep, const void *data, int64_t bytes,
                 const std::vector<std::string> &axes, int64_t peer, int64_t tag);
  /// Waits (with the collective deadline) for the message with `tag` from
  /// `peer` and returns its size in bytes, without receiving it.
  int64_t probeBytes(const std::vector<std::string> &axes, int64_t peer, int64_t tag);
  /// Gives the -1 dim of `shape` (at most one) the size the message with
  /// `tag` from `peer` has, elements of `itemBytes` (probeBytes).
  void completeShape(std::vector<int64_t> &shape, int64_t itemBytes,
                     const std::vector<std::string> &axes, int64_t peer, int64_t tag);
  /// Gives the -1 dim of `shape` (at most one) the size a message of
  /// `bytes` has, elements of `itemBytes`.
  static void fillOpenDim(std::vector<int64_t> &shape, int64_t itemBytes, int64_t bytes);
  /// Receives it into `data` (with the collective deadline).
  void recvBytes(void *data, int64_t bytes, const std::vector<std::string> &axes, int64_t peer,
                 int64_t tag);
  /// Waits for this rank's sends to be received; a pipelined step calls it
  /// before it returns.
  void finishSends();
  /// The way from group rank `from` to `to` of `axes`, made before a
  /// pipelined step runs by every rank in one order: on MPI, the group
  /// (the CUDA runtime also makes a NCCL channel for the pair).
  void pipelineChannel(const std::vector<std::string> &axes, int64_t /*from*/, int64_t /*to*/) {
    group(axes);
  }
  /// Seconds spent waiting in recvBytes and probeBytes so far: the
  /// pipeline's bubbles as this rank measured them.
  double pipelineWaitSeconds() const { return waited_; }

  /// The host rank `rank` runs on (its gethostname), as every rank told.
  const std::string &hostOf(int rank) const { return hosts_.at(static_cast<size_t>(rank)); }
  /// "ranks 0 on h1, 2 on h2": this rank's group over `axes` (empty: all).
  std::string describeGroup(const std::vector<std::string> &axes) const;

  /// Bytes this rank sent through collectives so far.
  int64_t bytesCommunicated() const { return bytes_; }
  void addBytes(int64_t n) { bytes_ += n; }
  void resetBytes() { bytes_ = 0; }

protected:
  std::vector<int64_t> meshShape_;
  std::vector<std::string> axes_;
  std::vector<int64_t> coords_;
  int rank_ = 0, world_ = 1;

private:
  static constexpr int kHostNameBytes = 64;
  std::vector<std::string> hosts_;
  int64_t bytes_ = 0;
  uint64_t calls_ = 0;
  double timeout_ = 300;
  std::string timeoutHint_ = "--collective-timeout S";
  bool overlap_ = true;
  double waited_ = 0;
  struct Sending {
    std::shared_ptr<const void> keep;
    void *request; // MPI_Request*
    std::vector<std::string> axes;
  };
  std::vector<Sending> sending_;
  std::map<std::vector<std::string>, void *> groups_; // axes -> MPI_Comm*
};

/// One rank's dense part of a state tensor.
struct LocalTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> globalShape;
  Layout layout;
  const void *data;
};

/// Saves the state as step `step` of the checkpoint root `root`
/// (tdx/StateFormat/Checkpoint.h): each rank writes the boxes it owns (a box
/// several ranks hold is written by one of them, a different one for each
/// tensor), rank 0 commits once every rank has written, and no rank returns
/// before the commit. Every rank calls it. A negative `step` saves the
/// root's next step (nextStep: a tensor store's next version). Returns the
/// step directory.
std::string saveCheckpoint(Mesh &mesh, const std::string &root, int64_t step,
                           const std::vector<LocalTensor> &state,
                           const std::map<std::string, std::string> &metadata, int keep);

/// Throws "tdx: <what> failed: <MPI's message>" unless `code` is MPI_SUCCESS.
void checkMpi(int code, const char *what);

/// Ends a model binary's rank after `error`: prints "tdx: rank R (host H): <what>"
/// and, when MPI runs, aborts every rank (none waits for a lost peer).
/// Returns the exit code, 1.
int endRank(const std::exception &error);

} // namespace tdx::rt

#endif // TDX_RUNTIME_MESH_H
