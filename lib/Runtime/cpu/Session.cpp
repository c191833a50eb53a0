//===- Session.cpp - a rank's CPU program with its state resident ---------===//

#include "tdx/Runtime/Session.h"
#include "tdx/StateFormat/Checkpoint.h"
#include "tdx/Store/Volumes.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <stdexcept>

using namespace tdx::rt;

/// OpenBLAS's thread count, when the BLAS ATen loaded is OpenBLAS.
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

at::Tensor tdx::rt::readLocal(const Context &ctx, const TensorStore &store,
                              const std::string &name, const std::string &what,
                              const std::vector<int64_t> &shape, at::ScalarType dtype,
                              const Layout &layout) {
  const StoredTensor &t = store.expect(name, what, shape);
  std::vector<int64_t> offset, size;
  ctx.box(shape, layout, offset, size);
  at::Tensor local = at::empty(size, at::TensorOptions().dtype(scalarTypeOf(t.dtype)));
  store.readBox(name, offset, size, local.data_ptr());
  return local.to(dtype);
}

void tdx::rt::save(const std::string &path, const std::map<std::string, at::Tensor> &tensors) {
  std::vector<at::Tensor> keep;
  std::vector<TensorToWrite> out;
  for (const auto &[name, t] : tensors) {
    keep.push_back(t.contiguous());
    out.push_back({name, dtypeOf(t.scalar_type()), keep.back().sizes().vec(),
                   keep.back().data_ptr()});
  }
  writeSafetensors(path, out);
}

std::vector<at::Tensor> StepMemory::step(const Program &program, Context &ctx,
                                         Program::State &state,
                                         const std::vector<at::Tensor> &inputs) {
  int64_t base = TensorMemory::current(), allocations = TensorMemory::systemAllocations();
  TensorMemory::resetPeak();
  std::vector<at::Tensor> out = program.forward(ctx, state, inputs);
  working = std::max(working, TensorMemory::peak() - base);
  if (steps++ > 0)
    laterAllocations += TensorMemory::systemAllocations() - allocations;
  return out;
}

void StepMemory::report(int rank, const Program &program) const {
  std::printf("tdx: rank %d: working memory of a step %lld bytes (planned %lld: the step's "
              "tensors by their lifetimes), %lld tensor allocations reached the system in the "
              "%lld steps after the first (pool %lld bytes)\n",
              rank, static_cast<long long>(working),
              static_cast<long long>(program.plannedStepBytes),
              static_cast<long long>(laterAllocations),
              static_cast<long long>(std::max<int64_t>(0, steps - 1)),
              static_cast<long long>(TensorMemory::pooled()));
  Arena::Counts c = Arena::get().counts();
  std::printf("tdx: rank %d: arena %lld bytes: in %lld steps, %lld planned tensors placed, "
              "%lld refused (their slot was still held), %lld not asked for (ATen made no "
              "new tensor)\n",
              rank, static_cast<long long>(program.arenaBytes), static_cast<long long>(steps),
              static_cast<long long>(c.taken), static_cast<long long>(c.busy),
              static_cast<long long>(c.unasked));
  std::fflush(stdout);
}

