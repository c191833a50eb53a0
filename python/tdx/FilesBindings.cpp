//===- FilesBindings.cpp - tensor files and checkpoints for Python --------===//
//
// Binds the runtime's safetensors and checkpoint code (no MPI, no ATen
// inside it: include/tdx/StateFormat/Checkpoint.h) so that the Python package
// reads and writes exactly what model binaries do. Failures raise
// tdx.CheckpointError (errors.py hands the class over at import).
//
//===----------------------------------------------------------------------===//

#include "tdx/Runtime/AtenDTypes.h"
#include "tdx/StateFormat/Checkpoint.h"
#include "tdx/Runtime/Placement.h"
#include "tdx/Store/Volumes.h"

#include <torch/extension.h>

namespace py = pybind11;
using namespace tdx::rt;

namespace {

py::object &errorType() {
  static py::object type = py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
  return type;
}
py::object &staleType() {
  static py::object type = py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
  return type;
}

/// Runs `fn`, turning a runtime error into tdx.CheckpointError (a version
/// of a networked store dropped while it was read: tdx.store.StaleVersion).
template <class Fn> auto guarded(Fn fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const StaleVersion &e) {
    PyErr_SetString(staleType().ptr(), e.what());
    throw py::error_already_set();
  } catch (const std::exception &e) {
    PyErr_SetString(errorType().ptr(), e.what());
    throw py::error_already_set();
  }
}

/// guarded(fn) with the GIL released while `fn` runs (file or network I/O).
template <class Fn> auto released(Fn fn) -> decltype(fn()) {
  return guarded([&] {
    py::gil_scoped_release release;
    return fn();
  });
}

/// Dense CPU tensors kept alive while their bytes are written.
std::vector<TensorToWrite> toWrite(const std::vector<std::pair<std::string, at::Tensor>> &named,
                                   std::vector<at::Tensor> &keep) {
  std::vector<TensorToWrite> out;
  for (const auto &[name, t] : named) {
    keep.push_back(t.detach().to(at::kCPU).contiguous());
    out.push_back(
        {name, dtypeOf(t.scalar_type()), keep.back().sizes().vec(), keep.back().data_ptr()});
  }
  return out;
}

} // namespace

