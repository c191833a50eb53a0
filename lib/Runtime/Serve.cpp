//===- Serve.cpp - the one step engine's request loop and its sources -----===//

#include "tdx/Runtime/Serve.h"
#include "tdx/StateFormat/Checkpoint.h"
#include "tdx/Store/Volumes.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <stdexcept>

using namespace tdx::rt;

int64_t HostTensor::nbytes() const {
  int64_t n = dtypeSize(dtype);
  for (int64_t d : shape)
    n *= d;
  return n;
}

double HostTensor::item() const {
  switch (dtype) {
  case DType::F64:
    return *static_cast<const double *>(data);
  case DType::F32:
    return *static_cast<const float *>(data);
  case DType::I64:
    return static_cast<double>(*static_cast<const int64_t *>(data));
  case DType::BF16: {
    // The top half of a float32.
    uint32_t bits = static_cast<uint32_t>(*static_cast<const uint16_t *>(data)) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  default:
    throw std::runtime_error(std::string("a ") + dtypeName(dtype) +
                             " output is not read as a number");
  }
}

const std::string &Request::arg(size_t i) const {
  if (i >= args.size() + 1 || i == 0)
    throw std::runtime_error("request '" + op + "' lacks argument " + std::to_string(i));
  return args[i - 1];
}

namespace {
/// Fault injection for the tests (TDX_FAULT_STOP_RANK=R:N): rank R says so
/// on stderr and stops itself (SIGSTOP) before its call N, between
/// collectives. A rank stopped by a signal from outside may stop inside an
/// MPI call, holding a lock of Open MPI's shared memory, and hang its peers
/// where no deadline can see; this one is alive but stuck at a known point.
void faultStop(Engine &engine, int64_t call) {
  static const char *spec = std::getenv("TDX_FAULT_STOP_RANK");
  int rank = -1;
  long long at = -1;
  if (!spec || std::sscanf(spec, "%d:%lld", &rank, &at) != 2)
    return;
  if (engine.mesh().rank() == rank && call == at) {
    std::fprintf(stderr, "tdx: rank %d stops itself before call %lld (TDX_FAULT_STOP_RANK)\n",
                 rank, at);
    std::fflush(stderr);
    ::raise(SIGSTOP);
  }
}
} // namespace

void tdx::rt::serve(Engine &engine, Requests &requests) {
  for (int64_t calls = 0;;) {
    Request r = requests.next();
    std::string answer = "ok";
    if (r.op == "ready") {
      answer.append("\t").append(std::to_string(engine.steps()));
    } else if (r.op == "call") {
      // call PATH [ENTRY [PREFIX]]: entry 0 is the main one.
      size_t entry = r.args.size() > 1 ? std::stoul(r.arg(2)) : 0;
      if (entry > engine.entries())
        throw std::runtime_error("a call of entry " + r.arg(2) + ", which the program lacks");
      faultStop(engine, calls++);
      std::vector<HostTensor> out =
          engine.call(requests.inputs(r), r.args.size() > 2 ? r.arg(3) : "", entry);
      requests.called(r, std::move(out), engine.steps());
    } else if (r.op == "state") {
      engine.writeState(r.arg(1));
    } else if (r.op == "load") {
      engine.load(r.arg(1));
    } else if (r.op == "save") {
      engine.checkpoint(r.arg(1), engine.steps(), true, std::stoi(r.arg(2)));
    } else if (r.op == "publish") {
      engine.checkpoint(storeKeyPath(r.arg(1), r.arg(2)), -1, false,
                        r.args.size() > 3 ? std::stoi(r.arg(3)) : 2);
    } else if (r.op == "close") {
      engine.report();
    } else {
      throw std::runtime_error("unknown request '" + r.op + "'");
    }
    engine.mesh().barrier();
    requests.done(r, answer);
    if (r.op == "close")
      return;
  }
}

//===----------------------------------------------------------------------===//
// PipeRequests
//===----------------------------------------------------------------------===//

PipeRequests::PipeRequests(std::string dir, int rank) : dir_(std::move(dir)), rank_(rank) {
  std::ifstream pid(dir_ + "/controller.pid");
  pid >> controller_;
  std::string pipe = dir_ + "/rank" + std::to_string(rank) + ".fifo";
  // Read and write: the pipe never reads as closed between requests.
  fd_ = ::open(pipe.c_str(), O_RDWR);
  if (fd_ < 0)
    throw std::runtime_error("--serve: cannot open " + pipe + " (the runner makes it): " +
                             std::strerror(errno));
}

PipeRequests::~PipeRequests() { ::close(fd_); }

Request PipeRequests::next() {
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
  Request r;
  for (size_t at = 0;;) {
    size_t tab = line.find('\t', at);
    std::string field = line.substr(at, tab == std::string::npos ? tab : tab - at);
    if (at == 0)
      r.op = field;
    else
      r.args.push_back(field);
    if (tab == std::string::npos)
      return r;
    at = tab + 1;
  }
}

const TensorStore &PipeRequests::inputs(const Request &r) {
  in_ = openState(r.arg(1));
  return *in_;
}

void PipeRequests::called(const Request &, std::vector<HostTensor> outputs, int64_t) {
  in_.reset();
  if (rank_ != 0)
    return;
  std::vector<TensorToWrite> out;
  for (size_t i = 0; i < outputs.size(); ++i)
    out.push_back({"output:" + std::to_string(i), outputs[i].dtype, outputs[i].shape,
                   outputs[i].data});
  writeSafetensors(dir_ + "/" + std::to_string(k_) + ".out.safetensors", out);
}

void PipeRequests::done(const Request &, const std::string &answer) {
  if (rank_ != 0)
    return;
  std::string pipe = dir_ + "/reply.fifo";
  int fd = ::open(pipe.c_str(), O_WRONLY | O_NONBLOCK);
  std::string line = answer + "\n";
  bool sent =
      fd >= 0 && ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  if (fd >= 0)
    ::close(fd);
  if (!sent)
    throw std::runtime_error("--serve: cannot answer on " + pipe + ": " + std::strerror(errno));
}

//===----------------------------------------------------------------------===//
// CommandLineRequests
//===----------------------------------------------------------------------===//

CommandLineRequests::CommandLineRequests(const Options &o, int64_t firstStep, int rank)
    : o_(o), rank_(rank) {
  if (!o.saveState.empty() && o.batches.empty())
    throw std::runtime_error("--save-state writes the state after training steps; give "
                             "--batches too (or --dump-params for the state after init)");
  auto saves = [&](int64_t step, bool last) {
    if (!o.save.empty() && ((o.saveEvery > 0 && step % o.saveEvery == 0) || last))
      queue_.push_back({"save", {o.save, std::to_string(o.saveKeep)}});
    if (!o.publish.empty() && ((o.publishEvery > 0 && step % o.publishEvery == 0) || last))
      queue_.push_back({"publish", {o.store, o.publish}});
  };
  if (!o.dumpParams.empty())
    queue_.push_back({"state", {o.dumpParams}});
  if (!o.batches.empty()) {
    // Training: step k reads batch k ("k:input:i") and updates the state.
    for (int64_t step = firstStep; step < o.steps; ++step) {
      queue_.push_back({"call", {o.batches, "0", std::to_string(step) + ":"}});
      saves(step + 1, step + 1 == o.steps);
    }
    if (!o.saveState.empty())
      queue_.push_back({"state", {o.saveState}});
  } else {
    // The state as made (exe.save_init, exe.publish).
    saves(0, true);
    for (int64_t step = 0; !o.inputs.empty() && step < o.steps; ++step)
      queue_.push_back({"call", {o.inputs, "0", ""}});
  }
  queue_.push_back({"close", {}});
}

Request CommandLineRequests::next() {
  Request r = std::move(queue_.front());
  queue_.pop_front();
  return r;
}

const TensorStore &CommandLineRequests::inputs(const Request &r) {
  if (!in_)
    in_ = openState(r.arg(1));
  return *in_;
}

void CommandLineRequests::called(const Request &r, std::vector<HostTensor> outputs,
                                 int64_t step) {
  if (rank_ != 0)
    return;
  // A training run keeps every step's outputs ("k:output:i"); --inputs the
  // last call's.
  const std::string &prefix = r.arg(3);
  for (size_t i = 0; i < outputs.size(); ++i) {
    const HostTensor &t = outputs[i];
    bool loss = t.nbytes() == dtypeSize(t.dtype) &&
                (t.dtype == DType::F32 || t.dtype == DType::F64 || t.dtype == DType::BF16);
    if (o_.progress && i == 0 && !prefix.empty() && loss) {
      std::printf("tdx: step %lld/%lld loss %.9g\n", static_cast<long long>(step),
                  static_cast<long long>(o_.steps), outputs[i].item());
      std::fflush(stdout);
    }
    outputs_[prefix + "output:" + std::to_string(i)] = std::move(outputs[i]);
  }
}

void CommandLineRequests::done(const Request &r, const std::string &) {
  if (r.op != "close" || rank_ != 0 || o_.outputs.empty())
    return;
  std::vector<TensorToWrite> out;
  for (const auto &[name, t] : outputs_)
    out.push_back({name, t.dtype, t.shape, t.data});
  writeSafetensors(o_.outputs, out);
}

//===----------------------------------------------------------------------===//
// Origin, runEngine
//===----------------------------------------------------------------------===//

Origin tdx::rt::origin(Options &o, bool runner) {
  Origin from;
  std::string source = o.resume.empty() ? paramsPath(o) : o.resume;
  if (source.empty())
    return from;
  from.store = openState(source);
  const TensorStore &store = *from.store;
  // A number of the checkpoint's metadata (its step, seed, call count):
  // absent is nullopt; present and not a number, a corrupt checkpoint.
  auto stored = [&](const char *key) -> std::optional<uint64_t> {
    const auto &meta = store.metadata();
    auto it = meta.find(key);
    if (it == meta.end())
      return std::nullopt;
    if (it->second.empty() || it->second.find_first_not_of("0123456789") != std::string::npos)
      throw std::runtime_error("the checkpoint " + store.path() + " is corrupt: its '" + key +
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
      throw std::runtime_error("the checkpoint " + store.path() + " was saved with --seed " +
                               store.metadata().at("seed") +
                               "; resume without --seed or with that seed");
    o.seed = seed;
    from.firstStep = static_cast<int64_t>(number("step"));
    from.calls = number("calls");
  } else if (runner) {
    // A runner started from a checkpoint a runner saved goes on from its
    // step and random stream.
    from.firstStep = static_cast<int64_t>(stored("step").value_or(0));
    from.calls = stored("calls").value_or(0);
  }
  return from;
}

int tdx::rt::runEngine(const Options &o, const std::function<std::unique_ptr<Engine>()> &open,
                       const std::vector<EntryShapes> &shapes) {
  try {
    if (o.generate && shapes.empty())
      throw std::runtime_error("--generate is built for CPU binaries only so far");
    std::unique_ptr<Engine> engine = open();
    const int rank = engine->mesh().rank();
    if (o.generate) {
      serveGeneration(*engine, o, shapes);
    } else if (!o.serve.empty()) {
      PipeRequests requests(o.serve, rank);
      serve(*engine, requests);
    } else {
      CommandLineRequests requests(o, engine->steps(), rank);
      serve(*engine, requests);
    }
    engine->mesh().finish();
    return 0;
  } catch (const std::exception &e) {
    return endRank(e);
  }
}
