//===- Capture.h - fake tensors and deferred init on libtorch ----*- C++ -*-===//
//
// The capture engine shared by Python (the `tdx` package) and libtorch C++
// users. It works at torch's dispatcher, below autograd, so a training
// step's backward is recorded as torch runs it:
//
//  * Fake tensors report a real device (cpu, or cuda on a machine without a
//    GPU) but own no storage. Every op on one runs through dispatchFake: the
//    op's meta kernel computes the result, which is wrapped as a fake tensor
//    again; views share their base's (empty) storage, in-place ops return
//    their input.
//  * Deferred init: while a module is built under deferredInit, and on its
//    tensors afterwards, every op is recorded in program order (with its
//    schema and constant arguments). Materializing replays the record
//    through ATen in the same order, with the generator state the recording
//    started with, so the values are bitwise those of eager construction.
//
// Two ways lead ops to dispatchFake (docs/capture.md, "Two ways in"): the
// boxed fallback of DispatchKey::Fake, or torch's Python dispatch (a tensor
// subclass and a TorchDispatchMode), which needs no reserved key.
//
// This header includes ATen; keep it out of code that does not capture.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_CAPTURE_CAPTURE_H
#define TDX_CAPTURE_CAPTURE_H

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace c10 {
class OperatorHandle;
} // namespace c10

namespace tdx::capture {

/// An error a user can reach; bindings turn it into a typed Python error.
struct CaptureError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

//===----------------------------------------------------------------------===//
// Fake tensors
//===----------------------------------------------------------------------===//

/// How ops reach the engine: DispatchKey::Fake's fallback, or torch's
/// Python dispatch (key-free; needs the Python hooks the `tdx` package
/// installs). Chosen once per process: TDX_CAPTURE=fake-key or
/// dispatch-mode; fake-key by default, dispatch-mode in a build without the
/// key (TDX_CAPTURE_KEYS=OFF).
enum class CaptureWay { FakeKey, DispatchMode };
CaptureWay captureWay();
/// "fake-key" or "dispatch-mode".
const char *captureWayName();

/// What the key-free way needs from Python, installed by the `tdx` package:
/// `adopt` gives a new fake tensor its Python object (of the fake tensor
/// subclass, whose __torch_dispatch__ calls dispatchFake); `enterFake` and
/// `exitFake` push and pop a TorchDispatchMode that sends every op to
/// dispatchFake; `enterReal` and `exitReal` set aside and restore those
/// modes.
struct PythonHooks {
  std::function<void(const at::Tensor &)> adopt;
  std::function<void()> enterFake, exitFake, enterReal, exitReal;
};
void setPythonHooks(PythonHooks hooks);

/// The engine: runs `op` on the boxed `stack` as a fake tensor op (meta
/// kernels, fake results), recording it (unless `record` is false) into the
/// trace being taken or the deferred recording it belongs to. Both ways
/// call it.
void dispatchFake(const c10::OperatorHandle &op, std::vector<c10::IValue> *stack,
                  bool record = true);

/// While alive, tensor factories on this thread make fake tensors.
/// `fakeCuda`: factories asked for a CUDA device make fake CUDA tensors even
/// without a GPU (without it they are refused by CUDA as usual).
class FakeMode {
public:
  explicit FakeMode(bool fakeCuda = false);
  ~FakeMode();
  FakeMode(const FakeMode &) = delete;
  FakeMode &operator=(const FakeMode &) = delete;

private:
  bool previousInclude_ = false;
  bool previousFakeCuda_;
};

/// While alive, no fake mode and no recording applies on this thread (used
/// to build real tensors, for example from Python data, inside fake mode).
class RealMode {
public:
  RealMode();
  ~RealMode();

private:
  bool previousFake_ = false;
};

bool isFake(const at::Tensor &tensor);
/// A fake tensor with the sizes, strides, dtype and device of `tensor`.
at::Tensor fakeLike(const at::Tensor &tensor);
/// A meta-device tensor with the sizes, strides and dtype of `tensor`.
at::Tensor metaLike(const at::Tensor &tensor);
/// A fake copy of a real tensor (for example one built from Python data in
/// fake mode). While recording, the real value is kept as a constant of the
/// recording, so materializing gives it back.
at::Tensor liftConstant(const at::Tensor &real);

//===----------------------------------------------------------------------===//
// Deferred init
//===----------------------------------------------------------------------===//

/// The sizes, strides and offset of a tensor when an op made it: an
/// in-place view op (squeeze_, t_, ...) later changes them in place.
struct TensorMeta {
  c10::TensorImpl *impl;
  std::vector<int64_t> sizes, strides;
  int64_t offset;
};

/// One recorded op: its schema name, its arguments (tensors are the fake
/// tensors they were called with) and its results, with the results'
/// metadata as the op left it (snapshotResults).
struct RecordedOp {
  std::string name;     // "aten::uniform_"
  std::string overload; // "" or "Tensor"
  std::vector<c10::IValue> arguments;
  std::vector<c10::IValue> results;
  std::vector<TensorMeta> resultMeta;
};

/// Sets `op.results` from `values` and snapshots their metadata.
void snapshotResults(RecordedOp &op, std::vector<c10::IValue> values);

class Recording;

/// Records `self.set_data(newData)` (Python's `tensor.data = ...`), which
/// torch does not route through the dispatcher, then applies it.
void recordSetData(const at::Tensor &self, const at::Tensor &newData);

/// Runs `build` with fake tensors and records every op. The tensors it makes
/// are fake and deferred; later ops on them are recorded too.
std::shared_ptr<Recording> deferredInit(const std::function<void()> &build,
                                        bool fakeCuda = false);

bool isDeferred(const at::Tensor &tensor);

/// The recording a deferred tensor belongs to, or null.
std::shared_ptr<Recording> recordingOf(const at::Tensor &tensor);
/// Runs `build` under deferred init recording into `recording` (which made
/// a module before): more state of that module, such as its optimizer's.
void deferredInitInto(const std::shared_ptr<Recording> &recording,
                      const std::function<void()> &build, bool fakeCuda);

/// A recording lives as long as its owner holds it (the module built by
/// deferred_init keeps it); deferred tensors refer to it weakly.
class Recording : public std::enable_shared_from_this<Recording> {
public:
  Recording() {
    ops_.reserve(4096);
    known_.reserve(4096);
    storageOwner_.reserve(2048);
  }
  /// Replays every recorded op through ATen, in recorded order, with the
  /// generator state recording started with (the global generator is
  /// restored afterwards), and returns the real tensor of each of `tensors`
  /// (deferred tensors of this recording). `device` overrides the recorded
  /// device (for example "cpu" for tensors recorded as fake CUDA).
  std::vector<at::Tensor> materialize(const std::vector<at::Tensor> &tensors,
                                      c10::optional<c10::Device> device = {});
  /// The real values of `tensors` from the ops they depend on alone (a
  /// constructor's `torch.linspace(...).tolist()`), without the rest of
  /// the recording; CaptureError when one of those ops draws at random
  /// (its value depends on every draw before it).
  std::vector<at::Tensor> materializeAncestors(const std::vector<at::Tensor> &tensors);

