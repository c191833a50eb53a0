//===- Aten.cpp - generic ATen calls by schema name -----------------------===//

#include "tdx/Runtime/Runtime.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <stdexcept>

std::vector<at::Tensor>
tdx::rt::callAten(const std::string &schema, const std::vector<at::Tensor> &tensors,
                  const std::vector<std::pair<std::string, c10::IValue>> &args) {
  size_t dot = schema.find('.');
  std::string name = schema.substr(0, dot);
  std::string overload = dot == std::string::npos ? "" : schema.substr(dot + 1);
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!handle)
    throw std::runtime_error("no ATen operator " + schema + " in this libtorch");
  const c10::FunctionSchema &fs = handle->schema();
  torch::jit::Stack stack;
  size_t next = 0;
  for (const c10::Argument &a : fs.arguments()) {
    auto given = std::find_if(args.begin(), args.end(),
                              [&](const auto &kv) { return kv.first == a.name(); });
    bool isTensor = a.type()->kind() == c10::TypeKind::TensorType;
    bool isOptionalTensor =
        a.type()->kind() == c10::TypeKind::OptionalType &&
        a.type()->castRaw<c10::OptionalType>()->getElementType()->kind() ==
            c10::TypeKind::TensorType;
    if (given != args.end())
      stack.push_back(given->second);
    else if ((isTensor || isOptionalTensor) && next < tensors.size())
      stack.push_back(tensors[next++]);
    else if (a.default_value())
      stack.push_back(*a.default_value());
    else
      throw std::runtime_error(schema + ": no value for argument '" + a.name() + "'");
  }
  if (next != tensors.size())
    throw std::runtime_error(schema + ": " + std::to_string(tensors.size()) +
                             " tensor operands but the schema takes " + std::to_string(next));
  handle->callBoxed(stack);
  std::vector<at::Tensor> out;
  for (const c10::IValue &v : stack) {
    if (!v.isTensor())
      throw std::runtime_error(schema + " returned a non-tensor value");
    out.push_back(v.toTensor());
  }
  return out;
}
