//===- DeferredInit.cpp - record module construction, replay it -----------===//

#include "CaptureInternal.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <unordered_map>
#include <unordered_set>

using namespace tdx::capture;

namespace {


/// Real values of the fake tensors of one recording during replay. Python
/// and autograd wrap tensors in shallow copies (new TensorImpls sharing the
/// storage), so a fake tensor is found by its TensorImpl when possible and
/// otherwise as a view of the real tensor that first made its storage.
struct RealValues {
  std::unordered_map<c10::TensorImpl *, at::Tensor> byImpl;
  std::unordered_map<c10::StorageImpl *, at::Tensor> byStorage;

  void bind(const at::Tensor &fake, const at::Tensor &real) {
    byImpl[fake.unsafeGetTensorImpl()] = real;
    byStorage.emplace(fake.storage().unsafeGetStorageImpl(), real);
  }

  c10::optional<at::Tensor> lookup(const at::Tensor &fake) const {
    auto it = byImpl.find(fake.unsafeGetTensorImpl());
    if (it != byImpl.end())
      return it->second;
    auto st = byStorage.find(fake.storage().unsafeGetStorageImpl());
    if (st == byStorage.end())
      return c10::nullopt;
    const at::Tensor &base = st->second;
    if (base.sizes() == fake.sizes() && base.strides() == fake.strides() &&
        base.storage_offset() == fake.storage_offset() && base.dtype() == fake.dtype())
      return base;
    return base.as_strided(fake.sizes(), fake.strides(), fake.storage_offset());
  }

  at::Tensor get(const at::Tensor &t, const std::string &op) const {
    if (!t.defined() || !isFake(t))
      return t;
    if (c10::optional<at::Tensor> r = lookup(t))
      return *r;
    throw CaptureError("tdx: " + op +
                       " uses a fake tensor that the recording did not make (it "
                       "was created outside deferred_init); cannot materialize it");
  }

  c10::IValue get(const c10::IValue &v, const std::string &op) const {
    if (v.isTensor())
      return get(v.toTensor(), op);
    if (v.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor &t : v.toTensorVector())
        list.push_back(get(t, op));
      return list;
    }
    if (v.isList()) {
      c10::impl::GenericList list(v.toList().elementType());
      for (const c10::IValue &e : v.toListRef())
        list.push_back(e.isTensor() ? c10::IValue(get(e.toTensor(), op)) : e);
      return list;
    }
    return v;
  }
};

} // namespace

namespace tdx::capture {

std::shared_ptr<Recording> deferredInit(const std::function<void()> &build,
                                        bool fakeCuda) {
  auto recording = std::make_shared<Recording>();
  recording->setGeneratorState(at::detail::getDefaultCPUGenerator().get_state());
  recording->setSeed(static_cast<int64_t>(at::detail::getDefaultCPUGenerator().current_seed()));
  RecordingScope scope(recording.get());
  FakeMode fake(fakeCuda);
  build();
  return recording;
}

void deferredInitInto(const std::shared_ptr<Recording> &recording,
                      const std::function<void()> &build, bool fakeCuda) {
  RecordingScope scope(recording.get());
  FakeMode fake(fakeCuda);
  build();
}

at::Tensor liftConstant(const at::Tensor &real) {
  Recording *recording = currentRecording();
  at::Tensor fake;
  {
    RealMode realMode;
    at::Tensor meta = metaLike(real);
    fake = makeFake(meta, real.device(), c10::nullopt, recording);
  }
  // Recorded into the deferred recording, or into the trace being taken
  // (torch.tensor(...) inside a traced forward or loss).
  Trace *trace = currentTrace();
  if (recording || trace) {
    RecordedOp op;
    op.name = "tdx::constant";
    op.arguments = {real.clone()};
    snapshotResults(op, {fake});
    if (recording)
      recording->record(std::move(op));
    else
      trace->ops.push_back(std::move(op));
  }
  return fake;
}

void recordSetData(const at::Tensor &self, const at::Tensor &newData) {
  // `t.data = t` (as Module._apply does when nothing changes) is a no-op.
  if (self.unsafeGetTensorImpl() == newData.unsafeGetTensorImpl() ||
      (self.storage().is_alias_of(newData.storage()) && self.sizes() == newData.sizes() &&
       self.strides() == newData.strides() &&
       self.storage_offset() == newData.storage_offset() && self.dtype() == newData.dtype()))
    return;
  std::shared_ptr<Recording> owned = recordingOf(self);
  Recording *recording = owned ? owned.get() : currentRecording();
  if (recording && isFake(self)) {
    RecordedOp op;
    op.name = "tdx::set_data";
    op.arguments = {self, newData};
    recording->record(std::move(op));
  }
  at::Tensor target = self;
  target.set_data(newData);
}

namespace {

/// Whether a recorded op draws from a random generator: its schema (or a
/// `.generator` overload of it: randn's default overload draws from the
/// global one) takes a Generator, or it is tdx's own trunc_normal_, a
/// dropout, or a `rand*` factory.
bool drawsRandom(const RecordedOp &op) {
  if (op.name == "tdx::trunc_normal_" || op.name.find("dropout") != std::string::npos ||
      op.name.rfind("aten::rand", 0) == 0)
    return true;
  auto &dispatcher = c10::Dispatcher::singleton();
  if (dispatcher.findSchema({op.name, "generator"}))
    return true;
  auto handle = dispatcher.findSchema({op.name, op.overload});
  if (!handle)
    return false;
  for (const c10::Argument &a : handle->schema().arguments()) {
    c10::TypePtr type = a.type();
    if (auto optional = type->castRaw<c10::OptionalType>())
      type = optional->getElementType();
    if (type->kind() == c10::TypeKind::GeneratorType)
      return true;
  }
  return false;
}

const c10::StorageImpl *storageOf(const at::Tensor &t) {
  return t.defined() && t.unsafeGetTensorImpl()->has_storage() ? t.storage().unsafeGetStorageImpl()
                                                               : nullptr;
}

} // namespace

std::vector<at::Tensor> Recording::materializeAncestors(const std::vector<at::Tensor> &tensors) {
  // Walk back from the tensors' storages: an op that made or wrote one is
  // needed, and so are the storages its tensor arguments read.
  std::unordered_set<const c10::StorageImpl *> needed;
  for (const at::Tensor &t : tensors)
    needed.insert(storageOf(t));
  std::vector<bool> keep(ops_.size(), false);
  for (size_t i = ops_.size(); i-- > 0;) {
    const RecordedOp &op = ops_[i];
    bool hit = false;
    forEachTensor(op.results, [&](const at::Tensor &t) { hit = hit || needed.count(storageOf(t)); });
    if (op.name == "tdx::set_data" && needed.count(storageOf(op.arguments[0].toTensor())))
      hit = true;
    if (!hit)
      continue;
    if (drawsRandom(op))
      throw CaptureError("tdx: the value is drawn at random (" + op.name +
                         ") and a deferred tensor has none before materialization");
    keep[i] = true;
    forEachTensor(op.arguments, [&](const at::Tensor &t) {
      if (isFake(t))
        needed.insert(storageOf(t));
    });
  }
  return replay(tensors, c10::nullopt, &keep);
}

std::vector<at::Tensor> Recording::materialize(const std::vector<at::Tensor> &tensors,
                                               c10::optional<c10::Device> device) {
  return replay(tensors, device, nullptr);
}

std::vector<at::Tensor> Recording::replay(const std::vector<at::Tensor> &tensors,
                                          c10::optional<c10::Device> device,
                                          const std::vector<bool> *keep) {
  RealMode realMode;
  RealValues real;
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  at::Tensor saved;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    saved = generator.get_state();
    if (generatorState_.defined())
      generator.set_state(generatorState_);
  }
  struct Restore {
    at::Generator g;
    at::Tensor s;
    ~Restore() {
      std::lock_guard<std::mutex> lock(g.mutex());
      g.set_state(s);
    }
  } restore{generator, saved};