Session::Session(const Program &program, Options &o, bool ownsProcess)
    : program_(program), o_(o) {
  if (int threads = threadsPerRank(o)) {
    at::set_num_threads(threads);
    // Debian's torch calls BLAS through OpenBLAS, whose own thread pool
    // at::set_num_threads does not reach.
    if (openblas_set_num_threads)
      openblas_set_num_threads(threads);
  }
  if (ownsProcess) {
    TensorMemory::install();
    TensorMemory::reserveArena(program.arenaBytes);
  }
  // A resumed run takes its state, step, seed and random stream from the
  // checkpoint.
  Origin from = origin(o, !o.serve.empty() || !ownsProcess);
  store_ = std::move(from.store);
  firstStep_ = from.firstStep;
  const uint64_t calls = from.calls;
  steps_ = firstStep_;
  ctx_ = std::make_unique<Context>(program.meshShape, program.axes, o.seed, o.verbose);
  Context &ctx = *ctx_;
  const int rank = ctx.rank();
  ctx.setCollectiveTimeout(o.timeout);
  ctx.setOverlap(o.overlap);
  ctx.setCalls(calls);
  long rssBefore = peakRssKiB();
  auto t0 = std::chrono::steady_clock::now();
  if (store_) {
    // What the file has is read; what it lacks (a model's state dict has
    // no optimizer state) is made by its init program below. A resumed
    // run needs all of it.
    std::vector<std::string> names;
    for (const Program::Param &p : program.params)
      names.push_back(p.name);
    std::vector<bool> inStore =
        givenState(*store_, names, !o.resume.empty(), rank == 0, program.nonPersistent);
    for (size_t i = 0; i < names.size(); ++i)
      if (inStore[i]) {
        const Program::Param &p = program.params[i];
        state_[p.name] =
            readLocal(ctx, *store_, p.name, "parameter", p.shape, p.dtype, parseLayout(p.layout));
      }
  }
  const size_t given = state_.size();
  program.init(ctx, state_);
  auto t1 = std::chrono::steady_clock::now();
  initMs_ = std::chrono::duration<double, std::milli>(t1 - t0).count();
  if (o.verbose) {
    // Growth of this rank's peak resident memory while making its shards.
    int64_t local = 0;
    for (const auto &[name, t] : state_)
      local += t.nbytes();
    std::printf("tdx: rank %d: init %.3f ms, local parameters %.1f MiB, peak RSS grew %.1f "
                "MiB, %d threads\n",
                rank, initMs_, local / 1048576.0, (peakRssKiB() - rssBefore) / 1024.0,
                at::get_num_threads());
    std::printf("tdx: rank %d: %zu of %zu state entries made by their init programs\n", rank,
                state_.size() - given, program.params.size());
    if (store_)
      std::printf("tdx: rank %d: read %llu bytes of %s for %lld bytes of state\n", rank,
                  static_cast<unsigned long long>(store_->bytesRead()), store_->path().c_str(),
                  static_cast<long long>(local));
    std::fflush(stdout);
  }
}

std::vector<at::Tensor> Session::call(const std::vector<at::Tensor> &local, size_t entry) {
  if (entry > program_.entries.size())
    throw std::runtime_error("the program has no entry " + std::to_string(entry));
  if (entry)
    return program_.functionOf(entry)(*ctx_, state_, local);
  if (o_.profile && timedSteps_ == 0)
    Profile::enable();
  auto t0 = std::chrono::steady_clock::now();
  std::vector<at::Tensor> out = memory_.step(program_, *ctx_, state_, local);
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  stepMs_ += ms;
  if (logLevel() >= LogLevel::Debug && ctx_->rank() == 0) {
    std::printf("tdx: step %lld: %.3f ms\n", static_cast<long long>(steps_ + 1), ms);
    std::fflush(stdout);
  }
  peakStep_ = std::max(peakStep_, TensorMemory::peak());
  ++timedSteps_;
  ++steps_;
  return out;
}

std::vector<HostTensor> Session::call(const TensorStore &in, const std::string &prefix,
                                      size_t entry) {
  std::vector<at::Tensor> local;
  const std::vector<Program::Value> &inputs = program_.inputsOf(entry);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Program::Value &v = inputs[i];
    local.push_back(readLocal(*ctx_, in, prefix + "input:" + std::to_string(i),
                              prefix.empty() ? "input" : "batch input", v.shape, v.dtype,
                              parseLayout(v.layout)));
  }
  return gatherOutputs(call(local, entry), entry);
}

std::vector<HostTensor> Session::call(const std::vector<const void *> &inputs, bool local,
                                      size_t entry) {
  const std::vector<Program::Value> &values = program_.inputsOf(entry);
  if (inputs.size() != values.size())
    throw std::runtime_error("a call of entry " + std::to_string(entry) + " with " +
                             std::to_string(inputs.size()) + " inputs; it takes " +
                             std::to_string(values.size()));
  std::vector<at::Tensor> in;
  for (size_t i = 0; i < values.size(); ++i) {
    const Program::Value &v = values[i];
    std::vector<int64_t> offset, size;
    ctx_->box(v.shape, parseLayout(v.layout), offset, size);
    auto caller = [&](const std::vector<int64_t> &shape) {
      return at::from_blob(const_cast<void *>(inputs[i]), shape,
                           at::TensorOptions().dtype(v.dtype));
    };
    if (local) {
      in.push_back(caller(size));
      continue;
    }
    // The box as a view of the caller's tensor: no copy where it is dense
    // (replicated, or sharded on the first dimension).
    at::Tensor t = caller(v.shape);
    for (size_t d = 0; d < size.size(); ++d)
      if (size[d] != v.shape[d])
        t = t.narrow(static_cast<int64_t>(d), offset[d], size[d]);
    in.push_back(t.contiguous());
  }
  return gatherOutputs(call(in, entry), entry);
}

