//===- Recording.cpp - the op log of deferred init, and fake storage ------===//
//
// What deferred init (DeferredInit.cpp) and the fake kernels (FakeTensor.cpp)
// both stand on: the recording ops go to on this thread, the storage of a
// fake tensor (no data; a deferred one refers to its recording), and how a
// recording takes an op.
//
//===----------------------------------------------------------------------===//

#include "CaptureInternal.h"

#include <ATen/core/function_schema.h>

using namespace tdx::capture;

namespace {

thread_local Recording *tlsRecording = nullptr;

void deleteRecordingRef(void *context) {
  delete static_cast<std::weak_ptr<Recording> *>(context);
}

void noFakeData(void *) {}

} // namespace

namespace tdx::capture {

RecordingScope::RecordingScope(Recording *recording) : previous_(tlsRecording) {
  tlsRecording = recording;
}

RecordingScope::~RecordingScope() { tlsRecording = previous_; }

bool isFake(const at::Tensor &tensor) {
  return tensor.defined() && tensor.unsafeGetTensorImpl()->has_storage() &&
         isFakeData(tensor.storage().data_ptr());
}

void snapshotResults(RecordedOp &op, std::vector<c10::IValue> values) {
  op.results = std::move(values);
  forEachTensor(op.results, [&](const at::Tensor &t) {
    if (t.defined())
      op.resultMeta.push_back(TensorMeta{t.unsafeGetTensorImpl(), t.sizes().vec(),
                                         t.strides().vec(), t.storage_offset()});
  });
}

Recording *currentRecording() { return tlsRecording; }

std::shared_ptr<Recording> recordingOfArguments(const c10::FunctionSchema &schema,
                                                const torch::jit::Stack &stack) {
  std::shared_ptr<Recording> found;
  size_t n = schema.arguments().size();
  for (size_t i = stack.size() - n; i < stack.size() && !found; ++i)
    forEachTensor({stack[i]}, [&](const at::Tensor &t) {
      if (!found)
        found = recordingOf(t);
    });
  return found;
}

c10::DataPtr fakeDataPtr(c10::Device device, Recording *recording) {
  // No data; the deleter marks the storage as a fake tensor's (isFakeData),
  // and a deferred tensor's context refers to its recording.
  if (!recording)
    return c10::DataPtr(nullptr, nullptr, &noFakeData, device);
  return c10::DataPtr(nullptr, new std::weak_ptr<Recording>(recording->weak_from_this()),
                      &deleteRecordingRef, device);
}

bool isFakeData(const c10::DataPtr &data) {
  return data.get_deleter() == &noFakeData || data.get_deleter() == &deleteRecordingRef;
}

void Recording::bindArgument(const at::Tensor &t) {
  if (!t.defined() || !isFake(t) || !known_.emplace(t.unsafeGetTensorImpl(), true).second)
    return;
  auto owner = storageOwner_.find(t.storage().unsafeGetStorageImpl());
  if (owner == storageOwner_.end())
    return; // not made by this recording; replay reports it if it is used
  RecordedOp alias;
  alias.name = "tdx::alias";
  alias.arguments = {owner->second, c10::IValue(t.sizes().vec()),
                     c10::IValue(t.strides().vec()), c10::IValue(t.storage_offset())};
  snapshotResults(alias, {t});
  ops_.push_back(std::move(alias));
}

void Recording::record(RecordedOp op) {
  forEachTensor(op.arguments, [&](const at::Tensor &t) { bindArgument(t); });
  forEachTensor(op.results, [&](const at::Tensor &t) {
    if (!t.defined() || !isFake(t))
      return;
    known_[t.unsafeGetTensorImpl()] = true;
    storageOwner_.emplace(t.storage().unsafeGetStorageImpl(), t);
  });
  ops_.push_back(std::move(op));
}

std::shared_ptr<Recording> recordingOf(const at::Tensor &tensor) {
  if (!isDeferred(tensor))
    return nullptr;
  const c10::DataPtr &data = tensor.storage().data_ptr();
  if (data.get_deleter() != &deleteRecordingRef)
    return nullptr;
  return static_cast<std::weak_ptr<Recording> *>(data.get_context())->lock();
}

bool isDeferred(const at::Tensor &tensor) {
  return tensor.defined() && tensor.unsafeGetTensorImpl()->has_storage() &&
         tensor.storage().data_ptr().get_deleter() == &deleteRecordingRef;
}

} // namespace tdx::capture
