//===- Driver.cpp - the command line of model binaries, safetensors I/O ---===//

#include "tdx/Runtime/Runtime.h"
#include "tdx/Runtime/Options.h"
#include "tdx/Runtime/Safetensors.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

using namespace tdx::rt;

namespace {

// The element types model binaries store, as ATen and as safetensors name them.
const std::pair<DType, at::ScalarType> kDtypes[] = {
    {DType::F32, at::kFloat}, {DType::F64, at::kDouble}, {DType::F16, at::kHalf},
    {DType::BF16, at::kBFloat16}, {DType::I64, at::kLong}, {DType::I32, at::kInt},
    {DType::Bool, at::kBool}};

at::ScalarType scalarType(DType t) {
  for (const auto &[d, s] : kDtypes)
    if (d == t)
      return s;
  return at::kFloat;
}

DType storedType(at::ScalarType t) {
  for (const auto &[d, s] : kDtypes)
    if (s == t)
      return d;
  throw std::runtime_error(std::string("tdx: cannot store ") + c10::toString(t) +
                           " tensors in safetensors here");
}

/// This rank's part of the stored global tensor `name`, read alone from the
/// file (never the global tensor), converted to `dtype`.
at::Tensor readLocal(const Context &ctx, const TensorStore &store, const std::string &name,
                     const std::string &what, const std::vector<int64_t> &shape,
                     at::ScalarType dtype, const Layout &layout) {
  const StoredTensor *t = store.find(name);
  if (!t)
    throw std::runtime_error("tdx: " + store.path() + " has no " + what + " '" + name + "'");
  if (t->shape != shape)
    throw std::runtime_error("tdx: " + what + " '" + name + "' in " + store.path() +
                             " has another shape than the program's");
  std::vector<int64_t> offset, size;
  ctx.box(shape, layout, offset, size);
  at::Tensor local = at::empty(size, at::TensorOptions().dtype(scalarType(t->dtype)));
  store.readBox(*t, offset, size, local.data_ptr());
  return local.to(dtype);
}

void save(const std::string &path, const std::map<std::string, at::Tensor> &tensors) {
  std::vector<at::Tensor> keep;
  std::vector<TensorToWrite> out;
  for (const auto &[name, t] : tensors) {
    keep.push_back(t.contiguous());
    out.push_back({name, storedType(t.scalar_type()), keep.back().sizes().vec(),
                   keep.back().data_ptr()});
  }
  writeSafetensors(path, out);
}

} // namespace

int tdx::rt::runMain(int argc, char **argv, const Program &program) {
  Options o;
  if (int code = parseOptions(argc, argv, o); code >= 0)
    return code;
  const std::string &inputs = o.inputs, &outputs = o.outputs, &params = o.params,
                    &dumpParams = o.dumpParams;
  bool verbose = o.verbose;
  int64_t steps = o.steps;
  int rank = 0;
  try {
    Context ctx(program.meshShape, program.axes, o.seed, verbose);
    rank = ctx.rank();
    ctx.setCollectiveTimeout(o.timeout);
    long rssBefore = peakRssKiB();
    auto t0 = std::chrono::steady_clock::now();
    State state;
    if (!params.empty()) {
      TensorStore store(params);
      for (const Program::Param &p : program.params)
        state[p.name] =
            readLocal(ctx, store, p.name, "parameter", p.shape, p.dtype, parseLayout(p.layout));
    } else {
      program.init(ctx, state);
    }
    auto t1 = std::chrono::steady_clock::now();
    if (verbose) {
      // Growth of this rank's peak resident memory while making its shards.
      int64_t local = 0;
      for (const auto &[name, t] : state)
        local += t.nbytes();
      std::printf("tdx: rank %d: init %.3f ms, local parameters %.1f MiB, peak RSS grew %.1f MiB\n",
                  rank, std::chrono::duration<double, std::milli>(t1 - t0).count(),
                  local / 1048576.0, (peakRssKiB() - rssBefore) / 1024.0);
      std::fflush(stdout);
    }
    if (!dumpParams.empty()) {
      std::map<std::string, at::Tensor> all;
      for (const Program::Param &p : program.params) {
        at::Tensor g = ctx.gather(state.at(p.name), p.shape, parseLayout(p.layout));
        if (rank == 0)
          all[p.name] = g;
      }
      if (rank == 0)
        save(dumpParams, all);
    }
    if (!inputs.empty()) {
      TensorStore in(inputs);
      std::vector<at::Tensor> local;
      for (size_t i = 0; i < program.inputs.size(); ++i) {
        const Program::Value &v = program.inputs[i];
        local.push_back(readLocal(ctx, in, "input:" + std::to_string(i), "input", v.shape, v.dtype,
                                  parseLayout(v.layout)));
      }
      if (o.profile)
        Profile::enable();
      auto t2 = std::chrono::steady_clock::now();
      std::vector<at::Tensor> out;
      for (int64_t step = 0; step < steps; ++step)
        out = program.forward(ctx, state, local);
      auto t3 = std::chrono::steady_clock::now();
      if (o.profile && rank == 0) {
        const Profile &p = Profile::totals();
        double step = std::chrono::duration<double>(t3 - t2).count() / steps;
        double rest = step - (p.aten + p.kernels + p.collectives) / steps;
        std::printf("tdx: rank 0 profile per step: step %.3f ms = ATen calls %.3f ms + fused "
                    "kernels %.3f ms + collectives %.3f ms + runtime overhead %.3f ms (%.2f%% "
                    "over the ATen calls and kernels)\n",
                    step * 1e3, p.aten / steps * 1e3, p.kernels / steps * 1e3,
                    p.collectives / steps * 1e3, rest * 1e3,
                    100.0 * rest / ((p.aten + p.kernels) / steps));
        std::vector<std::pair<double, std::string>> ops;
        for (const auto &[name, seconds] : p.byOp)
          ops.push_back({seconds, name});
        std::sort(ops.rbegin(), ops.rend());
        std::printf("tdx: rank 0 ATen calls per step:");
        for (size_t i = 0; i < ops.size() && i < 8; ++i)
          std::printf("%s %s %.3f ms", i ? "," : "", ops[i].second.c_str(),
                      ops[i].first / steps * 1e3);
        std::printf("\n");
        std::fflush(stdout);
      }
      std::map<std::string, at::Tensor> saved;
      for (size_t i = 0; i < out.size(); ++i) {
        at::Tensor g = ctx.gather(out[i], program.outputs[i].shape,
                                  parseLayout(program.outputs[i].layout));
        if (rank == 0)
          saved["output:" + std::to_string(i)] = g;
      }
      if (rank == 0 && !outputs.empty())
        save(outputs, saved);
      long long total = ctx.sumOverWorld(ctx.bytesCommunicated());
      if (verbose && rank == 0)
        std::printf("tdx: %d ranks: init %.3f ms, step %.3f ms, %lld bytes communicated\n",
                    ctx.worldSize(), std::chrono::duration<double, std::milli>(t1 - t0).count(),
                    std::chrono::duration<double, std::milli>(t3 - t2).count() / steps,
                    total / steps);
    }
    ctx.barrier();
    MPI_Finalize();
    return 0;
  } catch (const std::exception &e) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized)
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::string message = e.what();
    if (message.rfind("tdx: ", 0) == 0)
      message = message.substr(5);
    std::fprintf(stderr, "tdx: rank %d: %s\n", rank, message.c_str());
    if (initialized)
      MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
