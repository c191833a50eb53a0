//===- Arena.h - the planned memory of a step's tensors -----------*- C++ -*-===//
//
// The emitter assigns every tensor a step makes and drops within the step an
// offset in one arena (tdx::rt::Lifetimes in lib/Target/EmitCpp.cpp: tensors
// whose lifetimes overlap get disjoint ranges). A model binary reserves the
// arena once at start-up; before each op the emitted step tells the arena
// the slots of the op's results (Mesh::place), and the runtime's allocator
// (the CPU pool, the CUDA Tensor::empty) gives the first allocation of a
// slot's size its slot, instead of asking the system or a pool.
//
// What the arena hands out is checked against what is live in it: a slot
// whose range some tensor still holds (an ATen op that returned an alias
// the plan did not see, a temporary of the result's size that took the
// slot) is refused, and the allocation goes to the pool. So a plan that does
// not match what ATen does costs memory, never a wrong number.
//
// No ATen, no CUDA: the CPU and the CUDA runtime share it, and the tests
// run it here.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_RUNTIME_ARENA_H
#define TDX_RUNTIME_ARENA_H

#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <vector>

namespace tdx::rt {

class Arena {
public:
  /// A result of an op: its offset in the arena (-1: not planned, it goes
  /// to the pool) and its bytes.
  struct Slot {
    int64_t offset, bytes;
  };

  /// Takes `bytes` of memory at `base` (the caller's, 64-byte aligned) as the
  /// arena; forgets any earlier one. Slots must lie inside it.
  void reserve(char *base, int64_t bytes);
  int64_t size() const { return size_; }

  /// The slots of the next op's results, in result order; replaces those not
  /// taken yet. expect({}) after the op forgets what it did not take.
  void expect(std::initializer_list<Slot> slots);
  /// For an allocation of `bytes`: the first expected slot of exactly those
  /// bytes is used up; if it is planned and no live tensor overlaps its
  /// range (in 64-byte lines), its memory, marked live. Otherwise null (the
  /// caller allocates elsewhere).
  void *take(int64_t bytes);
  /// Whether `p` is in the arena; if so, its range is free again.
  bool give(void *p);

  /// Over the arena's life: slots taken, slots refused because a live tensor
  /// held part of their range, and slots expected but never asked for.
  struct Counts {
    int64_t taken = 0, busy = 0, unasked = 0;
  };
  Counts counts();

  /// The arena of this process (one rank, one arena).
  static Arena &get();

private:
  bool free(int64_t offset, int64_t bytes) const;

  std::mutex mutex_; // ATen's worker threads allocate too
  char *base_ = nullptr;
  int64_t size_ = 0;
  std::vector<Slot> expected_;
  std::map<int64_t, int64_t> live_; // offset -> end
  Counts counts_;
};

} // namespace tdx::rt

#endif // TDX_RUNTIME_ARENA_H
