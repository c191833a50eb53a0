//===- Driver.cpp - the command line of model binaries, safetensors I/O ---===//

#include "tdx/Runtime/Runtime.h"
#include "tdx/Runtime/Checkpoint.h"
#include "tdx/Runtime/Options.h"
#include "tdx/Runtime/Safetensors.h"

#include <ATen/Parallel.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>

using namespace tdx::rt;

/// OpenBLAS's thread count, when the BLAS ATen loaded is OpenBLAS.
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace {

/// This rank's part of the stored global tensor `name`, read alone from the
/// file (never the global tensor), converted to `dtype`.
at::Tensor readLocal(const Context &ctx, const TensorStore &store, const std::string &name,
                     const std::string &what, const std::vector<int64_t> &shape,
                     at::ScalarType dtype, const Layout &layout) {
  const StoredTensor &t = store.expect(name, what, shape);
  std::vector<int64_t> offset, size;
  ctx.box(shape, layout, offset, size);
  at::Tensor local = at::empty(size, at::TensorOptions().dtype(scalarTypeOf(t.dtype)));
  store.readBox(name, offset, size, local.data_ptr());
  return local.to(dtype);
}

void save(const std::string &path, const std::map<std::string, at::Tensor> &tensors) {
  std::vector<at::Tensor> keep;
  std::vector<TensorToWrite> out;
  for (const auto &[name, t] : tensors) {
    keep.push_back(t.contiguous());
    out.push_back({name, dtypeOf(t.scalar_type()), keep.back().sizes().vec(),
                   keep.back().data_ptr()});
  }
  writeSafetensors(path, out);
}

} // namespace

namespace {

/// What a rank's steps take from the step memory pool (TensorMemory): the
/// most working memory one step held (its peak over what was live when it
/// began) and the tensor allocations that reached the system in the steps
/// after the first, which the pool makes none for a static program.
struct StepMemory {
  int64_t steps = 0, working = 0, laterAllocations = 0;

  std::vector<at::Tensor> step(const Program &program, Context &ctx, State &state,
                               const std::vector<at::Tensor> &inputs) {
    int64_t base = TensorMemory::current(), allocations = TensorMemory::systemAllocations();
    TensorMemory::resetPeak();
    std::vector<at::Tensor> out = program.forward(ctx, state, inputs);
    working = std::max(working, TensorMemory::peak() - base);
    if (steps++ > 0)
      laterAllocations += TensorMemory::systemAllocations() - allocations;
    return out;
  }

  void report(int rank, const Program &program) const {
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
};

/// The ranks' side of --serve DIR (the controller is python/tdx/runner.py).
/// Request k reaches rank r as one line on the pipe DIR/rank<r>.fifo, an op
/// and its arguments separated by tabs; every rank runs it, and rank 0
/// answers "ok" on DIR/reply.fifo once every rank is done. Its tensors are
/// files DIR/k.in.safetensors and DIR/k.out.safetensors. Waiting ranks
/// block on their pipe (no CPU), and end with an error once the
/// controller's process (DIR/controller.pid) is gone, so a killed notebook
/// leaves no rank behind.
class Requests {
public:
  Requests(std::string dir, int rank) : dir_(std::move(dir)) {
    std::ifstream pid(dir_ + "/controller.pid");
    pid >> controller_;
    std::string pipe = dir_ + "/rank" + std::to_string(rank) + ".fifo";
    // Read and write: the pipe never reads as closed between requests.
    fd_ = ::open(pipe.c_str(), O_RDWR);
    if (fd_ < 0)
      throw std::runtime_error("--serve: cannot open " + pipe + " (the runner makes it): " +
                               std::strerror(errno));
  }
  ~Requests() { ::close(fd_); }

  /// The next request's fields (waits for it).
  std::vector<std::string> next() {
    ++k_;
    size_t end;
    while ((end = buffer_.find('\n')) == std::string::npos) {
      pollfd p{fd_, POLLIN, 0};
      int ready = ::poll(&p, 1, 500);
      if (ready < 0 && errno != EINTR)
        throw std::runtime_error(std::string("--serve: poll: ") + std::strerror(errno));
      if (ready <= 0) {
        if (controller_ > 0 && ::kill(controller_, 0) != 0 && errno == ESRCH)
          throw std::runtime_error("the controller (pid " + std::to_string(controller_) +
                                   ") is gone; the runner's ranks end with it");
        continue;
      }
      char chunk[4096];
      ssize_t n = ::read(fd_, chunk, sizeof chunk);
      if (n > 0)
        buffer_.append(chunk, n);
    }
    std::string line = buffer_.substr(0, end);
    buffer_.erase(0, end + 1);
    std::vector<std::string> fields;
    for (size_t at = 0;;) {
      size_t tab = line.find('\t', at);
      fields.push_back(line.substr(at, tab == std::string::npos ? tab : tab - at));
      if (tab == std::string::npos)
        return fields;
      at = tab + 1;
    }
  }

