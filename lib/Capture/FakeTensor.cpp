//===- FakeTensor.cpp - tensors without storage, computed by meta kernels -===//

#include "CaptureInternal.h"
#include "DispatchKeys.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>
#include <torch/version.h>

#include <unordered_map>
#include <unordered_set>

using namespace tdx::capture;

namespace {

thread_local bool tlsFakeCuda = false;
thread_local std::shared_ptr<Trace> tlsTrace;
PythonHooks pythonHooks;

CaptureWay chooseWay() {
  const char *env = std::getenv("TDX_CAPTURE");
  std::string way = env ? env : "";
#if TDX_CAPTURE_KEYS
  if (way.empty() || way == "fake-key")
    return CaptureWay::FakeKey;
#else
  if (way == "fake-key")
    throw CaptureError("tdx: TDX_CAPTURE=fake-key, but this tdx was built without the "
                       "dispatch keys (TDX_CAPTURE_KEYS=OFF); unset TDX_CAPTURE or set it "
                       "to dispatch-mode");
  if (way.empty())
    return CaptureWay::DispatchMode;
#endif
  if (way == "dispatch-mode")
    return CaptureWay::DispatchMode;
  throw CaptureError("tdx: TDX_CAPTURE=" + way +
                     " is not a capture way; use fake-key or dispatch-mode");
}

bool keyFree() { return captureWay() == CaptureWay::DispatchMode; }

void requireHooks() {
  if (!pythonHooks.enterFake)
    throw CaptureError(
        "tdx: the key-free capture (TDX_CAPTURE=dispatch-mode, or a build with "
        "TDX_CAPTURE_KEYS=OFF) runs through torch's Python dispatch: capture from Python "
        "(import tdx), or build tdx with the dispatch keys for C++-only capture");
}

c10::DispatchKeySet fakeKeys(c10::Device device) {
  // The meta backend bit makes libtorch take its paths for tensors without
  // data (at::isTensorSubclassLike, as for torch's own FakeTensor): backward
  // formulas and composites that would read values (prod's zeros, max's
  // ties) compute without reading them. Autograd dispatches to AutogradMeta.
  // TensorImpl adds the autocast key of the highest backend only (meta has
  // none): the device's is added here, so torch.autocast regions record
  // their casts as on a real tensor of the device. The way in adds its own
  // keys (makeFake).
  auto ks = c10::DispatchKeySet(device.is_cuda() ? c10::DispatchKey::CUDA
                                                 : c10::DispatchKey::CPU) |
            c10::DispatchKeySet(c10::BackendComponent::MetaBit) |
            c10::DispatchKeySet(device.is_cuda() ? c10::DispatchKey::AutocastCUDA
                                                 : c10::DispatchKey::AutocastCPU);
#if TDX_CAPTURE_KEYS
  if (!keyFree())
    ks = ks | c10::DispatchKeySet(kFakeKey);
#endif
  return ks;
}

/// While alive, ops called by the engine itself run on meta or real tensors:
/// the fake key's fallback does not apply. (Under torch's Python dispatch the
/// handler runs with its mode set aside already, and other tensor
/// subclasses among the arguments still dispatch to their own handlers.)
struct EngineScope {
#if TDX_CAPTURE_KEYS
  c10::impl::ExcludeDispatchKeyGuard guard{c10::DispatchKeySet(kFakeKey)};
#endif
};

/// Ops that read a tensor's data: a fake tensor has none.
bool readsData(const std::string &name) {
  static const std::unordered_set<std::string> ops = {
      "aten::_local_scalar_dense", "aten::item", "aten::equal", "aten::is_nonzero",
      "aten::allclose"};
  return ops.count(name) != 0;
}

/// Ops whose result's shape depends on their input's values, with the usual
/// rewrite that keeps the shape; "" for the others.
std::string dataDependentShape(const std::string &name) {
  static const std::unordered_map<std::string, std::string> ops = {
      {"aten::nonzero", "keep the shape: a mask (x != 0) used with torch.where, or a "
                        "fixed-size torch.topk of the mask"},
      {"aten::masked_select", "keep the shape: torch.where(mask, x, 0) or x * mask instead of "
                              "x[mask], and sums or means over the mask: (x * mask).sum() / "
                              "mask.sum()"},
      {"aten::_unique2", "keep the shape: torch.sort and a mask of where neighbours differ"},
      {"aten::unique_dim", "keep the shape: torch.sort and a mask of where neighbours differ"},
      {"aten::bincount", "keep the shape: count into a known number of bins n, "
                         "torch.zeros(n).scatter_add(0, x, torch.ones_like(x, dtype=torch.float))"},
      {"aten::unique_consecutive",
       "keep the shape: a mask of where neighbours differ (x[1:] != x[:-1])"}};
  auto it = ops.find(name);
  return it == ops.end() ? std::string() : it->second;
}

at::Tensor toMeta(const at::Tensor &t) {
  if (!t.defined() || t.device().is_meta())
    return t;
  // A meta tensor with the same storage size, sizes, strides and offset,
  // built directly (this runs for every fake argument of every op).
  c10::Storage storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), t.storage().nbytes(),
      c10::DataPtr(nullptr, c10::Device(c10::kMeta)), /*allocator=*/nullptr,
      /*resizable=*/false));
  at::Tensor meta = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::Meta), t.dtype());
  meta.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return meta;
}

} // namespace

