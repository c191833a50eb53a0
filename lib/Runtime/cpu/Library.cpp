//===- Library.cpp - a CPU model in-process: the C ABI of SPMD runners ----===//
//
// An emitted program built as a shared object (tdx-compile --shared) holds
// this file: python/tdx/runner.py loads it into each process of an SPMD
// script (mpirun -np N python3 train.py) and drives one Session per rank
// through these functions. Every rank calls the same functions in the same
// order; inputs come as pointers to the caller's memory (the global tensor,
// of which each rank takes its box, or the rank's own box), outputs are the
// global tensors on every rank.
//
// Errors: one found before any rank communicates (options, a missing file
// checked by every rank alike) returns nonzero, and tdx_error() says why.
// One inside a collective step ends every rank with its message, as a
// binary's ranks do (tdx::rt::endRank), never a hang.
//
//===----------------------------------------------------------------------===//

#include "tdx/Runtime/Session.h"
#include "tdx/Runtime/Checkpoint.h"

#include <mpi.h>

#include <cstdlib>
#include <stdexcept>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

using namespace tdx::rt;

/// The program, from the emitted source in the same shared object.
extern "C" const void *tdx_program();

namespace {

std::string &lastError() {
  static std::string error;
  return error;
}

struct Handle {
  Options options;
  std::unique_ptr<Session> session;
  std::vector<at::Tensor> outputs; // the last call's, global
};

/// Runs `f`; an exception ends every rank with its message.
template <class F> int collective(F f) {
  try {
    f();
    return 0;
  } catch (const std::exception &e) {
    endRank(e);
    std::exit(1);
  }
}

at::Tensor fromCaller(void *data, const std::vector<int64_t> &shape, at::ScalarType dtype) {
  return at::from_blob(data, shape, at::TensorOptions().dtype(dtype));
}

} // namespace

extern "C" {

const char *tdx_error() { return lastError().c_str(); }

/// Options as the binary's command line (argv[0] is a name): --params,
/// --seed, --threads, --collective-timeout, --no-overlap, --verbose.
void *tdx_open(int argc, char **argv) {
  auto h = std::make_unique<Handle>();
  if (int code = parseOptions(argc, argv, h->options); code >= 0) {
    lastError() = "the runner's options were refused (exit " + std::to_string(code) + ")";
    return nullptr;
  }
  // The process's Python owns its exit: MPI ends with it.
  static bool finalizeAtExit = (std::atexit([] {
                                  int initialized = 0, finalized = 0;
                                  MPI_Initialized(&initialized);
                                  MPI_Finalized(&finalized);
                                  if (initialized && !finalized)
                                    MPI_Finalize();
                                }),
                                true);
  (void)finalizeAtExit;
  const auto &program = *static_cast<const Program *>(tdx_program());
  try {
    h->session = std::make_unique<Session>(program, h->options, /*ownsProcess=*/false);
  } catch (const std::exception &e) {
    endRank(e);
    std::exit(1);
  }
  return h.release();
}

int tdx_rank(void *h) { return static_cast<Handle *>(h)->session->ctx().rank(); }

long long tdx_steps(void *h) { return static_cast<Handle *>(h)->session->steps(); }

/// This rank's box of input `i` of entry `entry` (0: the main one): its
/// offset and size per dimension.
void tdx_input_box(void *h, int entry, int i, int64_t *offset, int64_t *size) {
  Session &s = *static_cast<Handle *>(h)->session;
  const Program::Value &v = s.program().inputsOf(entry).at(i);
  std::vector<int64_t> o, z;
  s.ctx().box(v.shape, parseLayout(v.layout), o, z);
  std::copy(o.begin(), o.end(), offset);
  std::copy(z.begin(), z.end(), size);
}

/// One call of entry `entry` (0: the main one, k: program.entries[k-1]):
/// `inputs[i]` points at the global input i (local: at this rank's box of
/// it), dense, of the program's dtype. The outputs are kept for tdx_output.
int tdx_call(void *handle, int entry, void *const *inputs, int local) {
  auto *h = static_cast<Handle *>(handle);
  Session &s = *h->session;
  return collective([&] {
    const Program &program = s.program();
    const std::vector<Program::Value> &inputs_ = program.inputsOf(entry);
    const std::vector<Program::Value> &outputs = program.outputsOf(entry);
    std::vector<at::Tensor> in;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      const Program::Value &v = inputs_[i];
      std::vector<int64_t> offset, size;
      s.ctx().box(v.shape, parseLayout(v.layout), offset, size);
      if (local) {
        in.push_back(fromCaller(inputs[i], size, v.dtype));
        continue;
      }
      // The box as a view of the caller's tensor: no copy where it is dense
      // (replicated, or sharded on the first dimension).
      at::Tensor t = fromCaller(inputs[i], v.shape, v.dtype);
      for (size_t d = 0; d < size.size(); ++d)
        if (size[d] != v.shape[d])
          t = t.narrow(static_cast<int64_t>(d), offset[d], size[d]);
      in.push_back(t.contiguous());
    }
    std::vector<at::Tensor> out = s.call(in, entry);
    h->outputs.clear();
    for (size_t i = 0; i < out.size(); ++i) {
      at::Tensor g = s.gatherOutput(out[i], i, entry);
      if (s.ctx().rank() != 0)
        g = at::empty(outputs[i].shape, at::TensorOptions().dtype(outputs[i].dtype));
      g = g.contiguous();
      checkMpi(MPI_Bcast(g.data_ptr(), static_cast<int>(g.nbytes()), MPI_BYTE, 0, MPI_COMM_WORLD),
               "broadcast of an output");
      h->outputs.push_back(g);
    }
  });
}

