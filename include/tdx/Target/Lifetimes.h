//===- Lifetimes.h - where the step's tensors live and die -------*- C++ -*-===//
//
// The liveness of a partitioned step after tdx-fuse-elementwise and
// tdx-async-collectives, and the memory plan on it. tdx-plan-memory writes
// the plan into the IR (tdx.arena, moved tdx.assigns, tdx.step_bytes); the
// emitters read the same analysis for where each handle is dropped.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_TARGET_LIFETIMES_H
#define TDX_TARGET_LIFETIMES_H

#include "tdx/IR/TdxOps.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallVector.h"

#include <map>
#include <string>

namespace mlir::tdx {

/// Whether `op` is a view (reshape, transpose, permute, slice, expand): its
/// result holds no bytes of its own, only its base's.
bool isView(Operation *op);
/// The bytes of a static tensor value (0: not one).
int64_t tensorBytes(Value v);

/// The tensors an op allocates, in order: a tdx.start's is its collective's
/// result (the tdx.wait only hands it over); other ops', their results.
SmallVector<Value> allocatedTensors(Operation *op);

/// Where each tensor the step makes is last needed, so the emitted code
/// drops its handle there and the allocator reuses its buffer for what
/// comes next, instead of every intermediate living until the step returns;
/// and where each state write goes. A value is read where its reader stands
/// (a tdx.fused reads its inputs where it runs). Arguments, returned values
/// and written values live on; a started reduce_scatter's or all_gather's
/// input lives until its tdx.wait.
///
/// A state written once, by a value an op makes, is written right after
/// both that op and the last param_ref of the state (a captured step
/// assigns everything at its end): every param_ref still reads the value
/// the state had on entry, and the old tensor is freed as soon as its last
/// reader is done, so an update holds one copy of the state, not two, as
/// an update in place would. Other writes happen when the step returns.
class Lifetimes {
public:
  explicit Lifetimes(Block &block);

  /// The values whose last reader (or maker) is `op`, in program order.
  ArrayRef<Value> endingAt(Operation *op) const { return lookup(ending, op); }
  /// The state writes that go right after `op`.
  ArrayRef<AssignOp> writesAt(Operation *op) const { return lookup(writes, op); }
  /// The state writes that go when the step returns: by state, each
  /// state's in program order.
  ArrayRef<AssignOp> writesAtReturn() const { return atReturn; }

  /// The most bytes of the step's own tensors alive at once (the step's
  /// working memory): each tensor from where it is made to where the last
  /// reader of it or of a view of it stands (returned and written values: to
  /// the end), less each state's old tensor from where it is freed. Views,
  /// parameters and arguments hold no bytes of their own; ATen's workspaces
  /// are not seen.
  int64_t peakBytes() const { return peak; }
  /// The step's own tensors alive where the peak is reached (the tensors
  /// holding storage, not views), with their bytes.
  ArrayRef<std::pair<Value, int64_t>> liveAtPeak() const { return peakLive; }
  /// The op where the peak is reached (null: when the step returns); a
  /// tensor made before it and read after it is held across the peak.
  Operation *peakOp() const {
    return peakAt < static_cast<int64_t>(points.size()) ? points[peakAt] : nullptr;
  }
  /// The bytes of the step's own tensors alive where each op that runs
  /// stands, in order (one more entry: when the step returns).
  ArrayRef<int64_t> liveBytes() const { return curve; }
  /// Where `op` stands among the ops that run (-1: not one, as tdx.assign
  /// and the return).
  int64_t pointOf(Operation *op) const {
    auto it = position.find(op);
    return it == position.end() ? -1 : it->second;
  }

  /// The memory plan: every tensor the step makes and drops within the step
  /// (not a view, not returned, not written to a state, not a collective
  /// nobody waits for before the return) gets an offset in one arena, and
  /// tensors alive at once get disjoint ranges of 64-byte lines (greedy by
  /// size: the largest first, each at the lowest offset that fits). The
  /// offsets of the tensors `op` allocates (allocatedTensors; -1: not
  /// planned), none when it makes no planned tensor.
  ArrayRef<int64_t> offsetsAt(Operation *op) const { return lookup(offsets, op); }
  /// The arena's bytes: the end of its highest slot.
  int64_t arenaBytes() const { return arena; }

private:
  template <class T>
  static ArrayRef<T> lookup(const DenseMap<Operation *, SmallVector<T>> &m, Operation *op) {
    auto it = m.find(op);
    return it == m.end() ? ArrayRef<T>() : ArrayRef<T>(it->second);
  }
  struct Planned;
  void plan(ArrayRef<Value> made, const DenseSet<Value> &kept, DenseMap<Value, Operation *> &last,
            std::map<std::string, SmallVector<AssignOp>> &assigns,
            std::map<std::string, SmallVector<ParamRefOp>> &refs);
  void assignOffsets(ArrayRef<Value> made, const DenseSet<Value> &kept,
                     DenseMap<Value, Operation *> &last, const DenseMap<Value, Value> &root,
                     const DenseMap<Value, int64_t> &until);

  SmallVector<Operation *> points; // the ops that run, in order
  DenseSet<Value> unread;           // started collectives' results nothing reads
  DenseMap<Operation *, int64_t> position;
  DenseMap<Value, int64_t> madeAt;
  DenseMap<Operation *, SmallVector<Value>> ending;
  DenseMap<Operation *, SmallVector<AssignOp>> writes;
  SmallVector<AssignOp> atReturn;
  DenseMap<Operation *, SmallVector<Value>> resultsAt;
  DenseMap<Operation *, SmallVector<int64_t>> offsets;
  int64_t peak = 0, arena = 0, peakAt = 0;
  SmallVector<std::pair<Value, int64_t>> peakLive;
  SmallVector<int64_t> curve;
};

} // namespace mlir::tdx

#endif // TDX_TARGET_LIFETIMES_H