  std::string file(const char *suffix) const {
    return dir_ + "/" + std::to_string(k_) + suffix;
  }

  /// Rank 0's answer to the current request.
  void reply(const std::string &text) const {
    std::string pipe = dir_ + "/reply.fifo";
    int fd = ::open(pipe.c_str(), O_WRONLY | O_NONBLOCK);
    std::string line = text + "\n";
    bool sent = fd >= 0 && ::write(fd, line.data(), line.size()) ==
                               static_cast<ssize_t>(line.size());
    if (fd >= 0)
      ::close(fd);
    if (!sent)
      throw std::runtime_error("--serve: cannot answer on " + pipe + ": " +
                               std::strerror(errno));
  }

  int64_t count() const { return k_; }

private:
  std::string dir_, buffer_;
  int fd_ = -1;
  pid_t controller_ = 0;
  int64_t k_ = 0;
};

} // namespace

int tdx::rt::runMain(int argc, char **argv, const Program &program) {
  Options o;
  if (int code = parseOptions(argc, argv, o); code >= 0)
    return code;
  if (o.signature) {
    std::cout << signatureJson(program, [](at::ScalarType t) { return dtypeName(dtypeOf(t)); })
              << "\n";
    return 0;
  }
  try {
    if (int threads = threadsPerRank(o)) {
      at::set_num_threads(threads);
      // Debian's torch calls BLAS through OpenBLAS, whose own thread pool
      // at::set_num_threads does not reach.
      if (openblas_set_num_threads)
        openblas_set_num_threads(threads);
    }
    TensorMemory::install();
    TensorMemory::reserveArena(program.arenaBytes);
    // A resumed run takes its state, step, seed and random stream from the
    // checkpoint.
    std::string source = o.resume.empty() ? paramsPath(o) : o.resume;
    std::unique_ptr<TensorStore> store;
    int64_t firstStep = 0;
    uint64_t calls = 0;
    if (!source.empty())
      store = std::make_unique<TensorStore>(source);
    // A number of the checkpoint's metadata (its step, seed, call count):
    // absent is nullopt; present and not a number, a corrupt checkpoint.
    auto stored = [&](const char *key) -> std::optional<uint64_t> {
      const auto &meta = store->metadata();
      auto it = meta.find(key);
      if (it == meta.end())
        return std::nullopt;
      if (it->second.empty() || it->second.find_first_not_of("0123456789") != std::string::npos)
        throw std::runtime_error("the checkpoint " + store->path() + " is corrupt: its '" + key +
                                 "' is '" + it->second + "', not a number");
      return std::stoull(it->second);
    };
    if (!o.resume.empty()) {
      auto number = [&](const char *key) {
        if (std::optional<uint64_t> value = stored(key))
          return *value;
        throw std::runtime_error(o.resume + " is not a checkpoint a training run saved "
                                 "(--save DIR); start it with --params instead");
      };
      uint64_t seed = number("seed");
      if (o.seedGiven && seed != o.seed)
        throw std::runtime_error("the checkpoint " + store->path() + " was saved with --seed " +
                                 store->metadata().at("seed") +
                                 "; resume without --seed or with that seed");
      o.seed = seed;
      firstStep = static_cast<int64_t>(number("step"));
      calls = number("calls");
    } else if (!o.serve.empty() && store) {
      // A runner started from a checkpoint a runner saved goes on from its
      // step and random stream.
      firstStep = static_cast<int64_t>(stored("step").value_or(0));
      calls = stored("calls").value_or(0);
    }
    Context ctx(program.meshShape, program.axes, o.seed, o.verbose);
    const int rank = ctx.rank();
    ctx.setCollectiveTimeout(o.timeout);
    ctx.setOverlap(o.overlap);
    ctx.setCalls(calls);
    long rssBefore = peakRssKiB();
    auto t0 = std::chrono::steady_clock::now();
    State state;
    if (store) {
      // What the file has is read; what it lacks (a model's state dict has
      // no optimizer state) is made by its init program below. A resumed
      // run needs all of it.
      std::vector<std::string> names;
      for (const Program::Param &p : program.params)
        names.push_back(p.name);
      std::vector<bool> inStore = givenState(*store, names, !o.resume.empty(), rank == 0);
      for (size_t i = 0; i < names.size(); ++i)
        if (inStore[i]) {
          const Program::Param &p = program.params[i];
          state[p.name] =
              readLocal(ctx, *store, p.name, "parameter", p.shape, p.dtype, parseLayout(p.layout));
        }
    }
    const size_t given = state.size();
    program.init(ctx, state);
    auto t1 = std::chrono::steady_clock::now();
    if (o.verbose) {
      // Growth of this rank's peak resident memory while making its shards.
      int64_t local = 0;
      for (const auto &[name, t] : state)
        local += t.nbytes();
      std::printf("tdx: rank %d: init %.3f ms, local parameters %.1f MiB, peak RSS grew %.1f "
                  "MiB, %d threads\n",
                  rank, std::chrono::duration<double, std::milli>(t1 - t0).count(),
                  local / 1048576.0, (peakRssKiB() - rssBefore) / 1024.0,
                  at::get_num_threads());
      std::printf("tdx: rank %d: %zu of %zu state entries made by their init programs\n", rank,
                  state.size() - given, program.params.size());
      if (store)
        std::printf("tdx: rank %d: read %llu bytes of %s for %lld bytes of state\n", rank,
                    static_cast<unsigned long long>(store->bytesRead()), store->path().c_str(),
                    static_cast<long long>(local));
      std::fflush(stdout);
    }
    auto saveState = [&](const std::string &path) {
      std::map<std::string, at::Tensor> all;
      for (const Program::Param &p : program.params) {
        at::Tensor g = ctx.gather(state.at(p.name), p.shape, parseLayout(p.layout));
        if (rank == 0)
          all[p.name] = g;
      }
      if (rank == 0)
        save(path, all);
    };
    // --save and --publish: every rank writes its own shards; rank 0
    // commits. A published version holds no optimizer state.
    double saveMs = 0;
    auto checkpoint = [&](const std::string &root, int64_t step, bool optimizer, int keep) {
      auto s0 = std::chrono::steady_clock::now();
      std::vector<at::Tensor> kept;
      std::vector<LocalTensor> local;
      for (const Program::Param &p : program.params) {
        if (!optimizer && isOptimizerState(p.name))
          continue;
        kept.push_back(state.at(p.name).contiguous());
        local.push_back({p.name, dtypeOf(kept.back().scalar_type()), p.shape,
                         parseLayout(p.layout), kept.back().data_ptr()});
      }
      std::string dir = saveCheckpoint(ctx, root, step, local,
                                       {{"seed", std::to_string(o.seed)},
                                        {"calls", std::to_string(ctx.calls())}},
                                       keep);
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0)
                      .count();
      saveMs += ms;
      if (o.verbose && rank == 0) {
        std::printf("tdx: saved %s in %.3f ms\n", dir.c_str(), ms);
        std::fflush(stdout);
      }
    };
    std::string published = o.publish.empty() ? "" : storeKeyPath(o.store, o.publish);
    auto saveStep = [&](int64_t step, bool last) {
      if (!o.save.empty() && ((o.saveEvery > 0 && step % o.saveEvery == 0) || last))
        checkpoint(o.save, step, true, o.saveKeep);
      if (!published.empty() && ((o.publishEvery > 0 && step % o.publishEvery == 0) || last))
        checkpoint(published, -1, false, 2);
    };
    if (!o.dumpParams.empty())
      saveState(o.dumpParams);
    if (!o.serve.empty()) {
      // A runner: calls, state and checkpoints on request (Requests).
      Requests requests(o.serve, rank);
      StepMemory memory;
      int64_t steps = firstStep;
      for (;;) {
        std::vector<std::string> r = requests.next();
        const std::string &op = r[0];
        auto arg = [&](size_t i) -> const std::string & {
          if (i >= r.size())
            throw std::runtime_error("runner request " + std::to_string(requests.count()) +
                                     " (" + op + ") lacks argument " + std::to_string(i));
          return r[i];
        };
        std::string answer = op == "ready" ? "ok\t" + std::to_string(steps) : "ok";
        if (op == "call") {
          TensorStore in(arg(1));
          std::vector<at::Tensor> local;
          for (size_t i = 0; i < program.inputs.size(); ++i) {
            const Program::Value &v = program.inputs[i];
            local.push_back(readLocal(ctx, in, "input:" + std::to_string(i), "input", v.shape,
                                      v.dtype, parseLayout(v.layout)));
          }
          std::vector<at::Tensor> out = memory.step(program, ctx, state, local);
          ++steps;
          std::map<std::string, at::Tensor> saved;
          for (size_t i = 0; i < out.size(); ++i) {
            at::Tensor g = ctx.gather(out[i], program.outputs[i].shape,
                                      parseLayout(program.outputs[i].layout));
            if (rank == 0)
              saved["output:" + std::to_string(i)] = TensorMemory::unpooled(g);
          }
          if (rank == 0)
            save(requests.file(".out.safetensors"), saved);
        } else if (op == "state") {
          saveState(arg(1));
        } else if (op == "load") {
          TensorStore in(arg(1));
          for (const Program::Param &p : program.params)
            if (in.find(p.name))
              state[p.name] = readLocal(ctx, in, p.name, "parameter", p.shape, p.dtype,
                                        parseLayout(p.layout));
        } else if (op == "save") {
          checkpoint(arg(1), steps, true, std::stoi(arg(2)));
        } else if (op == "publish") {
          checkpoint(storeKeyPath(arg(1), arg(2)), -1, false, 2);
        } else if (op != "close" && op != "ready") {
          throw std::runtime_error("unknown runner request '" + op + "'");
        }
        ctx.barrier();
        if (rank == 0)
          requests.reply(answer);
        if (op == "close")
          break;
      }
      ctx.finish();
      return 0;
    }
    if (o.batches.empty())
      saveStep(0, true);
    if (!o.batches.empty()) {
      // Training: step k reads batch k and updates the state in place.
      TensorStore in(o.batches);
      std::map<std::string, at::Tensor> saved;
      StepMemory memory;
      int64_t peakStep = 0;
      if (o.profile)
        Profile::enable();
      auto t2 = std::chrono::steady_clock::now();
      for (int64_t step = firstStep; step < o.steps; ++step) {
        std::vector<at::Tensor> local;
        for (size_t i = 0; i < program.inputs.size(); ++i) {
          const Program::Value &v = program.inputs[i];
          local.push_back(readLocal(ctx, in, std::to_string(step) + ":input:" + std::to_string(i),
                                    "batch input", v.shape, v.dtype, parseLayout(v.layout)));
        }
        TensorMemory::resetPeak();
        std::vector<at::Tensor> out = memory.step(program, ctx, state, local);
        peakStep = std::max(peakStep, TensorMemory::peak());
        for (size_t i = 0; i < out.size(); ++i) {
          at::Tensor g = ctx.gather(out[i], program.outputs[i].shape,
                                    parseLayout(program.outputs[i].layout));
          if (rank == 0)
            saved[std::to_string(step) + ":output:" + std::to_string(i)] =
                TensorMemory::unpooled(g);
        }
        saveStep(step + 1, step + 1 == o.steps);
      }
      auto t3 = std::chrono::steady_clock::now();
      if (o.profile && rank == 0)
        Profile::totals().print(std::chrono::duration<double>(t3 - t2).count() - saveMs * 1e-3,
                                std::max<int64_t>(1, o.steps - firstStep));
      if (o.verbose) {
        // State stays; a step's working memory (activations, gradients,
        // gathered parameters) comes and goes.
        int64_t stateBytes = 0, optimizerBytes = 0;
        for (const auto &[name, t] : state)
          (isOptimizerState(name) ? optimizerBytes : stateBytes) += t.nbytes();
        std::printf("tdx: rank %d: state %lld bytes (parameters and buffers %lld, optimizer "
                    "%lld), peak tensor memory in a step %lld bytes\n",
                    rank, static_cast<long long>(stateBytes + optimizerBytes),
                    static_cast<long long>(stateBytes), static_cast<long long>(optimizerBytes),
                    static_cast<long long>(peakStep));
        memory.report(rank, program);
      }
      if (rank == 0 && !o.outputs.empty())
        save(o.outputs, saved);
      if (!o.saveState.empty())
        saveState(o.saveState);
      ctx.reportSteps(o.verbose, std::chrono::duration<double, std::milli>(t1 - t0).count(),
                      std::chrono::duration<double, std::milli>(t3 - t2).count() - saveMs,
                      std::max<int64_t>(1, o.steps - firstStep));
    } else if (!o.saveState.empty()) {
      throw std::runtime_error("--save-state writes the state after training steps; give "
                               "--batches too (or --dump-params for the state after init)");
    }
    if (!o.inputs.empty()) {
      TensorStore in(o.inputs);
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
      StepMemory memory;
      for (int64_t step = 0; step < o.steps; ++step) {
        out.clear();
        out = memory.step(program, ctx, state, local);
      }
      auto t3 = std::chrono::steady_clock::now();
      if (o.profile && rank == 0)
        Profile::totals().print(std::chrono::duration<double>(t3 - t2).count(), o.steps);
      if (o.verbose)
        memory.report(rank, program);
      std::map<std::string, at::Tensor> saved;
      for (size_t i = 0; i < out.size(); ++i) {
        at::Tensor g = ctx.gather(out[i], program.outputs[i].shape,
                                  parseLayout(program.outputs[i].layout));
        if (rank == 0)
          saved["output:" + std::to_string(i)] = g;
      }
      if (rank == 0 && !o.outputs.empty())
        save(o.outputs, saved);
      ctx.reportSteps(o.verbose, std::chrono::duration<double, std::milli>(t1 - t0).count(),
                      std::chrono::duration<double, std::milli>(t3 - t2).count(), o.steps);
    }
    ctx.finish();
    return 0;
  } catch (const std::exception &e) {
    return endRank(e);
  }
}
