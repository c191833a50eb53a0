//===- _C.cpp - the tdx Python extension ----------------------------------===//
//
// Binds the capture engine (include/tdx/Capture/Capture.h) for the `tdx`
// package. Python-facing names and docs live in the package's .py files.
//
//===----------------------------------------------------------------------===//

#include "tdx/Capture/Capture.h"
#include "tdx/Runtime/Runtime.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/extension.h>

namespace py = pybind11;
using namespace tdx::capture;

namespace {

/// A mode entered with __enter__ and left with __exit__ from Python.
template <typename Mode, typename... Args>
struct ModeGuard {
  std::tuple<Args...> args;
  std::unique_ptr<Mode> mode;
  void enter() {
    mode = std::apply([](auto... a) { return std::make_unique<Mode>(a...); }, args);
  }
  void exit() { mode.reset(); }
};

} // namespace

void bindFiles(py::module &m); // FilesBindings.cpp

namespace {

/// The key-free way's Python side (python/tdx/deferred.py hands it over at
/// import): the fake tensor subclass and the functions that push and pop
/// its dispatch mode. Kept for the life of the process.
py::object *fakeTensorClass, *enterFake, *exitFake, *enterReal, *exitReal;

std::function<void()> callPython(py::object *fn) {
  return [fn] {
    py::gil_scoped_acquire gil;
    (*fn)();
  };
}

/// An OpOverload's operator, found once per overload object.
const c10::OperatorHandle &operatorOf(py::handle func) {
  static auto *handles = new std::unordered_map<PyObject *, c10::OperatorHandle>();
  auto it = handles->find(func.ptr());
  if (it != handles->end())
    return it->second;
  py::object schema = func.attr("_schema");
  c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(
      schema.attr("name").cast<std::string>().c_str(),
      schema.attr("overload_name").cast<std::string>().c_str());
  func.inc_ref(); // the map's key is its address
  return handles->emplace(func.ptr(), op).first->second;
}

/// Torch's Python dispatch hands a number that was a wrapped-number tensor
/// argument (``x * 2.0``) back as the Python number: made a wrapped-number
/// tensor again for the schema's Tensor argument, as the op first got it.
py::object wrappedNumber(const c10::Argument &arg, py::handle value) {
  if (arg.type()->kind() != c10::TypeKind::TensorType ||
      !(PyFloat_Check(value.ptr()) || PyLong_Check(value.ptr()) || PyBool_Check(value.ptr()) ||
        PyComplex_Check(value.ptr())))
    return py::reinterpret_borrow<py::object>(value);
  at::Tensor t = at::scalar_to_tensor(torch::jit::toIValue(value, c10::NumberType::get()).toScalar());
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(t));
}

} // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "tdx native extension: fake tensors, deferred init, capture, checkpoints";
  bindFiles(m);

  // CaptureError is raised as tdx.CaptureError (errors.py hands the class
  // over at import); RuntimeError until then.
  static py::object captureErrorType = py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
  m.def("_set_capture_error_type", [](py::object type) { captureErrorType = type; });
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p)
        std::rethrow_exception(p);
    } catch (const CaptureError &e) {
      PyErr_SetString(captureErrorType.ptr(), e.what());
    }
  });

  using FakeGuard = ModeGuard<FakeMode, bool>;
  py::class_<FakeGuard>(m, "FakeMode")
      .def(py::init([](bool fakeCuda) { return FakeGuard{{fakeCuda}, nullptr}; }),
           py::arg("fake_cuda") = false)
      .def("__enter__", [](FakeGuard &g) { g.enter(); })
      .def("__exit__", [](FakeGuard &g, py::args) { g.exit(); });

  using RealGuard = ModeGuard<RealMode>;
  py::class_<RealGuard>(m, "RealMode")
      .def(py::init([]() { return RealGuard{{}, nullptr}; }))
      .def("__enter__", [](RealGuard &g) { g.enter(); })
      .def("__exit__", [](RealGuard &g, py::args) { g.exit(); });

  // The model binaries' step memory pool (tdx.working_memory).
  m.def("install_step_memory_pool", &tdx::rt::TensorMemory::install);
  m.def("tensor_memory_current", &tdx::rt::TensorMemory::current);
  m.def("tensor_memory_peak", &tdx::rt::TensorMemory::peak);
  m.def("tensor_memory_reset_peak", &tdx::rt::TensorMemory::resetPeak);
  m.def("tensor_memory_system_allocations", &tdx::rt::TensorMemory::systemAllocations);

  m.def("is_fake", &isFake, py::arg("tensor"));
  m.def("capture_way", &captureWayName,
        "How ops reach the capture engine: 'fake-key' or 'dispatch-mode' (TDX_CAPTURE).");
  m.def(
      "_set_python_hooks",
      [](py::object cls, py::object enterFakeFn, py::object exitFakeFn, py::object enterRealFn,
         py::object exitRealFn) {
        fakeTensorClass = new py::object(std::move(cls));
        enterFake = new py::object(std::move(enterFakeFn));
        exitFake = new py::object(std::move(exitFakeFn));
        enterReal = new py::object(std::move(enterRealFn));
        exitReal = new py::object(std::move(exitRealFn));
        PythonHooks hooks;
        hooks.adopt = [](const at::Tensor &t) {
          py::gil_scoped_acquire gil;
          // The new TensorImpl's Python object, of the fake subclass; torch
          // keeps it alive as long as the TensorImpl (PyObject preservation).
          PyObject *object =
              THPVariable_Wrap(t, reinterpret_cast<PyTypeObject *>(fakeTensorClass->ptr()));
          if (!object)
            throw py::error_already_set();
          Py_DECREF(object);
        };
        hooks.enterFake = callPython(enterFake);
        hooks.exitFake = callPython(exitFake);
        hooks.enterReal = callPython(enterReal);
        hooks.exitReal = callPython(exitReal);
        setPythonHooks(std::move(hooks));
      });
  m.def(
      "_fake_dispatch",
      [](py::handle func, py::tuple args, py::dict kwargs) {
        const c10::OperatorHandle &op = operatorOf(func);
        const std::vector<c10::Argument> &schemaArgs = op.schema().arguments();
        py::tuple positional(args.size());
        for (size_t i = 0; i < args.size(); ++i)
          positional[i] = i < schemaArgs.size() ? wrappedNumber(schemaArgs[i], args[i])
                                                : py::reinterpret_borrow<py::object>(args[i]);
        py::kwargs named;
        for (auto [key, value] : kwargs) {
          std::string name = key.cast<std::string>();
          auto arg = std::find_if(schemaArgs.begin(), schemaArgs.end(),
                                  [&](const c10::Argument &a) { return a.name() == name; });
          named[key] = arg == schemaArgs.end() ? py::reinterpret_borrow<py::object>(value)
                                               : wrappedNumber(*arg, value);
        }
        torch::jit::Stack stack = torch::jit::createStackForSchema(
            op.schema(), torch::jit::tuple_slice(std::move(positional)), named, std::nullopt);
        // Torch detaches a Python-dispatch tensor for its own bookkeeping
        // (TensorImpl::shallow_copy_and_detach: `.data`, make_variable of a
        // factory's result, autograd's saved outputs) by calling the handler
        // with aten::detach directly, not through the dispatcher, whose
        // Python fallback excludes the keys above Python (PythonTLSSnapshot
        // among them) for the handler. The fake-key way never sees these:
        // they are computed but not recorded, so the trace is the same under
        // both ways.
        bool bookkeeping =
            op.schema().name() == "aten::detach" &&
            !c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::PythonTLSSnapshot);
        dispatchFake(op, &stack, /*record=*/!bookkeeping);
        return torch::jit::createPyObjectForStack(std::move(stack));
      },
      "Runs one op of torch's Python dispatch through the capture engine (the key-free "
      "way's __torch_dispatch__).");
  m.def("dialect_ops", &tdx::capture::dialectOps);
  m.def("dialect_enums", &tdx::capture::dialectEnums,
        "The dialect's enums: (name, [spelling of case 0, 1, ...]) each, from ODS.");
  m.def(
      "dtypes",
      [] {
        py::list out;
#define TDX_DTYPE(Name, stored, bytes, aten, ctype, mlir, ir, runs)                            \
  out.append(py::make_tuple(ir, py::reinterpret_borrow<py::object>(                            \
                                    reinterpret_cast<PyObject *>(torch::getTHPDtype(at::aten))), \
                            static_cast<bool>(runs), stored));
#include "tdx/StateFormat/DTypes.def"
        return out;
      },
      "The one table of element types (include/tdx/StateFormat/DTypes.def): (MLIR spelling, "
      "torch dtype, whether the model binaries run it, safetensors name) each.");
  m.def("is_deferred", &isDeferred, py::arg("tensor"));
  m.def("meta_like", &metaLike, py::arg("tensor"));
  m.def("fake_like", &fakeLike, py::arg("tensor"));
  m.def("lift_constant", &liftConstant, py::arg("tensor"));
  m.def("record_set_data", &recordSetData, py::arg("self"), py::arg("new_data"));

  py::class_<Recording, std::shared_ptr<Recording>>(m, "Recording")
      .def("__len__", &Recording::size)
      .def(
          "materialize",
          [](Recording &r, const std::vector<at::Tensor> &tensors,
             c10::optional<std::string> device) {
            c10::optional<c10::Device> d;
            if (device)
              d = c10::Device(*device);
            py::gil_scoped_release release;
            return r.materialize(tensors, d);
          },
          py::arg("tensors"), py::arg("device") = py::none())
      .def(
          "materialize_ancestors",
          [](Recording &r, const std::vector<at::Tensor> &tensors) {
            return r.materializeAncestors(tensors);
          },
          py::arg("tensors"))
      .def_property_readonly("seed", &Recording::seed)
      .def(
          "to_mlir",
          [](const Recording &r,
             const std::vector<std::tuple<std::string, at::Tensor, bool, std::string>> &entries,
             std::shared_ptr<Trace> trace, const std::vector<at::Tensor> &inputs,
             const std::vector<at::Tensor> &outputs, const std::string &function,
             bool writeState, const std::vector<std::string> &nonPersistent) {
            std::vector<StateEntry> es;
            for (const auto &[name, tensor, isBuffer, tiedTo] : entries)
              es.push_back({name, tensor, isBuffer, tiedTo,
                            std::find(nonPersistent.begin(), nonPersistent.end(), name) ==
                                nonPersistent.end()});
            if (!trace)
              return captureToMlir(r, es, r.seed());
            ForwardSpec spec{trace.get(), inputs, outputs, function, writeState};
            return captureToMlir(r, es, r.seed(), &spec);
          },
          py::arg("entries"), py::arg("trace") = nullptr,
          py::arg("inputs") = std::vector<at::Tensor>{},
          py::arg("outputs") = std::vector<at::Tensor>{}, py::arg("function") = "forward",
          py::arg("write_state") = false,
          py::arg("non_persistent") = std::vector<std::string>{})
      .def("op_names", [](const Recording &r) {
        std::vector<std::string> names;
        for (const RecordedOp &op : r.ops())
          names.push_back(op.name + (op.overload.empty() ? "" : "." + op.overload));
        return names;
      });

  m.def(
      "deferred_init",
      [](py::function build, bool fakeCuda) {
        return deferredInit([&] { build(); }, fakeCuda);
      },
      py::arg("build"), py::arg("fake_cuda") = true);
  m.def("recording_of", &recordingOf, py::arg("tensor"));
  m.def(
      "deferred_init_into",
      [](std::shared_ptr<Recording> recording, py::function build, bool fakeCuda) {
        deferredInitInto(recording, [&] { build(); }, fakeCuda);
      },
      py::arg("recording"), py::arg("build"), py::arg("fake_cuda") = true);

  py::class_<Trace, std::shared_ptr<Trace>>(m, "Trace")
      .def(py::init<>())
      .def("op_names", [](const Trace &t) {
        std::vector<std::string> names;
        for (const RecordedOp &op : t.ops)
          names.push_back(op.name + (op.overload.empty() ? "" : "." + op.overload));
        return names;
      });
  using TraceGuard = ModeGuard<TraceMode, std::shared_ptr<Trace>>;
  py::class_<TraceGuard>(m, "TraceMode")
      .def(py::init([](std::shared_ptr<Trace> t) { return TraceGuard{{t}, nullptr}; }))
      .def("__enter__", [](TraceGuard &g) { g.enter(); })
      .def("__exit__", [](TraceGuard &g, py::args) { g.exit(); });
  py::class_<Module, std::shared_ptr<Module>>(m, "Module")
      .def_static("parse", &Module::parse, py::arg("text"))
      .def("clone", &Module::clone)
      .def("print", &Module::print)
      .def(
          "run_pipeline",
          [](Module &mod, const std::string &pipeline) {
            py::gil_scoped_release release;
            mod.runPipeline(pipeline);
          },
          py::arg("pipeline"))
      .def("declare_mesh", &Module::declareMesh, py::arg("name"), py::arg("shape"),
           py::arg("axes"))
      .def("set_mesh_ranks", &Module::setMeshRanks, py::arg("name"), py::arg("ranks"))
      .def("set_reduce_type", &Module::setReduceType, py::arg("type"))
      .def("set_memory_budget", &Module::setMemoryBudget, py::arg("bytes"))
      .def("set_batch_norm", &Module::setBatchNorm, py::arg("axis"), py::arg("statistics"))
      .def("set_pipeline", &Module::setPipeline, py::arg("axis"), py::arg("microbatches"),
           py::arg("schedule"), py::arg("stages_per_rank"))
      .def("annotate", &Module::annotate, py::arg("target"), py::arg("mesh_name"),
           py::arg("shape"), py::arg("axes"), py::arg("placements"), py::arg("priority") = -1)
      .def("argument_shapes", &Module::argumentShapes, py::arg("function"))
      .def("annotate_uses", &Module::annotateUses, py::arg("param"), py::arg("mesh_name"),
           py::arg("placements"), py::arg("reads") = false)
      .def("state",
           [](const Module &mod) {
             std::vector<std::tuple<std::string, std::vector<int64_t>, std::string, bool,
                                    std::string>>
                 out;
             for (const Module::StateInfo &s : mod.state())
               out.emplace_back(s.name, s.shape, s.dtype, s.isBuffer, s.tiedTo);
             return out;
           })
      .def("entry", &Module::entry)
      .def("entries", &Module::entries)
      .def("add_entry", &Module::addEntry, py::arg("text"), py::arg("name"),
           py::arg("writes") = false)
      .def("num_arguments", &Module::numArguments, py::arg("function"))
      .def("is_partitioned", &Module::isPartitioned)
      .def("is_placed", &Module::isPlaced)
      .def("has_user_collectives", &Module::hasUserCollectives)
      .def("has_manual_regions", &Module::hasManualRegions)
      .def("meshes",
           [](const Module &mod) {
             std::vector<std::tuple<std::string, std::vector<int64_t>, std::vector<std::string>,
                                    std::vector<int64_t>>>
                 out;
             for (const Module::MeshInfo &m : mod.meshes())
               out.emplace_back(m.name, m.shape, m.axes, m.ranks);
             return out;
           })
      .def("function_to_json", &Module::functionToJson, py::arg("function") = "forward");
}
