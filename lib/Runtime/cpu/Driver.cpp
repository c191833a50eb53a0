//===- Driver.cpp - the command line of model binaries, safetensors I/O ---===//

#include "tdx/Runtime/Runtime.h"

#include "llvm/Support/JSON.h"

#include <mpi.h>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

using namespace tdx::rt;

namespace {

// The safetensors dtype names of the element types model binaries store.
const std::pair<const char *, at::ScalarType> kDtypes[] = {
    {"F32", at::kFloat}, {"F64", at::kDouble}, {"F16", at::kHalf}, {"BF16", at::kBFloat16},
    {"I64", at::kLong},  {"I32", at::kInt},    {"BOOL", at::kBool}};

const char *dtypeName(at::ScalarType t) {
  for (const auto &[name, type] : kDtypes)
    if (type == t)
      return name;
  throw std::runtime_error(std::string("tdx: cannot store ") + c10::toString(t) +
                           " tensors in safetensors here");
}

at::ScalarType dtypeOf(const std::string &name) {
  for (const auto &[n, type] : kDtypes)
    if (name == n)
      return type;
  throw std::runtime_error("tdx: unsupported safetensors dtype " + name);
}

} // namespace

std::map<std::string, at::Tensor> tdx::rt::loadSafetensors(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error("tdx: cannot open " + path);
  uint64_t headerSize = 0;
  in.read(reinterpret_cast<char *>(&headerSize), 8);
  in.seekg(0, std::ios::end);
  uint64_t fileSize = static_cast<uint64_t>(in.tellg());
  if (!in || headerSize == 0 || headerSize + 8 > fileSize)
    throw std::runtime_error("tdx: " + path + " is not a safetensors file (bad header size)");
  std::string header(headerSize, '\0');
  in.seekg(8);
  in.read(header.data(), static_cast<std::streamsize>(headerSize));
  llvm::Expected<llvm::json::Value> json = llvm::json::parse(header);
  if (!json) {
    llvm::consumeError(json.takeError());
    throw std::runtime_error("tdx: " + path + " has a corrupt safetensors header");
  }
  const llvm::json::Object *root = json->getAsObject();
  if (!root)
    throw std::runtime_error("tdx: " + path + " has a corrupt safetensors header");
  std::map<std::string, at::Tensor> out;
  uint64_t dataSize = fileSize - 8 - headerSize;
  for (const auto &[key, value] : *root) {
    if (key == "__metadata__")
      continue;
    const llvm::json::Object *entry = value.getAsObject();
    const llvm::json::Array *shape = entry ? entry->getArray("shape") : nullptr;
    const llvm::json::Array *offsets = entry ? entry->getArray("data_offsets") : nullptr;
    std::optional<llvm::StringRef> dtype = entry ? entry->getString("dtype") : std::nullopt;
    if (!shape || !offsets || offsets->size() != 2 || !dtype)
      throw std::runtime_error("tdx: " + path + ": entry " + key.str() + " is malformed");
    std::vector<int64_t> sizes;
    for (const llvm::json::Value &d : *shape)
      sizes.push_back(d.getAsInteger().value_or(-1));
    uint64_t begin = (*offsets)[0].getAsUINT64().value_or(~0ull);
    uint64_t end = (*offsets)[1].getAsUINT64().value_or(~0ull);
    at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(dtypeOf(dtype->str())));
    if (begin > end || end > dataSize || end - begin != t.nbytes())
      throw std::runtime_error("tdx: " + path + ": entry " + key.str() +
                               " has data offsets that do not match its shape (truncated or "
                               "corrupt file)");
    in.seekg(static_cast<std::streamoff>(8 + headerSize + begin));
    in.read(static_cast<char *>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    if (!in)
      throw std::runtime_error("tdx: " + path + " is truncated");
    out[key.str()] = t;
  }
  return out;
}

