//===- Session.cu - a rank's CUDA program with its state resident ---------===//
//
// The CUDA backend's Engine (tdx/Runtime/Serve.h): the state lives on the
// rank's GPU between calls; a call's inputs go host-to-device once and its
// outputs come back gathered to rank 0. The binary's command line, the
// runner's requests (--serve) and the SPMD library (Library.cpp) all run it.
//
//===----------------------------------------------------------------------===//

#include "tdx/Runtime/Serve.h"
#include "tdx/Runtime/cuda/Runtime.h"
#include "tdx/Store/Volumes.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>

using namespace tdx::cu;
using tdx::rt::HostTensor;
using tdx::rt::TensorStore;

namespace {

double msSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

/// A device tensor of `shape` holding the host bytes at `host`.
Tensor toDevice(const void *host, const std::vector<int64_t> &shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  if (t.nbytes() > 0)
    checkCuda(cudaMemcpy(t.data(), host, static_cast<size_t>(t.nbytes()), cudaMemcpyHostToDevice),
              "cudaMemcpy of an input to the device");
  return t;
}

/// The host bytes of a device tensor, dense.
std::vector<char> toHost(const Tensor &t) {
  Tensor dense = t.contiguous();
  std::vector<char> host(static_cast<size_t>(dense.nbytes()));
  if (!host.empty())
    checkCuda(cudaMemcpy(host.data(), dense.data(), host.size(), cudaMemcpyDeviceToHost),
              "cudaMemcpy to the host");
  return host;
}

class Session : public tdx::rt::Engine {
public:
  Session(const Program &program, tdx::rt::Options &o, bool ownsProcess)
      : program_(program), o_(o) {
    tdx::rt::Origin from = tdx::rt::origin(o, !o.serve.empty() || !ownsProcess);
    steps_ = from.firstStep;
    ctx_ = std::make_unique<Context>(program.meshShape, program.axes, o.seed, o.verbose);
    Context &ctx = *ctx_;
    ctx.setCollectiveTimeout(o.timeout);
    ctx.setOverlap(o.overlap);
    ctx.setCalls(from.calls);
    // The step's planned tensors live in one device allocation.
    if (program.arenaBytes > 0)
      checkCuda(cudaMalloc(&arena_, static_cast<size_t>(program.arenaBytes)),
                "cudaMalloc of the step's arena (" + std::to_string(program.arenaBytes) +
                    " bytes)");
    tdx::rt::Arena::get().reserve(static_cast<char *>(arena_), program.arenaBytes);
    auto t0 = std::chrono::steady_clock::now();
    if (from.store) {
      // What the file has is read; what it lacks (a model's state dict has
      // no optimizer state) is made by its init program below. A resumed
      // run needs all of it.
      std::vector<std::string> names;
      for (const Program::Param &p : program.params)
        names.push_back(p.name);
      std::vector<bool> inStore =
          tdx::rt::givenState(*from.store, names, !o.resume.empty(), ctx.rank() == 0);
      for (size_t i = 0; i < names.size(); ++i)
        if (inStore[i])
          state_[names[i]] = read(*from.store, program.params[i], "parameter", names[i]);
    }
    const size_t given = state_.size();
    program.init(ctx, state_);
    ctx.synchronize("init");
    initMs_ = msSince(t0);
    if (o.verbose) {
      int64_t local = 0;
      for (const auto &[name, t] : state_)
        local += t.nbytes();
      std::printf("tdx: rank %d: init %.3f ms, local parameters %.1f MiB on the GPU\n",
                  ctx.rank(), initMs_, local / 1048576.0);
      std::printf("tdx: rank %d: %zu of %zu state entries made by their init programs\n",
                  ctx.rank(), state_.size() - given, program.params.size());
      std::fflush(stdout);
    }
  }

  ~Session() override {
    state_.clear();
    tdx::rt::Arena::get().reserve(nullptr, 0);
    if (arena_)
      cudaFree(arena_);
  }

  tdx::rt::Mesh &mesh() override { return *ctx_; }
  int64_t steps() const override { return steps_; }
  size_t entries() const override { return program_.entries.size(); }