namespace tdx::capture {

CaptureWay captureWay() {
  static const CaptureWay way = chooseWay();
  return way;
}

const char *captureWayName() {
  return captureWay() == CaptureWay::FakeKey ? "fake-key" : "dispatch-mode";
}

void setPythonHooks(PythonHooks hooks) { pythonHooks = std::move(hooks); }

bool fakeCudaEnabled() { return tlsFakeCuda; }

Trace *currentTrace() { return tlsTrace.get(); }

TraceMode::TraceMode(std::shared_ptr<Trace> trace)
    : previous_(tlsTrace), fake_(/*fakeCuda=*/true) {
  tlsTrace = std::move(trace);
}

TraceMode::~TraceMode() { tlsTrace = previous_; }

/// The keyed way's fake mode: sets whether the Fake key is among this
/// thread's included keys; returns whether it was.
static bool includeFakeKey(bool on) {
#if TDX_CAPTURE_KEYS
  bool was = c10::impl::tls_is_dispatch_key_included(kFakeKey);
  c10::impl::tls_set_dispatch_key_included(kFakeKey, on);
  return was;
#else
  (void)on;
  return false;
#endif
}

FakeMode::FakeMode(bool fakeCuda) : previousFakeCuda_(tlsFakeCuda) {
  if (keyFree()) {
    requireHooks();
    pythonHooks.enterFake();
  } else {
    previousInclude_ = includeFakeKey(true);
  }
  tlsFakeCuda = fakeCuda || tlsFakeCuda;
}

/// Runs a hook from a destructor: an error there (Python's) cannot leave a
/// destructor, and the mode stack it restores is Python's own to report.
static void runInDestructor(const std::function<void()> &hook) {
  try {
    if (hook)
      hook();
  } catch (...) {
  }
}

FakeMode::~FakeMode() {
  if (keyFree())
    runInDestructor(pythonHooks.exitFake);
  else
    includeFakeKey(previousInclude_);
  tlsFakeCuda = previousFakeCuda_;
}

RealMode::RealMode() {
  if (keyFree()) {
    if (pythonHooks.enterReal)
      pythonHooks.enterReal();
  } else {
    previousFake_ = includeFakeKey(false);
  }
}

RealMode::~RealMode() {
  if (keyFree())
    runInDestructor(pythonHooks.exitReal);
  else
    includeFakeKey(previousFake_);
}

at::Tensor makeFake(const at::Tensor &meta, c10::Device device,
                    c10::optional<c10::Storage> storage, Recording *recording) {
  if (!storage)
    storage = c10::Storage(c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), meta.storage().nbytes(),
        fakeDataPtr(device, recording), /*allocator=*/nullptr,
        /*resizable=*/false));
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(std::move(*storage),
                                                          fakeKeys(device), meta.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(meta.sizes(), meta.strides(),
                                                 meta.storage_offset());
  if (keyFree()) {
    requireHooks();
    t.unsafeGetTensorImpl()->set_python_dispatch(true);
    pythonHooks.adopt(t);
  }
  return t;
}

at::Tensor fakeLike(const at::Tensor &tensor) {
  EngineScope engine;
  return makeFake(toMeta(tensor), tensor.device(), c10::nullopt, currentRecording());
}

at::Tensor metaLike(const at::Tensor &tensor) {
  EngineScope engine;
  return at::empty_strided(tensor.sizes(), tensor.strides(),
                           tensor.options().device(c10::kMeta));
}

} // namespace tdx::capture