void tdx::rt::saveSafetensors(const std::string &path,
                              const std::map<std::string, at::Tensor> &tensors) {
  llvm::json::Object header;
  uint64_t offset = 0;
  std::vector<at::Tensor> data;
  for (const auto &[name, t] : tensors) {
    at::Tensor c = t.contiguous();
    llvm::json::Array shape;
    for (int64_t d : c.sizes())
      shape.push_back(d);
    header[name] = llvm::json::Object{{"dtype", dtypeName(c.scalar_type())},
                                      {"shape", std::move(shape)},
                                      {"data_offsets", llvm::json::Array{offset, offset + c.nbytes()}}};
    offset += c.nbytes();
    data.push_back(c);
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::json::Value(std::move(header));
  os.flush();
  while (text.size() % 8)
    text += ' ';
  // Write to a temporary file and rename: a reader never sees half a file.
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    uint64_t size = text.size();
    out.write(reinterpret_cast<const char *>(&size), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const at::Tensor &t : data)
      out.write(static_cast<const char *>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    if (!out)
      throw std::runtime_error("tdx: cannot write " + path);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw std::runtime_error("tdx: cannot write " + path);
}

static long peakRssKiB() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

int tdx::rt::runMain(int argc, char **argv, const Program &program) {
  std::string inputs, outputs, params, dumpParams;
  uint64_t seed = 0;
  int64_t steps = 1;
  double timeout = 300;
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc)
        throw std::runtime_error("tdx: " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--inputs")
      inputs = value();
    else if (a == "--outputs")
      outputs = value();
    else if (a == "--params")
      params = value();
    else if (a == "--dump-params")
      dumpParams = value();
    else if (a == "--seed")
      seed = std::stoull(value());
    else if (a == "--collective-timeout")
      timeout = std::stod(value());
    else if (a == "--steps")
      steps = std::max<int64_t>(1, std::stoll(value()));
    else if (a == "--verbose")
      verbose = true;
    else if (a == "--help" || a == "-h") {
      std::cout << "usage: mpirun -np N " << argv[0]
                << " --inputs in.safetensors --outputs out.safetensors\n"
                   "       [--params params.safetensors] [--dump-params out.safetensors]\n"
                   "       [--seed S] [--steps N] [--collective-timeout S] [--verbose]\n"
                   "--steps N runs the forward N times (step time is their mean).\n"
                   "--collective-timeout S (default 300): a collective that does not complete\n"
                   "in S seconds ends every rank with an error naming its mesh axes.\n";
      return 0;
    } else {
      std::cerr << "tdx: unknown option " << a << " (see --help)\n";
      return 2;
    }
  }
  int rank = 0;
  try {
    Context ctx(program.meshShape, program.axes, seed, verbose);
    rank = ctx.rank();
    ctx.setCollectiveTimeout(timeout);
    long rssBefore = peakRssKiB();
    auto t0 = std::chrono::steady_clock::now();
    State state;
    if (!params.empty()) {
      auto global = loadSafetensors(params);
      for (const Program::Param &p : program.params) {
        auto it = global.find(p.name);
        if (it == global.end())
          throw std::runtime_error("tdx: " + params + " has no parameter '" + p.name + "'");
        if (it->second.sizes().vec() != p.shape)
          throw std::runtime_error("tdx: parameter '" + p.name + "' in " + params +
                                   " has another shape than the program's");
        state[p.name] = ctx.localPart(it->second.to(p.dtype), parseLayout(p.layout));
      }
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
        saveSafetensors(dumpParams, all);
    }
    if (!inputs.empty()) {
      auto in = loadSafetensors(inputs);
      std::vector<at::Tensor> local;
      for (size_t i = 0; i < program.inputs.size(); ++i) {
        auto it = in.find("input:" + std::to_string(i));
        if (it == in.end())
          throw std::runtime_error("tdx: " + inputs + " has no 'input:" + std::to_string(i) + "'");
        local.push_back(ctx.localPart(it->second, parseLayout(program.inputs[i].layout)));
      }
      auto t2 = std::chrono::steady_clock::now();
      std::vector<at::Tensor> out;
      for (int64_t step = 0; step < steps; ++step)
        out = program.forward(ctx, state, local);
      auto t3 = std::chrono::steady_clock::now();
      std::map<std::string, at::Tensor> saved;
      for (size_t i = 0; i < out.size(); ++i) {
        at::Tensor g = ctx.gather(out[i], program.outputs[i].shape,
                                  parseLayout(program.outputs[i].layout));
        if (rank == 0)
          saved["output:" + std::to_string(i)] = g;
      }
      if (rank == 0 && !outputs.empty())
        saveSafetensors(outputs, saved);
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
    std::fprintf(stderr, "tdx: rank %d: %s\n", rank, e.what());
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized)
      MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
