# lit configuration for the tdx C++ unit tests (GoogleTest binaries).
import lit.formats

config.name = "tdx-unit"
config.test_format = lit.formats.GoogleTest(".", "unittests")
config.test_source_root = config.tdx_unit_dir
config.test_exec_root = config.tdx_unit_dir