void Session::inputBox(size_t entry, size_t i, std::vector<int64_t> &offset,
                       std::vector<int64_t> &size) {
  const Program::Value &v = program_.inputsOf(entry).at(i);
  ctx_->box(v.shape, parseLayout(v.layout), offset, size);
}

std::vector<HostTensor> Session::gatherOutputs(const std::vector<at::Tensor> &local,
                                               size_t entry) {
  std::vector<HostTensor> global;
  for (size_t i = 0; i < local.size(); ++i) {
    at::Tensor g = gatherOutput(local[i], i, entry);
    if (ctx_->rank() != 0)
      continue;
    auto kept = std::make_shared<at::Tensor>(TensorMemory::unpooled(g).contiguous());
    global.push_back({dtypeOf(kept->scalar_type()), kept->sizes().vec(), kept->data_ptr(),
                      std::shared_ptr<const void>(kept, kept.get())});
  }
  return global;
}

std::unique_ptr<Engine> tdx::rt::openEngine(const void *program, Options &options,
                                            bool ownsProcess) {
  return std::make_unique<Session>(*static_cast<const Program *>(program), options,
                                   ownsProcess);
}

at::Tensor Session::gatherOutput(const at::Tensor &local, size_t i, size_t entry) {
  const Program::Value &v = program_.outputsOf(entry).at(i);
  return ctx_->gather(local, v.shape, parseLayout(v.layout));
}

void Session::writeState(const std::string &path) {
  std::map<std::string, at::Tensor> all;
  for (const Program::Param &p : program_.params) {
    at::Tensor g = ctx_->gather(state_.at(p.name), p.shape, parseLayout(p.layout));
    if (ctx_->rank() == 0)
      all[p.name] = g;
  }
  if (ctx_->rank() == 0)
    save(path, all);
}

void Session::load(const std::string &path) {
  // A local state or a version of a networked store's key.
  std::unique_ptr<TensorStore> opened = openState(path);
  const TensorStore &in = *opened;
  for (const Program::Param &p : program_.params)
    if (in.find(p.name))
      state_[p.name] =
          readLocal(*ctx_, in, p.name, "parameter", p.shape, p.dtype, parseLayout(p.layout));
}

void Session::checkpoint(const std::string &root, int64_t step, bool optimizer, int keep) {
  // Every rank writes its own shards; rank 0 commits. A published version
  // holds no optimizer state.
  auto s0 = std::chrono::steady_clock::now();
  std::vector<at::Tensor> kept;
  std::vector<LocalTensor> local;
  for (const Program::Param &p : program_.params) {
    if (!optimizer && isOptimizerState(p.name))
      continue;
    kept.push_back(state_.at(p.name).contiguous());
    local.push_back({p.name, dtypeOf(kept.back().scalar_type()), p.shape, parseLayout(p.layout),
                     kept.back().data_ptr()});
  }
  std::string dir = saveCheckpoint(
      *ctx_, root, step, local,
      {{"seed", std::to_string(o_.seed)}, {"calls", std::to_string(ctx_->calls())}}, keep);
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count();
  if (o_.verbose && ctx_->rank() == 0) {
    std::printf("tdx: saved %s in %.3f ms\n", dir.c_str(), ms);
    std::fflush(stdout);
  }
}

void Session::report() {
  const int rank = ctx_->rank();
  const int64_t steps = std::max<int64_t>(1, timedSteps_);
  if (o_.profile && rank == 0 && timedSteps_ > 0)
    Profile::totals().print(stepMs_ * 1e-3, steps);
  if (o_.verbose && timedSteps_ > 0) {
    // State stays; a step's working memory (activations, gradients,
    // gathered parameters) comes and goes.
    int64_t stateBytes = 0, optimizerBytes = 0;
    for (const auto &[name, t] : state_)
      (isOptimizerState(name) ? optimizerBytes : stateBytes) += t.nbytes();
    std::printf("tdx: rank %d: state %lld bytes (parameters and buffers %lld, optimizer "
                "%lld), peak tensor memory in a step %lld bytes\n",
                rank, static_cast<long long>(stateBytes + optimizerBytes),
                static_cast<long long>(stateBytes), static_cast<long long>(optimizerBytes),
                static_cast<long long>(peakStep_));
    memory_.report(rank, program_);
    // A pipeline's bubbles, as this rank measured them.
    if (ctx_->pipelineWaitSeconds() > 0)
      std::printf("tdx: rank %d: waited %.3f ms per step for its pipeline peers\n", rank,
                  ctx_->pipelineWaitSeconds() * 1e3 / static_cast<double>(steps));
  }
  ctx_->reportSteps(initMs_, stepMs_, steps);
}