  for (size_t i = 0; i < ops_.size(); ++i) {
    if (keep && !(*keep)[i])
      continue;
    const RecordedOp &op = ops_[i];
    std::string full = op.name + (op.overload.empty() ? "" : "." + op.overload);
    if (op.name == "tdx::alias") {
      at::Tensor base = real.get(op.arguments[0].toTensor(), full);
      std::vector<int64_t> sizes = op.arguments[1].toIntVector();
      std::vector<int64_t> strides = op.arguments[2].toIntVector();
      int64_t offset = op.arguments[3].toInt();
      at::Tensor r = (base.sizes() == c10::IntArrayRef(sizes) &&
                      base.strides() == c10::IntArrayRef(strides) &&
                      base.storage_offset() == offset)
                         ? base
                         : base.as_strided(sizes, strides, offset);
      real.bind(op.results[0].toTensor(), r);
      continue;
    }
    if (op.name == "tdx::set_data") {
      at::Tensor self = real.get(op.arguments[0].toTensor(), full);
      self.set_data(real.get(op.arguments[1].toTensor(), full));
      continue;
    }
    if (op.name == "tdx::constant") {
      real.bind(op.results[0].toTensor(), device ? op.arguments[0].toTensor().to(*device)
                                                 : op.arguments[0].toTensor().clone());
      continue;
    }
    c10::OperatorHandle handle =
        c10::Dispatcher::singleton().findSchemaOrThrow(op.name.c_str(), op.overload.c_str());
    torch::jit::Stack stack;
    for (const c10::IValue &arg : op.arguments) {
      c10::IValue v = real.get(arg, full);
      if (v.isDevice()) {
        c10::Device d = v.toDevice();
        if (device)
          v = c10::IValue(*device);
        else if (d.is_cuda() && !at::hasCUDA())
          throw CaptureError("tdx: " + full +
                             " makes a CUDA tensor but this machine has no CUDA "
                             "device; materialize with device='cpu'");
      }
      stack.push_back(std::move(v));
    }
    // A tensor made without an explicit device takes the override too.
    handle.callBoxed(&stack);
    for (size_t i = 0; i < op.results.size() && i < stack.size(); ++i) {
      const c10::IValue &fake = op.results[i];
      const c10::IValue &value = stack[i];
      if (fake.isTensor() && value.isTensor()) {
        at::Tensor r = value.toTensor();
        if (device && r.device() != *device && isFake(fake.toTensor()) &&
            fake.toTensor().device() != *device)
          r = r.to(*device);
        real.bind(fake.toTensor(), r);
      } else if (fake.isTensorList() && value.isTensorList()) {
        auto f = fake.toTensorVector();
        auto v = value.toTensorVector();
        for (size_t j = 0; j < f.size() && j < v.size(); ++j)
          real.bind(f[j], v[j]);
      }
    }
  }
  std::vector<at::Tensor> out;
  for (const at::Tensor &t : tensors) {
    c10::optional<at::Tensor> r = real.lookup(t);
    if (!r)
      throw CaptureError("tdx: this tensor was not made by the recording being "
                         "materialized");
    out.push_back(*r);
  }
  return out;
}

} // namespace tdx::capture