  std::vector<HostTensor> call(const TensorStore &in, const std::string &prefix,
                               size_t entry) override {
    std::vector<Tensor> local;
    const std::vector<Program::Value> &inputs = program_.inputsOf(entry);
    for (size_t i = 0; i < inputs.size(); ++i)
      local.push_back(read(in, inputs[i], prefix.empty() ? "input" : "batch input",
                           prefix + "input:" + std::to_string(i)));
    return run(local, entry);
  }

  std::vector<HostTensor> call(const std::vector<const void *> &inputs, bool local,
                               size_t entry) override {
    const std::vector<Program::Value> &values = program_.inputsOf(entry);
    if (inputs.size() != values.size())
      throw std::runtime_error("a call of entry " + std::to_string(entry) + " with " +
                               std::to_string(inputs.size()) + " inputs; it takes " +
                               std::to_string(values.size()));
    std::vector<Tensor> in;
    for (size_t i = 0; i < values.size(); ++i) {
      const Program::Value &v = values[i];
      std::vector<int64_t> offset, size;
      ctx_->box(v.shape, parseLayout(v.layout), offset, size);
      if (local || size == v.shape) {
        in.push_back(toDevice(inputs[i], size, v.dtype));
        continue;
      }
      // This rank's box of the caller's global tensor, gathered on the host.
      const int64_t item = tdx::rt::dtypeSize(v.dtype);
      int64_t n = item;
      for (int64_t d : size)
        n *= d;
      std::vector<char> box(static_cast<size_t>(n));
      const char *global = static_cast<const char *>(inputs[i]);
      tdx::rt::forEachCopyRun(v.shape, offset, size, std::vector<int64_t>(size.size(), 0), size,
                              [&](int64_t a, int64_t b, int64_t count) {
                                std::memcpy(box.data() + b * item, global + a * item,
                                            static_cast<size_t>(count * item));
                              });
      in.push_back(toDevice(box.data(), size, v.dtype));
    }
    return run(in, entry);
  }

  void inputBox(size_t entry, size_t i, std::vector<int64_t> &offset,
                std::vector<int64_t> &size) override {
    const Program::Value &v = program_.inputsOf(entry).at(i);
    ctx_->box(v.shape, parseLayout(v.layout), offset, size);
  }

  void writeState(const std::string &path) override {
    std::vector<std::vector<char>> keep;
    std::vector<tdx::rt::TensorToWrite> all;
    for (const Program::Param &p : program_.params) {
      keep.push_back(gather(state_.at(p.name), p.shape, p.layout));
      all.push_back({p.name, p.dtype, p.shape, keep.back().data()});
    }
    if (ctx_->rank() == 0)
      tdx::rt::writeSafetensors(path, all);
  }

  void load(const std::string &path) override {
    // A local state or a version of a networked store's key.
    std::unique_ptr<TensorStore> opened = tdx::rt::openState(path);
    const TensorStore &in = *opened;
    for (const Program::Param &p : program_.params)
      if (in.find(p.name))
        state_[p.name] = read(in, p, "parameter", p.name);
  }

  void checkpoint(const std::string &root, int64_t step, bool optimizer, int keep) override {
    // Every rank writes its own shards, from host copies; rank 0 commits.
    auto s0 = std::chrono::steady_clock::now();
    std::vector<std::vector<char>> kept;
    std::vector<tdx::rt::LocalTensor> local;
    for (const Program::Param &p : program_.params) {
      if (!optimizer && tdx::rt::isOptimizerState(p.name))
        continue;
      kept.push_back(toHost(state_.at(p.name)));
      local.push_back({p.name, p.dtype, p.shape, parseLayout(p.layout), kept.back().data()});
    }
    std::string dir = tdx::rt::saveCheckpoint(
        *ctx_, root, step, local,
        {{"seed", std::to_string(o_.seed)}, {"calls", std::to_string(ctx_->calls())}}, keep);
    if (o_.verbose && ctx_->rank() == 0) {
      std::printf("tdx: saved %s in %.3f ms\n", dir.c_str(), msSince(s0));
      std::fflush(stdout);
    }
  }

