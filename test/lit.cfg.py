# lit configuration for the tdx FileCheck tests.
import os

import lit.formats

config.name = "tdx"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".test"]
config.excludes = ["lit.cfg.py", "lit.site.cfg.py", "CMakeLists.txt", "Inputs", "unit"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.tdx_obj_root, "test")

# tdx tools first, then LLVM's FileCheck, not and count.
path = os.pathsep.join([config.tdx_tools_dir, config.llvm_tools_dir,
                        config.environment.get("PATH", os.environ["PATH"])])
config.environment["PATH"] = path
config.substitutions.append(("%tdx_src_root", config.tdx_src_root))
config.substitutions.append(("%tdx_obj_root", config.tdx_obj_root))
# The torch the build compiles against (empty without capture).
config.substitutions.append(("%tdx_torch_dir", config.tdx_torch_dir))

# The CUDA parts are built where nvcc is; their tests need them.
if os.path.exists(os.path.join(config.tdx_tools_dir, "tdx-cuda-smoke")):
    config.available_features.add("cuda")

# tdx-compile's cache of binaries is off in lit: each test compiles what it
# checks, and the cache's own test names its directory (--cache-dir).
config.environment["TDX_CACHE_DIR"] = ""
