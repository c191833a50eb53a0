//===- Driver.cpp - the command line of model binaries, safetensors I/O ---===//

#include "tdx/Runtime/Runtime.h"
#include "tdx/Runtime/Checkpoint.h"
#include "tdx/Runtime/Options.h"
#include "tdx/Runtime/Safetensors.h"
#include "tdx/Runtime/Session.h"

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

namespace {

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
    Session session(program, o, /*ownsProcess=*/true);
    Context &ctx = session.ctx();
    State &state = session.state();
    const int rank = ctx.rank();
    const int64_t firstStep = session.firstStep();
    if (!o.dumpParams.empty())
      session.writeState(o.dumpParams);
    if (!o.serve.empty()) {
      // A runner: calls, state and checkpoints on request (Requests).
      Requests requests(o.serve, rank);
      for (;;) {
        std::vector<std::string> r = requests.next();
        const std::string &op = r[0];
        auto arg = [&](size_t i) -> const std::string & {
          if (i >= r.size())
            throw std::runtime_error("runner request " + std::to_string(requests.count()) +
                                     " (" + op + ") lacks argument " + std::to_string(i));
          return r[i];
        };
        std::string answer = op == "ready" ? "ok\t" + std::to_string(session.steps()) : "ok";
        if (op == "call") {
          // call PATH [ENTRY]: entry 0 is the main one.
          size_t entry = r.size() > 2 ? std::stoul(arg(2)) : 0;
          if (entry > program.entries.size())
            throw std::runtime_error("runner request " + std::to_string(requests.count()) +
                                     " calls entry " + arg(2) + ", which the program lacks");
          TensorStore in(arg(1));
          std::vector<at::Tensor> local;
          const std::vector<Program::Value> &inputs = program.inputsOf(entry);
          for (size_t i = 0; i < inputs.size(); ++i) {
            const Program::Value &v = inputs[i];
            local.push_back(readLocal(ctx, in, "input:" + std::to_string(i), "input", v.shape,
                                      v.dtype, parseLayout(v.layout)));
          }
          std::vector<at::Tensor> out = session.call(local, entry);
          std::map<std::string, at::Tensor> saved;
          for (size_t i = 0; i < out.size(); ++i) {
            at::Tensor g = session.gatherOutput(out[i], i, entry);
            if (rank == 0)
              saved["output:" + std::to_string(i)] = TensorMemory::unpooled(g);
          }
          if (rank == 0)
            save(requests.file(".out.safetensors"), saved);
        } else if (op == "state") {
          session.writeState(arg(1));
        } else if (op == "load") {
          session.load(arg(1));
        } else if (op == "save") {
          session.checkpoint(arg(1), session.steps(), true, std::stoi(arg(2)));
        } else if (op == "publish") {
          session.checkpoint(storeKeyPath(arg(1), arg(2)), -1, false, 2);
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
      session.saveStep(0, true);
    if (!o.batches.empty()) {
      // Training: step k reads batch k and updates the state in place.
      TensorStore in(o.batches);
      std::map<std::string, at::Tensor> saved;
      StepMemory &memory = session.memory();
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
        std::vector<at::Tensor> out = session.call(local);
        peakStep = std::max(peakStep, TensorMemory::peak());
        for (size_t i = 0; i < out.size(); ++i) {
          at::Tensor g = session.gatherOutput(out[i], i);
          if (rank == 0)
            saved[std::to_string(step) + ":output:" + std::to_string(i)] =
                TensorMemory::unpooled(g);
          if (o.progress && rank == 0 && i == 0 && g.numel() == 1) {
            std::printf("tdx: step %lld/%lld loss %.9g\n", static_cast<long long>(step + 1),
                        static_cast<long long>(o.steps), g.item<double>());
            std::fflush(stdout);
          }
        }
        session.saveStep(step + 1, step + 1 == o.steps);
      }
      auto t3 = std::chrono::steady_clock::now();
      if (o.profile && rank == 0)
        Profile::totals().print(std::chrono::duration<double>(t3 - t2).count() - session.saveMs() * 1e-3,
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
        // A pipeline's bubbles, as this rank measured them.
        if (ctx.pipelineWaitSeconds() > 0)
          std::printf("tdx: rank %d: waited %.3f ms per step for its pipeline peers\n", rank,
                      ctx.pipelineWaitSeconds() * 1e3 /
                          static_cast<double>(std::max<int64_t>(1, o.steps - firstStep)));
      }
      if (rank == 0 && !o.outputs.empty())
        save(o.outputs, saved);
      if (!o.saveState.empty())
        session.writeState(o.saveState);
      ctx.reportSteps(o.verbose, session.initMs(),
                      std::chrono::duration<double, std::milli>(t3 - t2).count() -
                          session.saveMs(),
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
      StepMemory &memory = session.memory();
      for (int64_t step = 0; step < o.steps; ++step) {
        out.clear();
        out = session.call(local);
      }
      auto t3 = std::chrono::steady_clock::now();
      if (o.profile && rank == 0)
        Profile::totals().print(std::chrono::duration<double>(t3 - t2).count(), o.steps);
      if (o.verbose)
        memory.report(rank, program);
      std::map<std::string, at::Tensor> saved;
      for (size_t i = 0; i < out.size(); ++i) {
        at::Tensor g = session.gatherOutput(out[i], i);
        if (rank == 0)
          saved["output:" + std::to_string(i)] = g;
      }
      if (rank == 0 && !o.outputs.empty())
        save(o.outputs, saved);
      ctx.reportSteps(o.verbose, session.initMs(),
                      std::chrono::duration<double, std::milli>(t3 - t2).count(), o.steps);
    }
    ctx.finish();
    return 0;
  } catch (const std::exception &e) {
    return endRank(e);
  }
}
