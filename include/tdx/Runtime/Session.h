//===- Session.h - a rank's CPU program with its state resident -*- C++ -*-===//
//
// What every way of running a CPU model shares: the binary's command line
// (runMain's loops), the single controller's requests (--serve DIR) and the
// in-process library of SPMD scripts (Library.cpp, python/tdx/runner.py).
// A session reads or makes its state once (--params, --resume, the init
// programs), runs calls of the program on it, and saves, loads, publishes
// and writes it.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_RUNTIME_SESSION_H
#define TDX_RUNTIME_SESSION_H

#include "tdx/Runtime/Options.h"
#include "tdx/Runtime/Runtime.h"
#include "tdx/Runtime/Safetensors.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tdx::rt {

/// This rank's part of the stored global tensor `name`, read alone from the
/// file (never the global tensor), converted to `dtype`.
at::Tensor readLocal(const Context &ctx, const TensorStore &store, const std::string &name,
                     const std::string &what, const std::vector<int64_t> &shape,
                     at::ScalarType dtype, const Layout &layout);

/// Writes `tensors` as one safetensors file.
void save(const std::string &path, const std::map<std::string, at::Tensor> &tensors);

/// What a rank's steps take from the step memory pool (TensorMemory): the
/// most working memory one step held (its peak over what was live when it
/// began) and the tensor allocations that reached the system in the steps
/// after the first, which the pool makes none for a static program.
struct StepMemory {
  int64_t steps = 0, working = 0, laterAllocations = 0;
  std::vector<at::Tensor> step(const Program &program, Context &ctx, Program::State &state,
                               const std::vector<at::Tensor> &inputs);
  void report(int rank, const Program &program) const;
};

class Session {
public:
  /// Sets threads, reads the state (--params, --resume: its step, seed and
  /// call count too) and makes the rest with the init programs. `ownsProcess`
  /// (a binary): installs the step memory pool as ATen's CPU allocator; an
  /// in-process library leaves the host's allocator alone.
  Session(const Program &program, Options &options, bool ownsProcess);

  Context &ctx() { return *ctx_; }
  Program::State &state() { return state_; }
  const Program &program() const { return program_; }
  /// Steps (calls) run, from the checkpoint's on a resumed run.
  int64_t steps() const { return steps_; }
  int64_t firstStep() const { return firstStep_; }
  double initMs() const { return initMs_; }
  /// Milliseconds spent saving checkpoints so far.
  double saveMs() const { return saveMs_; }
  StepMemory &memory() { return memory_; }

  /// One call of entry `entry` (0: the main one, k: program.entries[k-1])
  /// on this rank's inputs: its local outputs. Only the main entry counts
  /// as a step.
  std::vector<at::Tensor> call(const std::vector<at::Tensor> &local, size_t entry = 0);
  /// Output `i` of entry `entry` as a global tensor on rank 0 (undefined
  /// elsewhere).
  at::Tensor gatherOutput(const at::Tensor &local, size_t i, size_t entry = 0);
  /// Rank 0 writes the gathered global state.
  void writeState(const std::string &path);
  /// The state entries `path` holds replace this rank's.
  void load(const std::string &path);
  /// A crash-safe sharded checkpoint under `root` (step -1: a store's
  /// version); without `optimizer`, no optimizer state.
  void checkpoint(const std::string &root, int64_t step, bool optimizer, int keep);
  /// --save and --publish after step `step` (`last`: the run's last).
  void saveStep(int64_t step, bool last);

private:
  const Program &program_;
  Options &o_;
  std::unique_ptr<TensorStore> store_;
  std::unique_ptr<Context> ctx_;
  Program::State state_;
  StepMemory memory_;
  int64_t steps_ = 0, firstStep_ = 0;
  double initMs_ = 0, saveMs_ = 0;
};

} // namespace tdx::rt

#endif // TDX_RUNTIME_SESSION_H