namespace {

/// What the fallback needs to know about an operator, computed once.
struct OpFacts {
  std::vector<int> deviceArgs;      // Device / Device? arguments
  std::vector<int> optionalDevice;  // Device? arguments
  std::vector<int> aliased;         // per return: the argument it aliases, or -1
  std::vector<bool> writes;         // per return: written in place
  bool readsData = false;
  bool isArange = false;
};

int aliasedArgument(const c10::FunctionSchema &schema, const c10::Argument &ret);

const OpFacts &factsOf(const c10::FunctionSchema &schema) {
  thread_local std::unordered_map<const c10::FunctionSchema *, OpFacts> cache;
  auto it = cache.find(&schema);
  if (it != cache.end())
    return it->second;
  OpFacts f;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::TypePtr &type = schema.arguments()[i].type();
    bool optional = type->kind() == c10::TypeKind::OptionalType;
    c10::TypeKind kind =
        optional ? type->castRaw<c10::OptionalType>()->getElementType()->kind() : type->kind();
    if (kind == c10::TypeKind::DeviceObjType) {
      f.deviceArgs.push_back(static_cast<int>(i));
      if (optional)
        f.optionalDevice.push_back(static_cast<int>(i));
    }
  }
  for (const c10::Argument &ret : schema.returns()) {
    f.aliased.push_back(aliasedArgument(schema, ret));
    f.writes.push_back(ret.alias_info() && ret.alias_info()->isWrite());
  }
  f.readsData = readsData(schema.name());
  f.isArange = schema.name() == "aten::arange";
  return cache.emplace(&schema, std::move(f)).first->second;
}

/// Finds the argument a result aliases (same alias set), or -1.
int aliasedArgument(const c10::FunctionSchema &schema, const c10::Argument &ret) {
  const c10::AliasInfo *info = ret.alias_info();
  if (!info)
    return -1;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::AliasInfo *a = schema.arguments()[i].alias_info();
    if (a && a->beforeSets() == info->beforeSets())
      return static_cast<int>(i);
  }
  return -1;
}

} // namespace

