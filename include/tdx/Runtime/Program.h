//===- Program.h - what an emitted source tells its runtime -------*- C++ -*-===//

#ifndef TDX_RUNTIME_PROGRAM_H
#define TDX_RUNTIME_PROGRAM_H

#include "tdx/StateFormat/Json.h"

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace tdx::rt {

/// A model binary's program, as its emitted main() describes it to runMain:
/// the mesh, every parameter and buffer and every input and output with its
/// global shape, element type and layout text, and the init and forward
/// entries. The CPU runtime instantiates it with ATen types, the CUDA
/// runtime with its own.
template <class Context, class Tensor, class ElementType> struct BasicProgram {
  using State = std::map<std::string, Tensor>;
  std::vector<int64_t> meshShape;
  std::vector<std::string> axes;
  struct Param {
    std::string name;
    std::vector<int64_t> shape;
    ElementType dtype;
    std::string layout;
  };
  std::vector<Param> params;
  /// Names that share another's value (a tied lm_head.weight): (name, the
  /// parameter or buffer it shares), not state of their own.
  std::vector<std::pair<std::string, std::string>> tied;
  /// Buffers registered with persistent=False: state, but not of
  /// model.state_dict().
  std::vector<std::string> nonPersistent;
  /// State whose init program is not pointwise in the global index: it is
  /// read (--params, a checkpoint, a store), never made by init().
  std::vector<std::string> needsParams;
  struct Value {
    std::vector<int64_t> shape;
    ElementType dtype;
    std::string layout;
  };
  std::vector<Value> inputs, outputs;
  /// The most bytes of the step's own tensors alive at once, from their
  /// lifetimes in the emitted program (-1: not planned).
  int64_t plannedStepBytes = -1;
  /// The bytes of the arena the step's planned tensors are placed in
  /// (tdx/Runtime/Arena.h; 0: none).
  int64_t arenaBytes = 0;
  /// Makes every parameter and buffer that `State` lacks by its init
  /// program (sharded: this rank's box); entries already there are kept.
  std::function<void(Context &, State &)> init;
  using Function =
      std::function<std::vector<Tensor>(Context &, State &, const std::vector<Tensor> &)>;
  /// The main entry (a forward or a training step): `inputs` to `outputs`.
  Function forward;
  /// The program's other functions (prog.add_entry: evaluation, logits),
  /// which read the state the main entry writes.
  struct Entry {
    std::string name;
    std::vector<Value> inputs, outputs;
    Function forward;
  };
  std::vector<Entry> entries;
  /// Entry `k`'s inputs and outputs: 0 the main one, k > 0 entries[k - 1].
  const std::vector<Value> &inputsOf(size_t k) const {
    return k ? entries.at(k - 1).inputs : inputs;
  }
  const std::vector<Value> &outputsOf(size_t k) const {
    return k ? entries.at(k - 1).outputs : outputs;
  }
  const Function &functionOf(size_t k) const { return k ? entries.at(k - 1).forward : forward; }
};

/// What `--signature` prints: the program's mesh and, for every parameter
/// and buffer, input and output, its global shape, element type (its
/// safetensors name, through `dtypeName`) and layout, the tied names
/// (name: the one it shares) and the non-persistent buffers, as one JSON
/// object.
template <class P, class DTypeName>
std::string signatureJson(const P &program, DTypeName dtypeName) {
  auto ints = [](const std::vector<int64_t> &xs) {
    json::Array a;
    for (int64_t x : xs)
      a.push_back(json::Value(static_cast<long long>(x)));
    return json::Value(std::move(a));
  };
  auto value = [&](const auto &v) {
    return json::Object{{"shape", ints(v.shape)},
                        {"dtype", json::Value(std::string(dtypeName(v.dtype)))},
                        {"layout", json::Value(v.layout)}};
  };
  json::Array params, inputs, outputs, axes;
  for (const auto &p : program.params) {
    json::Object o = value(p);
    o["name"] = json::Value(p.name);
    params.push_back(json::Value(std::move(o)));
  }
  for (const auto &v : program.inputs)
    inputs.push_back(json::Value(value(v)));
  for (const auto &v : program.outputs)
    outputs.push_back(json::Value(value(v)));
  for (const std::string &a : program.axes)
    axes.push_back(json::Value(a));
  json::Object tied;
  for (const auto &[name, owner] : program.tied)
    tied[name] = json::Value(owner);
  json::Array nonPersistent;
  for (const std::string &name : program.nonPersistent)
    nonPersistent.push_back(json::Value(name));
  json::Array needsParams;
  for (const std::string &name : program.needsParams)
    needsParams.push_back(json::Value(name));
  json::Array entries;
  for (const auto &entry : program.entries) {
    json::Array in, out;
    for (const auto &v : entry.inputs)
      in.push_back(json::Value(value(v)));
    for (const auto &v : entry.outputs)
      out.push_back(json::Value(value(v)));
    json::Object o;
    o["name"] = json::Value(entry.name);
    o["inputs"] = json::Value(std::move(in));
    o["outputs"] = json::Value(std::move(out));
    entries.push_back(json::Value(std::move(o)));
  }
  return json::print(json::Value(json::Object{{"mesh", ints(program.meshShape)},
                                              {"axes", json::Value(std::move(axes))},
                                              {"params", json::Value(std::move(params))},
                                              {"tied", json::Value(std::move(tied))},
                                              {"non_persistent",
                                               json::Value(std::move(nonPersistent))},
                                              {"needs_params",
                                               json::Value(std::move(needsParams))},
                                              {"inputs", json::Value(std::move(inputs))},
                                              {"outputs", json::Value(std::move(outputs))},
                                              {"entries", json::Value(std::move(entries))}}));
}

} // namespace tdx::rt

#endif // TDX_RUNTIME_PROGRAM_H
