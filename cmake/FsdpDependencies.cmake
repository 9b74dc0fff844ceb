# Finds every external dependency once and decides which GPU backend is compiled in.
find_package(MPI REQUIRED COMPONENTS CXX)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(Threads REQUIRED)
find_package(ZLIB REQUIRED)

# LibTorch from the torch wheel. Its CMake config looks for the CUDA toolkit when the
# wheel was built with CUDA; point it at /usr/local/cuda unless the user said otherwise.
if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
  set(CUDAToolkit_ROOT /usr/local/cuda)
endif()
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(ENV{TORCH_CUDA_ARCH_LIST} "9.0")
endif()
find_package(Torch REQUIRED)

set(FSDP_HAVE_CUDA OFF)
set(FSDP_HAVE_CUDA_KERNELS OFF)
set(FSDP_HAVE_HIP OFF)
string(TOUPPER "${FSDP_GPU}" _fsdp_gpu)
set(_torch_has_cuda OFF)
if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
  set(_torch_has_cuda ON)
endif()
if(_fsdp_gpu STREQUAL "HIP")
  # ROCm LibTorch exposes the CUDA API names through HIP; RCCL keeps the NCCL API.
  find_path(RCCL_INCLUDE_DIR rccl/rccl.h HINTS /opt/rocm/include)
  find_library(RCCL_LIBRARY rccl HINTS /opt/rocm/lib)
  if(NOT RCCL_INCLUDE_DIR OR NOT RCCL_LIBRARY)
    message(FATAL_ERROR "FSDP_GPU=HIP needs RCCL (rccl/rccl.h and librccl) under /opt/rocm. "
                        "Install ROCm and a ROCm build of LibTorch, or use -DFSDP_GPU=OFF.")
  endif()
  set(FSDP_HAVE_HIP ON)
elseif(_fsdp_gpu STREQUAL "CUDA" OR (_fsdp_gpu STREQUAL "AUTO" AND _torch_has_cuda))
  if(NOT _torch_has_cuda)
    message(FATAL_ERROR "FSDP_GPU=CUDA but this LibTorch was built without CUDA. "
                        "Install the CUDA torch wheel or use -DFSDP_GPU=OFF.")
  endif()
  find_package(CUDAToolkit REQUIRED)
  # NCCL ships no CMake config: search the toolkit, then the nvidia-nccl wheel next to torch.
  get_filename_component(_torch_site "${Torch_DIR}/../../../.." ABSOLUTE)
  find_path(NCCL_INCLUDE_DIR nccl.h
            HINTS ${CUDAToolkit_INCLUDE_DIRS} ${_torch_site}/nvidia/nccl/include ENV NCCL_HOME
            PATH_SUFFIXES include)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
               HINTS ${CUDAToolkit_LIBRARY_DIR} ${_torch_site}/nvidia/nccl/lib ENV NCCL_HOME
               PATH_SUFFIXES lib lib64)
  if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
    message(FATAL_ERROR "CUDA LibTorch found but NCCL (nccl.h, libnccl) was not. "
                        "Set NCCL_HOME to the NCCL install or use -DFSDP_GPU=OFF.")
  endif()
  set(FSDP_HAVE_CUDA ON)
  # fsdp-train's own kernels (lib/kernels) need nvcc; without one the build goes on without
  # them (--fused-cuda-kernels is then refused). SASS and PTX for FSDP_CUDA_ARCHITECTURES:
  # 90 = H100/H200, the PTX lets newer GPUs compile it at load time; e.g. "80;90" adds A100.
  set(FSDP_CUDA_ARCHITECTURES "90" CACHE STRING "CUDA architectures of fsdp-train's own kernels")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS "${CUDAToolkit_NVCC_EXECUTABLE}")
    set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES ${FSDP_CUDA_ARCHITECTURES})
    endif()
    # The shared CUDA runtime, the one LibTorch loads: one runtime in the process.
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    enable_language(CUDA)
    set(FSDP_HAVE_CUDA_KERNELS ON)
  else()
    message(STATUS "fsdp-train: no nvcc found: its own CUDA kernels are not built")
  endif()
endif()
if(FSDP_HAVE_CUDA OR FSDP_HAVE_HIP)
  add_library(fsdp::nccl UNKNOWN IMPORTED)
  if(FSDP_HAVE_HIP)
    set_target_properties(fsdp::nccl PROPERTIES IMPORTED_LOCATION ${RCCL_LIBRARY}
                          INTERFACE_INCLUDE_DIRECTORIES ${RCCL_INCLUDE_DIR}
                          INTERFACE_COMPILE_DEFINITIONS FSDP_RCCL=1)
  else()
    set_target_properties(fsdp::nccl PROPERTIES IMPORTED_LOCATION ${NCCL_LIBRARY}
                          INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
  endif()
endif()
message(STATUS "fsdp-train: Torch ${Torch_VERSION}, CUDA backend ${FSDP_HAVE_CUDA} (own kernels ${FSDP_HAVE_CUDA_KERNELS}), HIP backend ${FSDP_HAVE_HIP}")

# One Python interpreter for interop tests and helper scripts: the setup venv when present.
if(NOT FSDP_PYTHON)
  if(DEFINED ENV{FSDP_VENV} AND EXISTS "$ENV{FSDP_VENV}/bin/python")
    set(FSDP_PYTHON "$ENV{FSDP_VENV}/bin/python")
  else()
    find_program(FSDP_PYTHON python3)
  endif()
endif()
set(FSDP_PYTHON "${FSDP_PYTHON}" CACHE FILEPATH "Python with torch and safetensors for interop tests")
