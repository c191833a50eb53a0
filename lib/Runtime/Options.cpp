//===- Options.cpp - the command line every model binary takes ------------===//

#include "tdx/Runtime/Options.h"
#include "tdx/StateFormat/Checkpoint.h"
#include "tdx/StateFormat/Safetensors.h"

#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <thread>

tdx::rt::LogLevel tdx::rt::logLevel() {
  static const LogLevel level = [] {
    const char *v = std::getenv("TDX_LOG");
    std::string s = v ? v : "";
    if (s.empty() || s == "warn" || s == "warning")
      return LogLevel::Warn;
    if (s == "info")
      return LogLevel::Info;
    if (s == "debug")
      return LogLevel::Debug;
    std::fprintf(stderr, "tdx: TDX_LOG=%s is none of warn, info, debug; taken as warn\n",
                 s.c_str());
    return LogLevel::Warn;
  }();
  return level;
}

int tdx::rt::parseOptions(int argc, char **argv, Options &o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc)
        throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    try {
      if (a == "--inputs")
        o.inputs = value();
      else if (a == "--outputs")
        o.outputs = value();
      else if (a == "--params")
        o.params = value();
      else if (a == "--dump-params")
        o.dumpParams = value();
      else if (a == "--batches")
        o.batches = value();
      else if (a == "--save-state")
        o.saveState = value();
      else if (a == "--save")
        o.save = value();
      else if (a == "--save-every")
        o.saveEvery = std::max<int64_t>(1, std::stoll(value()));
      else if (a == "--save-keep")
        o.saveKeep = std::max(0, std::stoi(value()));
      else if (a == "--resume")
        o.resume = value();
      else if (a == "--store")
        o.store = value();
      else if (a == "--publish")
        o.publish = value();
      else if (a == "--publish-every")
        o.publishEvery = std::max<int64_t>(1, std::stoll(value()));
      else if (a == "--seed")
        o.seed = std::stoull(value()), o.seedGiven = true;
      else if (a == "--collective-timeout")
        o.timeout = std::stod(value());
      else if (a == "--steps")
        o.steps = std::max<int64_t>(1, std::stoll(value()));
      else if (a == "--threads") {
        o.threads = std::stoi(value());
        if (o.threads < 1) {
          std::cerr << "tdx: --threads needs a count of at least 1 (see --help)\n";
          return 2;
        }
      } else if (a == "--verbose")
        o.verbose = true;
      else if (a == "--profile")
        o.verbose = o.profile = true;
      else if (a == "--no-overlap")
        o.overlap = false;
      else if (a == "--progress")
        o.progress = true;
      else if (a == "--signature")
        o.signature = true;
      else if (a == "--serve")
        o.serve = value();
      else if (a == "--generate")
        o.generate = true;
      else if (a == "--eos-token-id") {
        std::string list = value();
        for (size_t at = 0; at <= list.size();) {
          size_t comma = std::min(list.find(',', at), list.size());
          o.eos.push_back(std::stoll(list.substr(at, comma - at)));
          at = comma + 1;
        }
      } else if (a == "--pad-token-id")
        o.pad = std::stoll(value());
      else if (a == "--refresh-from")
        o.refreshFrom = value();
      else if (a == "--help" || a == "-h") {
        std::cout
            << "usage: mpirun -np N " << argv[0]
            << " --inputs in.safetensors --outputs out.safetensors\n"
               "       [--params FILE|DIR] [--dump-params out.safetensors]\n"
               "       [--seed S] [--steps N] [--collective-timeout S] [--threads T]\n"
               "       [--verbose] [--profile] [--no-overlap]\n"
               "   or: " << argv[0] << " --signature\n"
               "   or: mpirun -np N " << argv[0] << " --serve DIR [--params ...|--resume DIR] [--seed S]\n"
               "   or: mpirun -np N " << argv[0] << " --generate [--params ...] [--eos-token-id T[,T]]\n"
               "       [--pad-token-id T] [--store PATH --refresh-from store:KEY]\n"
               "   or: mpirun -np N " << argv[0] << " --batches b.safetensors --steps N\n"
               "       --outputs out.safetensors [--save-state state.safetensors] [--params ...]\n"
               "       [--save DIR [--save-every K] [--save-keep N]] [--resume DIR]\n"
               "       [--store PATH] [--publish KEY [--publish-every K]]\n"
               "--inputs: tensors 'input:0', 'input:1', ... (global; each rank reads its part).\n"
               "--outputs: written by rank 0, tensors 'output:0', ... (global, gathered).\n"
               "--params: a safetensors file, or a directory of them (a split checkpoint);\n"
               "each rank reads only its shard of each parameter (optimizer state, named\n"
               "'optimizer.*', starts fresh when the file lacks it). Without it every rank\n"
               "makes its shards from the program's init, with the captured seeds xor S.\n"
               "--dump-params: rank 0 writes the gathered global parameters after init.\n"
               "--steps N runs the forward N times (step time is their mean; CUDA binaries:\n"
               "  with N > 1 the first run is a warm-up, not in the mean).\n"
               "--batches: a training step's program (it updates its parameters and\n"
               "buffers) runs N steps, step k on tensors 'k:input:0', 'k:input:1', ...;\n"
               "--outputs then holds 'k:output:0', ... of every step (the losses).\n"
               "--save-state: rank 0 writes the gathered global parameters and buffers\n"
               "(optimizer state included) after the last step.\n"
               "--save DIR: a sharded checkpoint (docs/checkpoints.md) under DIR: every rank\n"
               "writes its own shards, rank 0 commits DIR/step-N and moves DIR/LATEST. A\n"
               "training run saves after every K steps (--save-every) and after the last;\n"
               "a forward run saves the state after init. --save-keep N (default 2; 0 keeps\n"
               "all) deletes older steps once the new one is committed.\n"
               "--resume DIR: a training run continues from a checkpoint (DIR's LATEST, or\n"
               "a step directory) saved on any mesh and layout: each rank reads only its\n"
               "shards; steps resume at the saved step (batch k is still step k), with the\n"
               "saved seed and random stream.\n"
               "--store PATH (default $TDX_STORE): a tensor store, a directory with one\n"
               "checkpoint root per key whose steps are the key's versions, or\n"
               "ucx://HOST:PORT,... the volumes of a networked store (tdx-volume on each\n"
               "host; each rank puts its shards on its own host's volume). --save and\n"
               "--resume take a key of one too: ucx://HOST:PORT,.../KEY.\n"
               "--publish KEY: the parameters and buffers (not the optimizer state) become\n"
               "the store's next version of KEY, committed atomically: every K steps\n"
               "(--publish-every) and after the last, or after init in a forward run.\n"
               "--params store:KEY reads KEY's newest version from the store.\n"
               "--collective-timeout S (default 300): a collective that does not complete\n"
               "in S seconds ends every rank with an error naming its mesh axes.\n"
               "--threads T (CPU binaries): ATen and BLAS threads per rank (default:\n"
               "OMP_NUM_THREADS if set, else the cores mpirun bound the rank to, or,\n"
               "unbound (--bind-to none), this machine's cores over its ranks).\n"
               "A run prints one line at its end (rank 0: ranks, init time, mean step time,\n"
               "bytes communicated per step) besides warnings and errors.\n"
               "--verbose (or TDX_LOG=info): also each rank's init time, reads and memory;\n"
               "TDX_LOG=debug: also rank 0's time of each step.\n"
               "--profile (CPU binaries): also where rank 0's step time goes: ATen calls,\n"
               "fused kernels, collectives, and the rest (the runtime's own overhead).\n"
               "--progress (CPU binaries): rank 0 prints 'tdx: step K/N loss L' after each\n"
               "training step (exe.train's progress bar reads it).\n"
               "--no-overlap: wait for every all_reduce and reduce_scatter where it starts\n"
               "instead of where its result is first used (to measure what overlap hides).\n"
               "--signature: print the mesh, parameters and buffers, inputs and outputs\n"
               "(global shape, element type, layout) as JSON, and exit (no mpirun needed).\n"
               "--serve DIR: after init, keep the state and run the requests a controller\n"
               "writes into DIR (calls, state, checkpoints) until it closes: what tdx's\n"
               "Python runner, Executable.start() (and exe.run, exe.train), drives; the\n"
               "flags above are made into the same requests (one step engine).\n"
               "--generate: a program made by tdx.trace_generate serves generation requests:\n"
               "rank 0 reads one JSON object a line from stdin, {\"id\": 7, \"input_ids\":\n"
               "[[1, 2, 3], [4, 5]], \"max_new_tokens\": 16, \"do_sample\": false,\n"
               "\"temperature\": 1.0, \"top_k\": null, \"top_p\": null, \"seed\": 0,\n"
               "\"eos_token_id\": 2, \"pad_token_id\": 0} (prompts unpadded, at most the\n"
               "program's batch and prompt width; the options are Hugging Face generate's,\n"
               "the draw the runner's), and writes a JSON line per step, {\"id\": 7,\n"
               "\"step\": 0, \"tokens\": [..]}, then {\"id\": 7, \"done\": true, \"sequences\":\n"
               "[[..], [..]], \"time_to_first_token_ms\": .., \"tokens_per_s\": ..}. A bad\n"
               "request is answered {\"id\": 7, \"error\": \"...\"} and the next one served;\n"
               "end of input ends every rank. --eos-token-id and --pad-token-id give the\n"
               "requests' defaults (else those of a Hugging Face folder given as --params:\n"
               "its generation_config.json or config.json). --refresh-from\n"
               "store:KEY (with --store) reads KEY's newest version, each rank its boxes,\n"
               "before a request whenever a newer one was published (a line\n"
               "{\"refreshed\": PATH, \"ms\": ..} says so); the program stays.\n";
        return 0;
      } else {
        std::cerr << "tdx: unknown option " << a << " (see --help)\n";
        return 2;
      }
    } catch (const std::invalid_argument &) {
      bool number = a == "--seed" || a == "--steps" || a == "--save-every" || a == "--threads" ||
                    a == "--eos-token-id" || a == "--pad-token-id" ||
                    a == "--save-keep" || a == "--publish-every";
      std::cerr << "tdx: " << a << " needs a " << (number ? "number" : "value")
                << " (see --help)\n";
      return 2;
    } catch (const std::out_of_range &) {
      std::cerr << "tdx: the value of " << a << " is out of range\n";
      return 2;
    }
  }
  if (!o.batches.empty() && !o.inputs.empty()) {
    std::cerr << "tdx: --batches and --inputs exclude each other: a training run reads "
                 "its inputs from --batches (see --help)\n";
    return 2;
  }
  auto refuse = [](const char *message) {
    std::cerr << "tdx: " << message << " (see --help)\n";
    return 2;
  };
  if (o.store.empty())
    if (const char *env = std::getenv("TDX_STORE"))
      o.store = env;
  if (o.publishEvery > 0 && o.publish.empty())
    return refuse("--publish-every needs --publish KEY");
  if (o.saveEvery > 0 && o.save.empty())
    return refuse("--save-every needs --save DIR");
  if (!o.resume.empty() && !o.params.empty())
    return refuse("--resume and --params exclude each other: a resumed run reads its state "
                  "from the checkpoint");
  if (o.generate && (!o.serve.empty() || !o.batches.empty() || !o.inputs.empty()))
    return refuse("--generate takes its requests from stdin; drop --serve, --batches and "
                  "--inputs");
  if (!o.refreshFrom.empty() && (!o.generate || o.refreshFrom.rfind("store:", 0) != 0 ||
                                 o.store.empty()))
    return refuse("--refresh-from store:KEY refreshes a --generate binary's weights from the "
                  "store --store PATH names");
  if (!o.serve.empty() && (!o.batches.empty() || !o.inputs.empty()))
    return refuse("--serve takes its calls from the controller; drop --batches and --inputs");
  if (!o.resume.empty() && o.batches.empty() && o.serve.empty())
    return refuse("--resume continues a training run; give --batches too (a forward run "
                  "reads a checkpoint with --params DIR)");
  return -1;
}