  const std::vector<RecordedOp> &ops() const { return ops_; }
  size_t size() const { return ops_.size(); }

  // Used by the dispatcher fallback.
  /// Records `op`. Tensors it reads that the recording has not seen yet
  /// (Python and autograd make shallow copies that share a storage) are
  /// first recorded as views of the tensor that made their storage.
  void record(RecordedOp op);
  void setGeneratorState(at::Tensor state) { generatorState_ = std::move(state); }
  /// The seed of the global generator when recording started: the `seed`
  /// of the counter-based random ops in captured IR.
  int64_t seed() const { return seed_; }
  void setSeed(int64_t seed) { seed_ = seed; }

private:
  /// Replays the ops (those `keep` marks, or all) and returns `tensors`' values.
  std::vector<at::Tensor> replay(const std::vector<at::Tensor> &tensors,
                                 c10::optional<c10::Device> device,
                                 const std::vector<bool> *keep);
  int64_t seed_ = 0;
  void bindArgument(const at::Tensor &tensor);
  std::vector<RecordedOp> ops_;
  at::Tensor generatorState_;
  std::unordered_map<const c10::TensorImpl *, bool> known_;
  std::unordered_map<const c10::StorageImpl *, at::Tensor> storageOwner_;
};

//===----------------------------------------------------------------------===//
// Forward tracing
//===----------------------------------------------------------------------===//

/// The ops of one forward pass on fake tensors, as they reach the fake
/// backend: after autograd, so composite ops are decomposed as make_fx
/// sees them.
struct Trace {
  std::vector<RecordedOp> ops;
};

/// While alive: factories make fake tensors, ops on fake tensors are
/// appended to `trace`, and nothing is recorded into deferred-init
/// recordings (the forward pass does not change the module).
class TraceMode {
public:
  explicit TraceMode(std::shared_ptr<Trace> trace);
  ~TraceMode();

private:
  std::shared_ptr<Trace> previous_;
  FakeMode fake_;
};

//===----------------------------------------------------------------------===//
// Capture into the tdx dialect
//===----------------------------------------------------------------------===//

/// A parameter or buffer to declare: its qualified name, its (deferred)
/// tensor, and the name it is tied to when it shares another's value.
struct StateEntry {
  std::string name;
  at::Tensor tensor;
  bool isBuffer = false;
  std::string tiedTo;
  /// False for a buffer registered with persistent=False (not in
  /// model.state_dict()).
  bool persistent = true;
};

/// The tdx IR (MLIR text) declaring every entry with its functionalized init
/// program, built from `recording`: random ops become counter-based tdx
/// random ops keyed by (seed, stream), views become slice/reshape/transpose
/// ops and writes through views become scatters into their base; ops
/// without a first-class tdx op are kept as `tdx.aten`. Throws CaptureError.
/// With `forward`, also `func.func @forward(inputs) -> outputs` from the
/// trace, reading parameters and buffers by name with `tdx.param_ref`.
struct ForwardSpec {
  const Trace *trace;
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> outputs;
  /// The function's name.
  std::string function = "forward";
  /// A training step: every parameter and buffer the trace wrote is written
  /// back with `tdx.assign` (program state updated in place).
  bool writeState = false;
};
std::string captureToMlir(const Recording &recording,
                          const std::vector<StateEntry> &entries, int64_t seed,
                          const ForwardSpec *forward = nullptr);

/// A tdx program parsed once and edited in place: what the Python
/// `tdx.Program` holds. Every edit that fails throws CaptureError naming what
/// is wrong and leaves the program as it was.
class Module {
public:
  struct Impl;
  ~Module();
  /// Parses and verifies MLIR text; throws CaptureError with the diagnostics.
  static std::shared_ptr<Module> parse(const std::string &text);
  std::shared_ptr<Module> clone() const;
  std::string print() const;

