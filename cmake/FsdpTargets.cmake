# Helpers that give every project target the same warnings, sanitizers and precompiled header.
set(FSDP_WARNINGS -Wall -Wextra -Wno-unused-parameter)
if(FSDP_WERROR)
  list(APPEND FSDP_WARNINGS -Werror)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC 12's flow-sensitive warnings report false positives inside libstdc++'s std::string at
    # -O3 (Release: "__builtin_memcpy accessing 9223372036854775810 or more bytes", GCC bug
    # 105329); they stay warnings, not errors.
    list(APPEND FSDP_WARNINGS -Wno-error=restrict -Wno-error=array-bounds
         -Wno-error=stringop-overflow -Wno-error=stringop-overread)
  endif()
endif()
set(FSDP_SAN_FLAGS "")
if(FSDP_SANITIZE)
  set(FSDP_SAN_FLAGS -fsanitize=${FSDP_SANITIZE} -fno-omit-frame-pointer)
  if(FSDP_WERROR AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # The sanitizers' instrumentation makes GCC 12 report maybe-uninitialized inside
    # libstdc++'s std::regex and std::function (false positives in system headers).
    list(APPEND FSDP_WARNINGS -Wno-error=maybe-uninitialized)
  endif()
endif()

# The PCH is built once in fsdp_pch and reused by every target that includes LibTorch.
add_library(fsdp_pch STATIC ${CMAKE_CURRENT_LIST_DIR}/pch.cpp)
target_link_libraries(fsdp_pch PUBLIC torch)
target_compile_options(fsdp_pch PRIVATE ${FSDP_WARNINGS} ${FSDP_SAN_FLAGS})
if(FSDP_USE_PCH)
  target_precompile_headers(fsdp_pch PRIVATE ${CMAKE_CURRENT_LIST_DIR}/pch.h)
endif()

# fsdp_configure(target [TORCH]): warnings, sanitizers, include root, optional PCH reuse.
function(fsdp_configure target)
  cmake_parse_arguments(ARG "TORCH" "" "" ${ARGN})
  # GCC's flags for C and C++ only: nvcc (kernels/*.cu) takes its own.
  target_compile_options(${target} PRIVATE
                         "$<$<COMPILE_LANGUAGE:C,CXX>:${FSDP_WARNINGS};${FSDP_SAN_FLAGS}>")
  target_link_options(${target} PRIVATE ${FSDP_SAN_FLAGS})
  if(ARG_TORCH AND FSDP_USE_PCH)
    target_precompile_headers(${target} REUSE_FROM fsdp_pch)
  endif()
endfunction()

# fsdp_library(name SOURCES ... DEPS ... [TORCH]): one static library per lib/ folder.
function(fsdp_library name)
  cmake_parse_arguments(ARG "TORCH" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/lib)
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  if(ARG_TORCH)
    fsdp_configure(${name} TORCH)
  else()
    fsdp_configure(${name})
  endif()
endfunction()
