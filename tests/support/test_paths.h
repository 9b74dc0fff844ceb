// Where the tests find the checkout, the build directory and the project's Python. One generated
// translation unit per build directory defines them (tests/CMakeLists.txt: test_paths.cpp.in), so
// no other test object has a path compiled in and ccache shares them between checkouts (a clean
// clone's CI run recompiles one small file instead of every test).
#pragma once

namespace fsdp::test {
const char* source_dir();  // the checkout (PROJECT_SOURCE_DIR)
const char* binary_dir();  // the build directory (PROJECT_BINARY_DIR)
const char* python();      // the venv's Python (FSDP_PYTHON)
}  // namespace fsdp::test

#define FSDP_SOURCE_DIR (::fsdp::test::source_dir())
#define FSDP_BINARY_DIR (::fsdp::test::binary_dir())
#define FSDP_PYTHON (::fsdp::test::python())