std::string tdx::rt::paramsPath(const Options &o) {
  return o.params.rfind("store:", 0) == 0 ? storeKeyPath(o.store, o.params.substr(6)) : o.params;
}

std::vector<bool> tdx::rt::givenState(const TensorStore &store,
                                      const std::vector<std::string> &names, bool resume,
                                      bool note, const std::vector<std::string> &transient) {
  std::vector<bool> given;
  bool model = false, anyModel = false;
  for (const std::string &name : names) {
    given.push_back(store.find(name) != nullptr);
    if (!given.back() && resume)
      throw std::runtime_error("the checkpoint " + store.path() + " has no '" + name +
                               "': it was saved by another program");
    model |= !isOptimizerState(name);
    anyModel |= !isOptimizerState(name) && given.back();
  }
  if (model && !anyModel)
    throw std::runtime_error(store.path() + " has none of the program's parameters (names like '" +
                             names.front() + "'); pass the weights by their qualified names, as "
                             "in model.state_dict()");
  for (size_t i = 0; i < names.size(); ++i)
    if (note && !given[i] && !isOptimizerState(names[i]) &&
        std::find(transient.begin(), transient.end(), names[i]) == transient.end())
      std::fprintf(stderr, "tdx: %s has no '%s'; it starts as its init program makes it\n",
                   store.path().c_str(), names[i].c_str());
  return given;
}

int tdx::rt::threadsPerRank(const Options &o) {
  if (o.threads > 0)
    return o.threads;
  if (std::getenv("OMP_NUM_THREADS"))
    return 0;
  int local = 1;
  for (const char *name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (const char *env = std::getenv(name)) {
      local = std::max(1, std::atoi(env));
      break;
    }
  // The cores this rank may run on: a launcher that bound it (Open MPI binds
  // each of up to 2 ranks to a core) gave it those; an unbound rank shares
  // the machine's with the other local ranks.
  int machine = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  cpu_set_t set;
  int given = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : machine;
  if (given < machine)
    return std::max(1, given);
  return std::max(1, machine / local);
}

long tdx::rt::peakRssKiB() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}