  void report() override {
    if (o_.profile && ctx_->rank() == 0 && timedSteps_ > 0)
      std::printf("tdx: --profile times ATen calls of CPU binaries; a CUDA binary reports "
                  "its step time only\n");
    // With more than one step, the first (lazy kernel loading, cuBLAS
    // set-up) is a warm-up, reported but not in the mean.
    if (timedSteps_ > 1) {
      ctx_->addBytes(-firstStepBytes_);
      ctx_->reportSteps(initMs_, stepMs_ - firstMs_, timedSteps_ - 1, firstMs_);
    } else {
      ctx_->reportSteps(initMs_, stepMs_, std::max<int64_t>(1, timedSteps_));
    }
  }

private:
  const Program &program_;
  tdx::rt::Options &o_;
  std::unique_ptr<Context> ctx_;
  State state_;
  void *arena_ = nullptr;
  int64_t steps_ = 0, timedSteps_ = 0, firstStepBytes_ = 0;
  double initMs_ = 0, stepMs_ = 0, firstMs_ = 0;

  /// This rank's box of the stored global tensor `name`, on the device.
  template <class V>
  Tensor read(const TensorStore &store, const V &v, const std::string &what,
              const std::string &name) {
    const tdx::rt::StoredTensor &t = store.expect(name, what, v.shape);
    if (t.dtype != v.dtype)
      throw std::runtime_error("tdx: " + what + " '" + name + "' in " + store.path() + " is " +
                               tdx::rt::dtypeName(t.dtype) + " but the program takes " +
                               tdx::rt::dtypeName(v.dtype) + "; store it as " +
                               tdx::rt::dtypeName(v.dtype));
    std::vector<int64_t> offset, size;
    ctx_->box(v.shape, parseLayout(v.layout), offset, size);
    int64_t n = tdx::rt::dtypeSize(v.dtype);
    for (int64_t d : size)
      n *= d;
    std::vector<char> host(static_cast<size_t>(n));
    store.readBox(name, offset, size, host.data());
    return toDevice(host.data(), size, v.dtype);
  }

  /// Rank 0 gets the global tensor's bytes.
  std::vector<char> gather(const Tensor &local, const std::vector<int64_t> &shape,
                           const std::string &layout) {
    std::vector<char> host = toHost(local);
    return ctx_->gather(host.data(), static_cast<int64_t>(host.size()), shape, local.dtype(),
                        parseLayout(layout));
  }

  /// Runs entry `entry` on `local` (a main-entry call is a step, timed) and
  /// gathers its outputs to rank 0.
  std::vector<HostTensor> run(const std::vector<Tensor> &local, size_t entry) {
    if (entry > program_.entries.size())
      throw std::runtime_error("the program has no entry " + std::to_string(entry));
    auto s0 = std::chrono::steady_clock::now();
    std::vector<Tensor> out = program_.functionOf(entry)(*ctx_, state_, local);
    ctx_->synchronize(entry ? "call" : "step");
    if (entry == 0) {
      double ms = msSince(s0);
      if (timedSteps_++ == 0)
        firstMs_ = ms, firstStepBytes_ = ctx_->bytesCommunicated();
      stepMs_ += ms;
      ++steps_;
    }
    std::vector<HostTensor> global;
    const std::vector<Program::Value> &values = program_.outputsOf(entry);
    for (size_t i = 0; i < out.size(); ++i) {
      auto bytes =
          std::make_shared<std::vector<char>>(gather(out[i], values[i].shape, values[i].layout));
      if (ctx_->rank() == 0)
        global.push_back({values[i].dtype, values[i].shape, bytes->data(), bytes});
    }
    return global;
  }
};

} // namespace

std::unique_ptr<tdx::rt::Engine> tdx::rt::openEngine(const void *program, Options &options,
                                                     bool ownsProcess) {
  return std::make_unique<Session>(*static_cast<const tdx::cu::Program *>(program), options,
                                   ownsProcess);
}