  /// Runs a pass pipeline ("builtin.module(...)" or a comma list of passes).
  void runPipeline(const std::string &pipeline);
  /// Declares the mesh `meshName` of `shape` and `axes` unless the program
  /// has it already (then they must match).
  void declareMesh(const std::string &meshName, const std::vector<int64_t> &shape,
                   const std::vector<std::string> &axes);
  /// Places `target` on a mesh (declared as by declareMesh): a parameter or
  /// buffer's qualified name (a tied name places the value it shares),
  /// "input:<i>" for the i-th input of the entry(), or "<function>:input:<i>"
  /// for another entry's. `placements` is DTensor-style
  /// text: "[Shard(0), Replicate]". A `priority` >= 0 (inputs only) makes
  /// the placement a preference at that priority level
  /// (`tdx.sharding_priority`): propagation starts from it, and preferences
  /// that disagree at one level are settled by the cost model instead of
  /// refused. A negative `priority` is the user's own, fixed placement.
  void annotate(const std::string &target, const std::string &meshName,
                const std::vector<int64_t> &shape, const std::vector<std::string> &axes,
                const std::string &placements, int64_t priority = -1);
  /// Places the results of the ops that use the parameter `param` (for
  /// example a norm's weight) on the declared mesh `meshName`, by annotating
  /// them (sequence parallelism: a norm's output stays split by sequence;
  /// users whose results lack a dim the placements split, like a training
  /// step's update of the weight, are left to propagation); with `reads`, the values that read `param` instead (ZeRO-3: a
  /// parameter stored split is gathered where the step reads it).
  void annotateUses(const std::string &param, const std::string &meshName,
                    const std::string &placements, bool reads = false);

