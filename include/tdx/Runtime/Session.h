//===- Session.h - a rank's CPU program with its state resident -*- C++ -*-===//
//
// The CPU backend's Engine (tdx/Runtime/Serve.h), which every way of running
// a CPU model goes through: the binary's command line and the single
// controller's requests (serve()), and the in-process library of SPMD
// scripts (Library.cpp, python/tdx/runner.py). A session reads or makes its
// state once (--params, --resume, the init programs), runs calls of the
// program on it, and saves, loads, publishes and writes it.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_RUNTIME_SESSION_H
#define TDX_RUNTIME_SESSION_H

#include "tdx/Runtime/Options.h"
#include "tdx/Runtime/Runtime.h"
#include "tdx/StateFormat/Safetensors.h"
#include "tdx/Runtime/Serve.h"

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

class Session : public Engine {
public:
  /// Sets threads, reads the state (--params, --resume: its step, seed and
  /// call count too) and makes the rest with the init programs. `ownsProcess`
  /// (a binary): installs the step memory pool as ATen's CPU allocator; an
  /// in-process library leaves the host's allocator alone.
  Session(const Program &program, Options &options, bool ownsProcess);

  Context &ctx() { return *ctx_; }
  const Program &program() const { return program_; }

  Mesh &mesh() override { return *ctx_; }
  /// Steps (calls) run, from the checkpoint's on a resumed run.
  int64_t steps() const override { return steps_; }
  size_t entries() const override { return program_.entries.size(); }
  std::vector<HostTensor> call(const TensorStore &in, const std::string &prefix,
                               size_t entry) override;
  std::vector<HostTensor> call(const std::vector<const void *> &inputs, bool local,
                               size_t entry) override;
  void inputBox(size_t entry, size_t i, std::vector<int64_t> &offset,
                std::vector<int64_t> &size) override;

  /// One call of entry `entry` (0: the main one, k: program.entries[k-1])
  /// on this rank's inputs: its local outputs. Only the main entry counts
  /// as a step.
  std::vector<at::Tensor> call(const std::vector<at::Tensor> &local, size_t entry = 0);
  /// Output `i` of entry `entry` as a global tensor on rank 0 (undefined
  /// elsewhere).
  at::Tensor gatherOutput(const at::Tensor &local, size_t i, size_t entry = 0);
  /// Every output of a call, gathered: rank 0's global tensors.
  std::vector<HostTensor> gatherOutputs(const std::vector<at::Tensor> &local, size_t entry);
  void writeState(const std::string &path) override;
  void load(const std::string &path) override;
  void checkpoint(const std::string &root, int64_t step, bool optimizer, int keep) override;
  /// --verbose: the state's and a step's memory, the pipeline's waits and
  /// the mean step time; --profile: where rank 0's steps went.
  void report() override;

private:
  const Program &program_;
  Options &o_;
  std::unique_ptr<TensorStore> store_;
  std::unique_ptr<Context> ctx_;
  Program::State state_;
  StepMemory memory_;
  int64_t steps_ = 0, firstStep_ = 0;
  /// The main entry's calls timed (their milliseconds) and their peak
  /// tensor memory.
  int64_t timedSteps_ = 0, peakStep_ = 0;
  double initMs_ = 0, stepMs_ = 0;
};

} // namespace tdx::rt

#endif // TDX_RUNTIME_SESSION_H