void bindFiles(py::module &m) {
  m.def("_set_checkpoint_error_type", [](py::object type) { errorType() = type; });
  m.def("_set_stale_version_type", [](py::object type) { staleType() = type; });

  py::class_<TensorStore>(m, "TensorStore")
      .def(py::init([](const std::string &path) {
             return released([&] { return openState(path); });
           }),
           py::arg("path"))
      .def_property_readonly("path", &TensorStore::path)
      .def_property_readonly("metadata", &TensorStore::metadata)
      .def_property_readonly("bytes_read", &TensorStore::bytesRead)
      .def("tensors",
           [](const TensorStore &s) {
             py::dict out;
             for (const auto &[name, t] : s.tensors())
               out[py::str(name)] = py::make_tuple(t.shape, scalarTypeOf(t.dtype));
             return out;
           })
      .def(
          "read_box",
          [](const TensorStore &s, const std::string &name, const std::vector<int64_t> &offset,
             const std::vector<int64_t> &size) {
            return guarded([&] {
              const StoredTensor *t = s.find(name);
              if (!t)
                throw std::runtime_error("tdx: " + s.path() + " has no tensor '" + name + "'");
              at::Tensor out = at::empty(size, at::TensorOptions().dtype(scalarTypeOf(t->dtype)));
              py::gil_scoped_release release;
              s.readBox(name, offset, size, out.data_ptr());
              return out;
            });
          },
          py::arg("name"), py::arg("offset"), py::arg("size"));

  m.def(
      "write_safetensors",
      [](const std::string &path, const std::vector<std::pair<std::string, at::Tensor>> &named) {
        guarded([&] {
          std::vector<at::Tensor> keep;
          writeSafetensors(path, toWrite(named, keep));
          return 0;
        });
      },
      py::arg("path"), py::arg("tensors"));

  // A save by several processes: one begins, each writes its own boxes,
  // one commits every writer's part (tdx.store's DTensor puts).
  using Pending = std::tuple<std::string, std::string, std::string, int64_t>;
  m.def(
      "begin_checkpoint",
      [](const std::string &root, int64_t step) {
        return guarded([&] {
          py::gil_scoped_release release;
          PendingCheckpoint p = beginVersion(root, step);
          return Pending{p.root, p.tmp, p.id, p.step};
        });
      },
      py::arg("root"), py::arg("step"));
  m.def(
      "write_checkpoint_file",
      [](const Pending &pending, const std::string &file,
         const std::vector<std::tuple<std::string, std::vector<int64_t>, std::vector<int64_t>,
                                      at::Tensor>> &boxes) {
        return guarded([&] {
          std::vector<std::pair<std::string, at::Tensor>> named;
          for (const auto &b : boxes)
            named.emplace_back(std::get<0>(b), std::get<3>(b));
          std::vector<at::Tensor> keepAlive;
          std::vector<TensorToWrite> tensors = toWrite(named, keepAlive);
          std::vector<BoxToWrite> out;
          for (size_t i = 0; i < tensors.size(); ++i)
            out.push_back({tensors[i].name, tensors[i].dtype, std::get<1>(boxes[i]),
                           std::get<2>(boxes[i]), tensors[i].shape, tensors[i].data});
          py::gil_scoped_release release;
          PendingCheckpoint p{std::get<0>(pending), std::get<1>(pending), std::get<2>(pending),
                              std::get<3>(pending)};
          return writeVersionFile(p, file, out);
        });
      },
      py::arg("pending"), py::arg("file"), py::arg("boxes"));
  m.def(
      "commit_checkpoint",
      [](const Pending &pending, const std::vector<std::string> &parts,
         const std::map<std::string, std::string> &metadata, int keep) {
        return released([&] {
          PendingCheckpoint p{std::get<0>(pending), std::get<1>(pending), std::get<2>(pending),
                              std::get<3>(pending)};
          return commitVersion(p, parts, metadata, keep);
        });
      },
      py::arg("pending"), py::arg("parts"), py::arg("metadata"), py::arg("keep"));
  m.def(
      "resolve_checkpoint",
      [](const std::string &path) { return guarded([&] { return resolveCheckpoint(path); }); },
      py::arg("path"));
  m.def("is_checkpoint", &isCheckpoint, py::arg("path"));
  m.def(
      "store_key_path",
      [](const std::string &store, const std::string &key) {
        return guarded([&] { return storeKeyPath(store, key); });
      },
      py::arg("store"), py::arg("key"));
  m.def("is_volume_path", &isVolumePath, py::arg("path"));
  m.def(
      "volume_keys",
      [](const std::string &store) { return released([&] { return volumeKeys(store); }); },
      py::arg("store"));
  m.def(
      "volume_versions",
      [](const std::string &store, const std::string &key) { return released([&] { return volumeVersions(store, key); }); },
      py::arg("store"), py::arg("key"));
  m.def(
      "volume_delete",
      [](const std::string &store, const std::string &key) {
        released([&] { deleteVolumeKey(store, key); });
      },
      py::arg("store"), py::arg("key"));
  m.def(
      "volume_status",
      [](const std::string &store) { return released([&] { return volumeStatus(store); }); },
      py::arg("store"));
  m.def(
      "volume_request",
      [](const std::string &volume, const std::string &header, const py::bytes &data) {
        std::string payload = data;
        std::pair<std::string, std::string> reply =
            released([&] { return volumeRequest(volume, header, payload); });
        return py::make_tuple(reply.first, py::bytes(reply.second));
      },
      py::arg("volume"), py::arg("header"), py::arg("data"));
  m.def(
      "verify_checkpoint",
      [](const std::string &path) { return released([&] { return verifyCheckpoint(path); }); },
      py::arg("path"));
  m.def(
      "box_of",
      [](const std::vector<int64_t> &meshShape, const std::vector<int64_t> &coords,
         const std::vector<int64_t> &shape, const std::string &layout) {
        return guarded([&] {
          std::vector<int64_t> offset, size;
          boxOf(meshShape, coords, shape, parseLayout(layout), offset, size);
          return py::make_tuple(offset, size);
        });
      },
      py::arg("mesh_shape"), py::arg("coords"), py::arg("shape"), py::arg("layout"));
}