  /// A parameter or buffer declaration.
  struct StateInfo {
    std::string name;
    std::vector<int64_t> shape;
    std::string dtype; // MLIR element type: f32, i64, ...
    bool isBuffer;
    std::string tiedTo; // "" unless it shares another name's value
  };
  std::vector<StateInfo> state() const;
  /// The function a model binary runs: @forward (tdx.trace) or @train_step
  /// (tdx.trace_train_step). Inputs ("input:<i>") are its arguments.
  std::string entry() const;
  /// Every function: the entry() first, then the others in program order
  /// (prog.add_entry's).
  std::vector<std::string> entries() const;
  /// Adds `func.func @<name>` of the module `text` (a trace of the same
  /// model) to this program as another entry. It must read only state this
  /// program declares (same name and type) and, unless `writes` (a
  /// generation step writing its key/value cache), write none; `name` must
  /// be new, and the program not yet placed.
  void addEntry(const std::string &text, const std::string &name, bool writes = false);
  /// The argument count of `func.func @<function>`, -1 when there is none.
  int64_t numArguments(const std::string &function) const;
  /// One per argument of `func.func @<function>`: its shape (empty for a
  /// 0-D tensor or a non-tensor) and whether it has a fixed placement
  /// (`tdx.sharding` without `tdx.sharding_priority`).
  std::vector<std::pair<std::vector<int64_t>, bool>>
  argumentShapes(const std::string &function) const;
  /// Whether tdx-partition has run (types are per-rank).
  bool isPartitioned() const;
  /// Whether propagation has placed the ops (`tdx.shardings`).
  bool isPlaced() const;
  /// Whether the program's communication is the user's: tdx.mpi's or
  /// torch's collectives recorded as `tdx::` calls (python/tdx/collectives.py).
  bool hasUserCollectives() const;
  /// Whether a function has a manual region (tdx.to_local).
  bool hasManualRegions() const;
  /// The `tdx.mesh` declarations.
  /// Folds mesh axes (`tdx.mesh ... ranks`): axis i runs on `ranks[i]`
  /// processes, 1 (each rank computes every shard of it) or its size.
  void setMeshRanks(const std::string &meshName, const std::vector<int64_t> &ranks);
  /// Mixed precision's reduce dtype: every collective that sums a narrower
  /// float sums in `type` ("f32", "f64"; the module's `tdx.reduce_type`).
  void setReduceType(const std::string &type);
  /// The bytes a rank may hold at the step's peak (`tdx.memory_budget`,
  /// which tdx-recompute fits and tdx-memory-report checks when the step
  /// is compiled).
  void setMemoryBudget(int64_t bytes);
  /// Training-mode batch norm's batch is split over mesh axis `axis`; it
  /// takes the global batch's statistics or each shard's (`statistics`
  /// "global" or "local"; the module's `tdx.batch_norm`).
  void setBatchNorm(const std::string &axis, const std::string &statistics);
  /// A pipeline over mesh axis `axis` (the module's `tdx.pipeline`, which
  /// tdx-split-stages and tdx-schedule-pipeline read; the dialect checks it).
  void setPipeline(const std::string &axis, int64_t microbatches, const std::string &schedule,
                   int64_t stagesPerRank);
  struct MeshInfo {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<std::string> axes;
    /// Processes per axis: `shape` unless axes are folded.
    std::vector<int64_t> ranks;
  };
  std::vector<MeshInfo> meshes() const;

  /// The ops of `func.func @<function>` as JSON, for tools that interpret
  /// programs (the test suite's reference executor): a list of
  /// {"name", "operands", "results", "types", "attrs"} in program order,
  /// with value names "argN" / "vN", types as {"shape", "dtype"}, and
  /// attributes as JSON numbers, strings, lists and objects (placements as
  /// their text). Also "args": the function's argument types and
  /// "tdx.sharding" texts.
  std::string functionToJson(const std::string &function) const;

private:
  Module();
  std::unique_ptr<Impl> impl;
};

/// Every op the tdx dialect registers, with whether it has a sharding rule
/// (ShardingRuleOpInterface): the registry the op-coverage tests read.
std::vector<std::pair<std::string, bool>> dialectOps();
/// The dialect's enums (ODS): each one's name and its cases' spellings, by
/// value (ReduceKind: sum, avg, max, min).
std::vector<std::pair<std::string, std::vector<std::string>>> dialectEnums();

} // namespace tdx::capture

#endif // TDX_CAPTURE_CAPTURE_H
