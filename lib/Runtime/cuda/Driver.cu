//===- Driver.cu - the command line of CUDA model binaries ----------------===//
//
// The same command line and files as the CPU binaries (tdx/Runtime/Options.h,
// tdx/Runtime/Safetensors.h): each rank reads only its box of every input and
// parameter into host memory, copies it to its GPU, and rank 0 writes the
// gathered outputs.
//
//===----------------------------------------------------------------------===//

#include "tdx/Runtime/Options.h"
#include "tdx/Runtime/cuda/Runtime.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <stdexcept>

using namespace tdx::cu;
using tdx::rt::StoredTensor;
using tdx::rt::TensorStore;

namespace {

Tensor readLocal(const Context &ctx, const TensorStore &store, const std::string &name,
                 const std::string &what, const std::vector<int64_t> &shape, DType dtype,
                 const Layout &layout) {
  const StoredTensor &t = store.expect(name, what, shape);
  if (t.dtype != dtype)
    throw std::runtime_error("tdx: " + what + " '" + name + "' in " + store.path() + " is " +
                             tdx::rt::dtypeName(t.dtype) + " but the program takes " +
                             tdx::rt::dtypeName(dtype) + "; store it as " +
                             tdx::rt::dtypeName(dtype));
  std::vector<int64_t> offset, size;
  ctx.box(shape, layout, offset, size);
  Tensor local = Tensor::empty(size, dtype);
  std::vector<char> host(local.nbytes());
  store.readBox(name, offset, size, host.data());
  checkCuda(cudaMemcpy(local.data(), host.data(), host.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  return local;
}

/// Rank 0 gets the global tensor's bytes.
std::vector<char> gather(Context &ctx, const Tensor &local, const std::vector<int64_t> &shape,
                         const Layout &layout) {
  Tensor dense = local.contiguous();
  std::vector<char> host(dense.nbytes());
  if (!host.empty())
    checkCuda(cudaMemcpy(host.data(), dense.data(), host.size(), cudaMemcpyDeviceToHost),
          "cudaMemcpy");
  return ctx.gather(host.data(), static_cast<int64_t>(host.size()), shape, dense.dtype(), layout);
}

} // namespace

int tdx::cu::runMain(int argc, char **argv, const Program &program) {
  tdx::rt::Options o;
  if (int code = tdx::rt::parseOptions(argc, argv, o); code >= 0)
    return code;
  if (o.signature) {
    std::cout << tdx::rt::signatureJson(program, tdx::rt::dtypeName) << "\n";
    return 0;
  }
  if (!o.serve.empty()) {
    std::cerr << "tdx: --serve (the Python runner) is not built into CUDA binaries yet; run "
                 "a CUDA binary with --inputs or --batches (Executable.run / train)\n";
    return 2;
  }
  try {
    Context ctx(program.meshShape, program.axes, o.seed, o.verbose);
    const int rank = ctx.rank();
    ctx.setCollectiveTimeout(o.timeout);
    ctx.setOverlap(o.overlap);
    // The step's planned tensors live in one device allocation.
    void *arena = nullptr;
    if (program.arenaBytes > 0)
      checkCuda(cudaMalloc(&arena, static_cast<size_t>(program.arenaBytes)),
                "cudaMalloc of the step's arena (" + std::to_string(program.arenaBytes) +
                    " bytes)");
    tdx::rt::Arena::get().reserve(static_cast<char *>(arena), program.arenaBytes);
    auto t0 = std::chrono::steady_clock::now();
    State state;
    if (!o.save.empty() || !o.publish.empty() || !o.resume.empty())
      throw std::runtime_error("--save, --publish and --resume (checkpoints of training runs) "
                               "are not in the CUDA runtime yet; CUDA binaries read parameters "
                               "with --params");
    if (!o.saveState.empty() && o.batches.empty())
      throw std::runtime_error("--save-state writes the state after training steps; give "
                               "--batches too (or --dump-params for the state after init)");
    if (!o.params.empty()) {
      // What the file has is read; what it lacks (a model's state dict has
      // no optimizer state) is made by its init program below.
      TensorStore store(tdx::rt::paramsPath(o));
      std::vector<std::string> names;
      for (const Program::Param &p : program.params)
        names.push_back(p.name);
      std::vector<bool> inStore = tdx::rt::givenState(store, names, false, rank == 0);
      for (size_t i = 0; i < names.size(); ++i)
        if (inStore[i]) {
          const Program::Param &p = program.params[i];
          state[p.name] =
              readLocal(ctx, store, p.name, "parameter", p.shape, p.dtype, parseLayout(p.layout));
        }
    }
    const size_t given = state.size();
    program.init(ctx, state);
    ctx.synchronize("init");
    auto t1 = std::chrono::steady_clock::now();
    if (o.verbose) {
      int64_t local = 0;
      for (const auto &[name, t] : state)
        local += t.nbytes();
      std::printf("tdx: rank %d: init %.3f ms, local parameters %.1f MiB on the GPU\n", rank,
                  std::chrono::duration<double, std::milli>(t1 - t0).count(), local / 1048576.0);
      std::printf("tdx: rank %d: %zu of %zu state entries made by their init programs\n", rank,
                  state.size() - given, program.params.size());
      std::fflush(stdout);
    }
    auto writeState = [&](const std::string &path) {
      std::vector<std::vector<char>> keep;
      std::vector<tdx::rt::TensorToWrite> all;
      for (const Program::Param &p : program.params) {
        keep.push_back(gather(ctx, state.at(p.name), p.shape, parseLayout(p.layout)));
        all.push_back({p.name, p.dtype, p.shape, keep.back().data()});
      }
      if (rank == 0)
        tdx::rt::writeSafetensors(path, all);
    };
    if (!o.dumpParams.empty())
      writeState(o.dumpParams);
    if (!o.batches.empty()) {
      // Training: step k reads batch k and updates the state in place; the
      // outputs of every step (the loss) are written as "k:output:i".
      TensorStore in(o.batches);
      std::vector<std::vector<char>> keep;
      std::vector<tdx::rt::TensorToWrite> saved;
      // With more than one step, the first (lazy kernel loading, cuBLAS
      // set-up) is a warm-up, reported but not in the mean.
      double stepMs = 0, firstMs = -1;
      for (int64_t step = 0; step < o.steps; ++step) {
        std::vector<Tensor> local;
        for (size_t i = 0; i < program.inputs.size(); ++i) {
          const Program::Value &v = program.inputs[i];
          local.push_back(readLocal(ctx, in, std::to_string(step) + ":input:" + std::to_string(i),
                                    "batch input", v.shape, v.dtype, parseLayout(v.layout)));
        }
        ctx.synchronize("batch");
        auto s0 = std::chrono::steady_clock::now();
        std::vector<Tensor> out = program.forward(ctx, state, local);
        ctx.synchronize("train step");
        double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count();
        if (step == 0 && o.steps > 1)
          firstMs = ms, ctx.resetBytes();
        else
          stepMs += ms;
        for (size_t i = 0; i < out.size(); ++i) {
          const Program::Value &v = program.outputs[i];
          keep.push_back(gather(ctx, out[i], v.shape, parseLayout(v.layout)));
          saved.push_back({std::to_string(step) + ":output:" + std::to_string(i), v.dtype,
                           v.shape, keep.back().data()});
        }
      }
      if (rank == 0 && !o.outputs.empty())
        tdx::rt::writeSafetensors(o.outputs, saved);
      if (!o.saveState.empty())
        writeState(o.saveState);
      ctx.reportSteps(o.verbose, std::chrono::duration<double, std::milli>(t1 - t0).count(),
                      stepMs, std::max<int64_t>(1, o.steps - (firstMs >= 0)), firstMs);
    }
    if (!o.inputs.empty()) {
      TensorStore in(o.inputs);
      std::vector<Tensor> local;
      for (size_t i = 0; i < program.inputs.size(); ++i) {
        const Program::Value &v = program.inputs[i];
        local.push_back(readLocal(ctx, in, "input:" + std::to_string(i), "input", v.shape,
                                  v.dtype, parseLayout(v.layout)));
      }
      if (o.profile && rank == 0)
        std::printf("tdx: --profile times ATen calls of CPU binaries; a CUDA binary reports "
                    "its step time only\n");
      std::vector<Tensor> out;
      double firstMs = -1;
      if (o.steps > 1) {  // a warm-up, as in training
        auto w = std::chrono::steady_clock::now();
        out = program.forward(ctx, state, local);
        ctx.synchronize("forward");
        firstMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w)
                      .count();
        ctx.resetBytes();
      }
      const int64_t timed = o.steps - (firstMs >= 0);
      auto t2 = std::chrono::steady_clock::now();
      for (int64_t step = 0; step < timed; ++step)
        out = program.forward(ctx, state, local);
      ctx.synchronize("forward");
      auto t3 = std::chrono::steady_clock::now();
      std::vector<std::vector<char>> keep;
      std::vector<tdx::rt::TensorToWrite> saved;
      for (size_t i = 0; i < out.size(); ++i) {
        const Program::Value &v = program.outputs[i];
        keep.push_back(gather(ctx, out[i], v.shape, parseLayout(v.layout)));
        saved.push_back({"output:" + std::to_string(i), v.dtype, v.shape, keep.back().data()});
      }
      if (rank == 0 && !o.outputs.empty())
        tdx::rt::writeSafetensors(o.outputs, saved);
      ctx.reportSteps(o.verbose, std::chrono::duration<double, std::milli>(t1 - t0).count(),
                      std::chrono::duration<double, std::milli>(t3 - t2).count(), timed, firstMs);
    }
    ctx.finish();
    return 0;
  } catch (const std::exception &e) {
    return tdx::rt::endRank(e);
  }
}
