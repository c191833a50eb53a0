//===- Serve.h - the one step engine every way of running goes through -*- C++ -*-===//
//
// A rank runs its program as a stream of requests on one Engine (its state
// resident): call an entry, write or load the state, save a checkpoint,
// publish to the tensor store, close. Where the requests come from is the
// only difference between the ways of running a model:
//
//   - PipeRequests: the single controller's (python/tdx/runner.py, which
//     exe.start(), exe.train and exe.run all use), one line per request on a
//     pipe per rank, tensors in files;
//   - CommandLineRequests: a standalone binary's --batches / --inputs loop,
//     the same requests made from its command line.
//
// serve() runs them on either backend: the CPU Session (ATen, Session.h)
// and the CUDA one (cuda/Session.cu) implement Engine. The SPMD library's C
// ABI (Library.cpp) calls the same Engine from the user's process.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_RUNTIME_SERVE_H
#define TDX_RUNTIME_SERVE_H

#include "tdx/Runtime/Mesh.h"
#include "tdx/Runtime/Options.h"
#include "tdx/StateFormat/Safetensors.h"

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <sys/types.h>
#include <vector>

namespace tdx::rt {

/// A global tensor in host memory (rank 0's gathered output), kept alive by
/// `owner`.
struct HostTensor {
  DType dtype;
  std::vector<int64_t> shape;
  const void *data = nullptr;
  std::shared_ptr<const void> owner;
  int64_t nbytes() const;
  /// The value of a one-element tensor, as a double.
  double item() const;
};

/// A rank's program with its state resident, on one backend.
class Engine {
public:
  virtual ~Engine() = default;
  virtual Mesh &mesh() = 0;
  /// Main-entry calls run, counted on from a resumed checkpoint's step.
  virtual int64_t steps() const = 0;
  /// How many other entries the program has (prog.add_entry).
  virtual size_t entries() const = 0;
  /// One call of entry `entry` (0: the main one, a step) on inputs read from
  /// `in` as `prefix + "input:<i>"`, each rank its box; rank 0 gets the
  /// gathered global outputs (other ranks: an empty list).
  virtual std::vector<HostTensor> call(const TensorStore &in, const std::string &prefix,
                                       size_t entry) = 0;
  /// The same on the caller's memory (the SPMD library): `inputs[i]` points
  /// at the global input i (`local`: at this rank's box of it), dense, of
  /// the program's dtype.
  virtual std::vector<HostTensor> call(const std::vector<const void *> &inputs, bool local,
                                       size_t entry) = 0;
  /// This rank's box of input `i` of entry `entry`.
  virtual void inputBox(size_t entry, size_t i, std::vector<int64_t> &offset,
                        std::vector<int64_t> &size) = 0;
  /// Rank 0 writes the gathered global state to the safetensors file `path`.
  virtual void writeState(const std::string &path) = 0;
  /// The state entries `path` holds replace this rank's.
  virtual void load(const std::string &path) = 0;
  /// A crash-safe sharded checkpoint under `root` (step -1: a store's
  /// version); without `optimizer`, no optimizer state.
  virtual void checkpoint(const std::string &root, int64_t step, bool optimizer, int keep) = 0;
  /// --verbose's and --profile's lines on the calls run so far.
  virtual void report() = 0;
};

/// One request: an op and its arguments, as the runner sends them.
///   ready                 answered "ok<TAB><steps>" once the state is made
///   call PATH [ENTRY [PREFIX]]
///   state PATH            the gathered state, written by rank 0
///   load PATH
///   save DIR KEEP         a checkpoint of step steps()
///   publish STORE KEY [KEEP]  the next version of KEY (no optimizer state),
///                         keeping the newest KEEP (default 2)
///   close                 reports (--verbose, --profile) and ends
struct Request {
  std::string op;
  std::vector<std::string> args;
  /// Argument `i`; throws naming the request when it lacks it.
  const std::string &arg(size_t i) const;
};

/// Where requests come from, and where a call's outputs go.
class Requests {
public:
  virtual ~Requests() = default;
  virtual Request next() = 0;
  /// The tensors a call reads its inputs from.
  virtual const TensorStore &inputs(const Request &r) = 0;
  /// A call's outputs (rank 0's; empty elsewhere); `step` is steps() after it.
  virtual void called(const Request &r, std::vector<HostTensor> outputs, int64_t step) = 0;
  /// Every rank has finished `r`; `answer` is what the runner is told.
  virtual void done(const Request &r, const std::string &answer) = 0;
};

/// Runs `requests` on `engine` until a close request. An error in a request
/// throws (the driver then ends every rank with its message).
void serve(Engine &engine, Requests &requests);

/// The single controller's requests (--serve DIR; the controller is
/// python/tdx/runner.py). Request k reaches rank r as one line on the pipe
/// DIR/rank<r>.fifo, fields separated by tabs; rank 0 answers on
/// DIR/reply.fifo once every rank is done. A call's outputs go to
/// DIR/<k>.out.safetensors. Waiting ranks block on their pipe (no CPU) and
/// end with an error once the controller's process (DIR/controller.pid) is
/// gone, so a killed notebook leaves no rank behind.
class PipeRequests : public Requests {
public:
  PipeRequests(std::string dir, int rank);
  ~PipeRequests() override;
  Request next() override;
  const TensorStore &inputs(const Request &r) override;
  void called(const Request &r, std::vector<HostTensor> outputs, int64_t step) override;
  void done(const Request &r, const std::string &answer) override;

private:
  std::string dir_, buffer_;
  int rank_, fd_ = -1;
  pid_t controller_ = 0;
  int64_t k_ = 0;
  std::unique_ptr<TensorStore> in_;
};

/// A standalone binary's command line as requests: --dump-params, then
/// --batches (step k reads batch k; --save and --publish every K steps and
/// after the last; --progress; --save-state) or --inputs (--steps calls on
/// the same inputs), or, with neither, --save / --publish of the state as
/// made; --outputs written at the end by rank 0.
class CommandLineRequests : public Requests {
public:
  /// `firstStep`: the step a resumed run goes on from.
  CommandLineRequests(const Options &options, int64_t firstStep, int rank);
  Request next() override;
  const TensorStore &inputs(const Request &r) override;
  void called(const Request &r, std::vector<HostTensor> outputs, int64_t step) override;
  void done(const Request &r, const std::string &answer) override;

private:
  const Options &o_;
  int rank_;
  std::deque<Request> queue_;
  std::unique_ptr<TensorStore> in_;
  std::map<std::string, HostTensor> outputs_;
};

/// Where a session's state comes from, as every backend reads it: the
/// --params or --resume store (null: none), and the step and random-stream
/// call count it goes on from. A resumed run takes its seed from the
/// checkpoint (`options.seed` is set; a different --seed given is refused);
/// a runner (`runner`: --serve or in-process) started from a checkpoint a
/// runner saved goes on from its step and stream too. Throws naming a
/// corrupt checkpoint.
struct Origin {
  std::unique_ptr<TensorStore> store;
  int64_t firstStep = 0;
  uint64_t calls = 0;
};
Origin origin(Options &options, bool runner);

/// The backend's Engine on `program` (the emitted tdx_program()): it reads
/// or makes the state once. `ownsProcess` (a binary, not a library loaded
/// into a Python process): it may set the process's allocators. Each
/// runtime library (CPU, CUDA) defines it.
std::unique_ptr<Engine> openEngine(const void *program, Options &options, bool ownsProcess);

/// The global shapes of an entry's inputs and outputs, as a binary's
/// driver knows them from its program.
struct EntryShapes {
  std::vector<std::vector<int64_t>> inputs, outputs;
};

/// --generate (Generate.cpp): serves generation requests from stdin on a
/// program tdx.trace_generate made (`shapes`: its prefill's and decode's)
/// until the input ends.
void serveGeneration(Engine &engine, const Options &options,
                     const std::vector<EntryShapes> &shapes);

/// Runs a binary's ranks: after `open` made the engine, serves the pipe
/// (--serve), generation requests (--generate; `shapes` are the program's
/// entries', which the driver knows) or the command line's requests, then
/// ends MPI. Returns the exit code (an error ends every rank with its
/// message).
int runEngine(const Options &options, const std::function<std::unique_ptr<Engine>()> &open,
              const std::vector<EntryShapes> &shapes = {});

} // namespace tdx::rt

#endif // TDX_RUNTIME_SERVE_H
