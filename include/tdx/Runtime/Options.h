//===- Options.h - the command line every model binary takes ------*- C++ -*-===//

#ifndef TDX_RUNTIME_OPTIONS_H
#define TDX_RUNTIME_OPTIONS_H

#include <cstdint>
#include <string>
#include <vector>

namespace tdx::rt {

/// How much a run tells (TDX_LOG): `warn`, the default, one line per run
/// (ranks, init, step time, bytes moved) besides warnings and errors;
/// `info` each rank's init, reads and memory too (what --verbose prints);
/// `debug` also a line per step.
enum class LogLevel { Warn, Info, Debug };
/// TDX_LOG's level, read once; an unknown value is named on stderr and
/// taken as `warn`.
LogLevel logLevel();

struct Options {
  std::string inputs, outputs, params, dumpParams;
  /// Training: one batch per step, and the state written after the last.
  std::string batches, saveState;
  /// Checkpoints (tdx/StateFormat/Checkpoint.h): where to save, every how many
  /// steps, how many to keep; where to resume from.
  std::string save, resume;
  int64_t saveEvery = 0;
  /// The tensor store (--store, else $TDX_STORE) and the key whose next
  /// version the parameters are published as, every K steps.
  std::string store, publish;
  int64_t publishEvery = 0;
  int saveKeep = 2;
  uint64_t seed = 0;
  bool seedGiven = false;
  int64_t steps = 1;
  double timeout = 300;
  /// ATen and BLAS threads of each rank (0: see threadsPerRank).
  int threads = 0;
  /// --verbose or TDX_LOG=info: every rank's init, reads and memory.
  bool verbose = logLevel() >= LogLevel::Info;
  bool profile = false;
  /// Rank 0 prints "tdx: step K/N loss L" after each training step.
  bool progress = false;
  /// --no-overlap: every collective is waited for where it starts.
  bool overlap = true;
  /// --signature: print the program's mesh, state, inputs and outputs as
  /// JSON (signatureJson) and exit, without MPI.
  bool signature = false;
  /// --serve DIR: after init, run the controller's requests from DIR
  /// (tdx's runner, python/tdx/runner.py) until it closes.
  std::string serve;
  /// --generate: serve generation requests (a program tdx.trace_generate
  /// made): JSON lines on stdin, tokens as JSON lines on stdout
  /// (Generate.cpp). --eos-token-id, --pad-token-id: the defaults of its
  /// requests; --refresh-from store:KEY: the newest version of KEY between
  /// requests.
  bool generate = false;
  std::vector<int64_t> eos;
  int64_t pad = -1;
  std::string refreshFrom;
};

/// Parses a model binary's command line into `options`. Returns -1 to go on,
/// or the exit code to end with (0 after --help, 2 after a bad option, with
/// the message printed).
int parseOptions(int argc, char **argv, Options &options);

/// Where --params points: `store:KEY` resolved to KEY's directory in the
/// tensor store (throws naming the fix without a store), else as given.
std::string paramsPath(const Options &options);

/// Whether a state is a training step's optimizer state
/// (tdx.trace_train_step names it `optimizer.<param>.<key>`): a model's
/// state dict lacks it, and a run given such --params starts it fresh.
inline bool isOptimizerState(const std::string &name) {
  return name.rfind("optimizer.", 0) == 0;
}

class TensorStore;
/// Which of the program's state entries `names` the --params file or the
/// resumed checkpoint `store` has, as every driver reads them before the
/// init programs make the rest: a resumed run needs all of them; a file
/// with none of the model's (non-optimizer) entries is the wrong file; a
/// model entry it lacks starts from its init program, which `note` says on
/// stderr (rank 0 passes true) unless it is one of `transient` (the
/// program's non-persistent buffers, which no state dict holds). Throws
/// std::runtime_error naming the file.
std::vector<bool> givenState(const TensorStore &store, const std::vector<std::string> &names,
                             bool resume, bool note,
                             const std::vector<std::string> &transient = {});

/// The compute threads a CPU rank uses: --threads, else OMP_NUM_THREADS
/// when set (0: leave ATen's own choice), else the cores the launcher bound
/// the rank to, or, unbound, this machine's cores over the ranks started on
/// it (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS); at least 1.
int threadsPerRank(const Options &options);

/// This process's peak resident memory so far, in KiB.
long peakRssKiB();

} // namespace tdx::rt

#endif // TDX_RUNTIME_OPTIONS_H