void tdx::capture::dispatchFake(const c10::OperatorHandle &op, torch::jit::Stack *stack,
                                bool record) {
  // Everything below works on meta or real tensors: no fake mode inside.
  EngineScope engine;
  const c10::FunctionSchema &schema = op.schema();
  const std::string &name = schema.name();
  size_t numArgs = schema.arguments().size();
  size_t argBase = stack->size() - numArgs;
  // The op goes to the trace being taken, or else to the deferred recording
  // being made or that its tensors belong to (a forward traced on a
  // deferred module does not change the module).
  Trace *trace = record ? currentTrace() : nullptr;
  std::shared_ptr<Recording> keep;
  Recording *recording = nullptr;
  if (record && !trace) {
    recording = currentRecording();
    if (!recording && (keep = recordingOfArguments(schema, *stack)))
      recording = keep.get();
  }
  RecordedOp traced;
  if (trace || recording) {
    traced.name = name;
    traced.overload = schema.overload_name();
    traced.arguments.assign(stack->begin() + argBase, stack->end());
  }

  bool anyFake = false;
  c10::optional<c10::Device> device, explicitDevice;
  std::vector<at::Tensor> fakeArgs(numArgs);
  for (size_t i = 0; i < numArgs; ++i) {
    c10::IValue &v = (*stack)[argBase + i];
    if (v.isTensor() && isFake(v.toTensor())) {
      anyFake = true;
      if (!device)
        device = v.toTensor().device();
      fakeArgs[i] = v.toTensor();
    } else if (v.isTensorList()) {
      for (const at::Tensor &t : v.toTensorVector())
        if (isFake(t)) {
          anyFake = true;
          if (!device)
            device = t.device();
        }
    } else if (v.isList()) {
      for (const c10::IValue &e : v.toListRef())
        if (e.isTensor() && isFake(e.toTensor())) {
          anyFake = true;
          if (!device)
            device = e.toTensor().device();
        }
    }
  }
  // Factories (no tensor arguments) make fake tensors on the device asked.
  const OpFacts &facts = factsOf(schema);
  bool hasDeviceArg = !facts.deviceArgs.empty();
  for (int i : facts.deviceArgs) {
    c10::IValue &v = (*stack)[argBase + i];
    if (v.isDevice())
      explicitDevice = v.toDevice();
  }
  if (!anyFake && !hasDeviceArg) {
    // Only real tensors: run as usual.
    op.callBoxed(stack);
    return;
  }
  if (facts.readsData)
    TORCH_CHECK(false, "tdx: ", name,
                " reads the data of a fake tensor, which has none; materialize it "
                "first (tdx.materialize_tensor / tdx.materialize_module)");
  // x[mask] (index.Tensor with a boolean index) is masked_select.
  std::string dependent = dataDependentShape(name), what = name;
  if (name == "aten::index" && numArgs == 2 && (*stack)[argBase + 1].isList())
    for (const c10::IValue &e : (*stack)[argBase + 1].toListRef())
      if (e.isTensor() && (e.toTensor().scalar_type() == at::kBool ||
                           e.toTensor().scalar_type() == at::kByte)) {
        what = "x[mask] (aten::index.Tensor with a boolean index)";
        dependent = dataDependentShape("aten::masked_select");
      }
  if (!dependent.empty())
    TORCH_CHECK(false, "tdx: ", what,
                "'s result has a shape that depends on the values of its input, which a static "
                "program cannot hold (every tensor's shape is known at compile time); ",
                dependent);
  c10::Device outDevice = explicitDevice ? *explicitDevice
                          : device       ? *device
                                         : c10::Device(c10::kCPU);
  if (outDevice.is_meta())
    outDevice = device ? *device : c10::Device(c10::kCPU);
  if (outDevice.is_cuda() && !fakeCudaEnabled() && !anyFake)
    TORCH_CHECK(false, "tdx: a fake CUDA tensor was asked for outside "
                       "fake_mode(fake_cuda=True); enter that mode to build CUDA "
                       "models on a machine without a GPU");
  if (outDevice.is_cuda() && !outDevice.has_index())
    outDevice = c10::Device(c10::kCUDA, 0);

  // The meta arange makes int64 for floating bounds; give it the dtype the
  // CPU kernel infers (the default dtype).
  if (facts.isArange) {
    bool integral = true;
    int dtypeIndex = -1;
    for (size_t i = 0; i < numArgs; ++i) {
      const c10::IValue &v = (*stack)[argBase + i];
      if (schema.arguments()[i].name() == "dtype")
        dtypeIndex = static_cast<int>(i);
      else if (v.isDouble() || (v.isScalar() && !v.toScalar().isIntegral(true)))
        integral = false;
    }
    if (dtypeIndex >= 0 && !integral && (*stack)[argBase + dtypeIndex].isNone())
      (*stack)[argBase + dtypeIndex] =
          c10::IValue(static_cast<int64_t>(c10::typeMetaToScalarType(c10::get_default_dtype())));
  }

  // Arguments to meta.
  for (size_t i = 0; i < numArgs; ++i) {
    c10::IValue &v = (*stack)[argBase + i];
    if (v.isTensor()) {
      v = toMeta(v.toTensor());
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor &t : v.toTensorVector())
        list.push_back(toMeta(t));
      v = list;
    } else if (v.isList()) {
      c10::impl::GenericList list(v.toList().elementType());
      for (const c10::IValue &e : v.toListRef())
        list.push_back(e.isTensor() ? c10::IValue(toMeta(e.toTensor())) : e);
      v = list;
    } else if (v.isDevice() && !v.toDevice().is_meta()) {
      v = c10::IValue(c10::Device(c10::kMeta));
    }
  }
  for (int i : facts.optionalDevice)
    if ((*stack)[argBase + i].isNone())
      (*stack)[argBase + i] = c10::IValue(c10::Device(c10::kMeta));

  try {
    op.callBoxed(stack);
  } catch (const c10::NotImplementedError &) {
    TORCH_CHECK_NOT_IMPLEMENTED(
        false, "tdx: ", name, op.schema().overload_name().empty() ? "" : ".",
        op.schema().overload_name(),
        " has no meta kernel in torch ", TORCH_VERSION,
        ", so it cannot run on fake tensors; ",
        op.schema().name().rfind("aten::", 0) == 0
            ? "run this part of the model outside fake_mode/deferred_init, or express it "
              "with ops that have one"
            : "give the custom op a fake kernel (torch.library.register_fake, which "
              "computes its result's shape from its inputs' shapes)");
  }

  size_t numRets = schema.returns().size();
  size_t retBase = stack->size() - numRets;
  auto wrap = [&](const at::Tensor &meta, int aliased, bool write) -> at::Tensor {
    if (!meta.defined())
      return meta;
    if (aliased >= 0 && fakeArgs[aliased].defined()) {
      at::Tensor base = fakeArgs[aliased];
      if (write) {
        base.unsafeGetTensorImpl()->set_sizes_and_strides(meta.sizes(), meta.strides(),
                                                          meta.storage_offset());
        return base;
      }
      return makeFake(meta, base.device(), base.storage(), recording);
    }
    return makeFake(meta, outDevice, c10::nullopt, recording);
  };
  for (size_t i = 0; i < numRets; ++i) {
    c10::IValue &r = (*stack)[retBase + i];
    int aliased = facts.aliased[i];
    bool write = facts.writes[i];
    if (r.isTensor()) {
      r = wrap(r.toTensor(), aliased, write);
    } else if (r.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor &t : r.toTensorVector())
        list.push_back(wrap(t, aliased, false));
      r = list;
    }
  }
  if (trace || recording) {
    snapshotResults(traced, {stack->begin() + retBase, stack->end()});
    if (trace)
      trace->ops.push_back(std::move(traced));
    else
      recording->record(std::move(traced));
  }
}

#if TDX_CAPTURE_KEYS
namespace {
void fakeKeyFallback(const c10::OperatorHandle &op, c10::DispatchKeySet,
                     torch::jit::Stack *stack) {
  tdx::capture::dispatchFake(op, stack);
}
} // namespace

TORCH_LIBRARY_IMPL(_, TDX_FAKE_KEY, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fakeKeyFallback>());
}
#endif
