//===- Library.cpp - a model in-process: the C ABI of SPMD runners --------===//
//
// An emitted program built as a shared object (tdx-compile --shared, CPU or
// CUDA: each runtime library compiles this file) holds it:
// python/tdx/runner.py loads it into each process of an SPMD script (mpirun
// -np N python3 train.py) and drives one Engine per rank (Serve.h) through
// these functions. Every rank calls the same functions in the same
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

#include "tdx/StateFormat/Checkpoint.h"
#include "tdx/Runtime/Serve.h"

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
  std::unique_ptr<Engine> engine;
  std::vector<HostTensor> outputs; // the last call's, global
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

/// Rank 0's `outputs` on every rank: their count, each one's dtype and
/// shape, then its bytes.
std::vector<HostTensor> broadcast(Mesh &mesh, std::vector<HostTensor> outputs) {
  auto bcast = [](void *data, int64_t bytes, const char *what) {
    checkMpi(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, 0, MPI_COMM_WORLD), what);
  };
  int64_t n = static_cast<int64_t>(outputs.size());
  bcast(&n, sizeof n, "broadcast of the outputs' count");
  outputs.resize(static_cast<size_t>(n));
  for (HostTensor &t : outputs) {
    int64_t head[2] = {static_cast<int64_t>(t.dtype), static_cast<int64_t>(t.shape.size())};
    bcast(head, sizeof head, "broadcast of an output's type");
    t.dtype = static_cast<DType>(head[0]);
    t.shape.resize(static_cast<size_t>(head[1]));
    bcast(t.shape.data(), head[1] * static_cast<int64_t>(sizeof(int64_t)),
          "broadcast of an output's shape");
    if (mesh.rank() != 0) {
      auto bytes = std::make_shared<std::vector<char>>(static_cast<size_t>(t.nbytes()));
      t.data = bytes->data();
      t.owner = bytes;
    }
    bcast(const_cast<void *>(t.data), t.nbytes(), "broadcast of an output");
  }
  return outputs;
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
  Mesh::finalizeAtExit(); // the process's Python owns its exit
  try {
    h->engine = openEngine(tdx_program(), h->options, /*ownsProcess=*/false);
  } catch (const std::exception &e) {
    endRank(e);
    std::exit(1);
  }
  return h.release();
}

int tdx_rank(void *h) { return static_cast<Handle *>(h)->engine->mesh().rank(); }

long long tdx_steps(void *h) { return static_cast<Handle *>(h)->engine->steps(); }

/// This rank's box of input `i` of entry `entry` (0: the main one): its
/// offset and size per dimension.
void tdx_input_box(void *h, int entry, int i, int64_t *offset, int64_t *size) {
  std::vector<int64_t> o, z;
  static_cast<Handle *>(h)->engine->inputBox(entry, i, o, z);
  std::copy(o.begin(), o.end(), offset);
  std::copy(z.begin(), z.end(), size);
}

/// One call of entry `entry` (0: the main one, k: program.entries[k-1]):
/// `inputs[i]` (i < count, the entry's inputs) points at the global input i
/// (local: at this rank's box of it), dense, of the program's dtype. The
/// outputs are kept for tdx_output.
int tdx_call(void *handle, int entry, void *const *inputs, int count, int local) {
  auto *h = static_cast<Handle *>(handle);
  Engine &e = *h->engine;
  return collective([&] {
    if (static_cast<size_t>(entry) > e.entries())
      throw std::runtime_error("the program has no entry " + std::to_string(entry));
    std::vector<const void *> in(inputs, inputs + count);
    h->outputs = broadcast(e.mesh(), e.call(in, local != 0, static_cast<size_t>(entry)));
  });
}

/// Copies output `i` of the last call (global, dense) to `dst`.
void tdx_output(void *h, int i, void *dst) {
  const HostTensor &t = static_cast<Handle *>(h)->outputs.at(i);
  std::memcpy(dst, t.data, static_cast<size_t>(t.nbytes()));
}

int tdx_write_state(void *h, const char *path) {
  return collective([&] { static_cast<Handle *>(h)->engine->writeState(path); });
}

int tdx_load(void *h, const char *path) {
  return collective([&] { static_cast<Handle *>(h)->engine->load(path); });
}

int tdx_save(void *h, const char *dir, int keep) {
  Engine &e = *static_cast<Handle *>(h)->engine;
  return collective([&] { e.checkpoint(dir, e.steps(), true, keep); });
}

int tdx_publish(void *h, const char *store, const char *key, int keep) {
  return collective([&] {
    static_cast<Handle *>(h)->engine->checkpoint(storeKeyPath(store, key), -1, false, keep);
  });
}

int tdx_barrier(void *h) {
  return collective([&] { static_cast<Handle *>(h)->engine->mesh().barrier(); });
}

/// A directory every rank sees (rank 0 makes it under `base` and sends its
/// name), for the files of state_dict and load_state_dict.
int tdx_shared_dir(void *h, const char *base, char *out, int capacity) {
  return collective([&] {
    std::vector<char> name(static_cast<size_t>(capacity), '\0');
    if (static_cast<Handle *>(h)->engine->mesh().rank() == 0) {
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
  int rc = collective([&] { h->engine->mesh().barrier(); });
  delete h;
  return rc;
}

} // extern "C"