/// Copies output `i` of the last call (global, dense) to `dst`.
void tdx_output(void *h, int i, void *dst) {
  const at::Tensor &t = static_cast<Handle *>(h)->outputs.at(i);
  std::memcpy(dst, t.data_ptr(), t.nbytes());
}

int tdx_write_state(void *h, const char *path) {
  return collective([&] { static_cast<Handle *>(h)->session->writeState(path); });
}

int tdx_load(void *h, const char *path) {
  return collective([&] { static_cast<Handle *>(h)->session->load(path); });
}

int tdx_save(void *h, const char *dir, int keep) {
  Session &s = *static_cast<Handle *>(h)->session;
  return collective([&] { s.checkpoint(dir, s.steps(), true, keep); });
}

int tdx_publish(void *h, const char *store, const char *key) {
  return collective(
      [&] { static_cast<Handle *>(h)->session->checkpoint(storeKeyPath(store, key), -1, false, 2); });
}

int tdx_barrier(void *h) {
  return collective([&] { static_cast<Handle *>(h)->session->ctx().barrier(); });
}

/// A directory every rank sees (rank 0 makes it under `base` and sends its
/// name), for the files of state_dict and load_state_dict.
int tdx_shared_dir(void *h, const char *base, char *out, int capacity) {
  return collective([&] {
    std::vector<char> name(static_cast<size_t>(capacity), '\0');
    if (static_cast<Handle *>(h)->session->ctx().rank() == 0) {
      std::string pattern = std::string(base) + "/tdx-runner-XXXXXX";
      if (pattern.size() >= name.size() || !::mkdtemp(pattern.data()))
        throw std::runtime_error("cannot make a directory under " + std::string(base));
      std::copy(pattern.begin(), pattern.end(), name.begin());
    }
    checkMpi(MPI_Bcast(name.data(), capacity, MPI_CHAR, 0, MPI_COMM_WORLD),
             "broadcast of the runner's directory");
    std::memcpy(out, name.data(), name.size());
  });
}

/// Waits for every rank, then frees the session (MPI ends at exit).
int tdx_close(void *handle) {
  auto *h = static_cast<Handle *>(handle);
  int rc = collective([&] { h->session->ctx().barrier(); });
  delete h;
  return rc;
}

} // extern "C"
