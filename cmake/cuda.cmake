# cmake/cuda.cmake — the CUDA backend (src/ops/cuda), behind MT_WITH_CUDA.
#
# Included from CMakeLists.txt right after meshtrain_lib is defined. With
# MT_WITH_CUDA=OFF (the default) it does nothing at all. With ON:
#   - enable_language(CUDA) with /usr/local/cuda/bin/nvcc unless the caller
#     chose a compiler, sm_90a only (H100/H200) unless CMAKE_CUDA_ARCHITECTURES
#     is given, C++20 device/host code (-Wshadow stays C-only: in C++ it flags the
#   core headers' C idiom of a function named like its struct), the shared CUDA runtime;
#   - src/ops/cuda/*.cu join meshtrain_lib, which gets MT_WITH_CUDA=1 (PUBLIC)
#     and links CUDA::cudart, CUDA::cublas and CUDA::cublasLt (PUBLIC);
#   - the project's C warning flags are kept for C only (nvcc does not take
#     them); .cu files get -Wall -Wextra through the host compiler, and with
#     MT_WERROR nvcc's and the host compiler's warnings become errors;
#   - MT_CUDA_RESOURCE_LOG=ON (tests/test_cuda_build.sh sets it): nvcc runs
#     with --resource-usage through cmake/nvcc_resources.sh, which keeps each
#     object's ptxas lines (registers, spills, static shared memory per
#     kernel) in OBJECT.res for tests/cuda/resources.py;
#   - the op harness tests/cuda/cuda_ops_vs_cpu.c and the device-mesh test
#     tests/cuda/mesh_device.c are built and registered with ctest, and
#     bench/cuda_calib.c with a --quick ctest (each
#     prints "SKIP: no GPU" and exits 0 where no device is present).
option(MT_WITH_CUDA "Build the CUDA backend" OFF)
if(NOT MT_WITH_CUDA)
  return()
endif()

if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
# 90a: sm_90's arch-specific instructions (wgmma, src/ops/cuda/wgmma.cuh) are
# compiled in; the code runs on sm_90 devices only (H100/H200), as before
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90a)
endif()
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

# The directory-wide C warning options (add_compile_options above) also land
# on .cu files, where nvcc rejects them: restrict them to C.
get_target_property(_mt_opts meshtrain_lib COMPILE_OPTIONS)
if(_mt_opts)
  set(_mt_c_opts "")
  foreach(_o IN LISTS _mt_opts)
    list(APPEND _mt_c_opts "$<$<COMPILE_LANGUAGE:C>:${_o}>")
  endforeach()
  set_property(TARGET meshtrain_lib PROPERTY COMPILE_OPTIONS ${_mt_c_opts})
endif()

# meshtrain_lib was created before CUDA was enabled: its CUDA properties
# were not initialised from the CMAKE_CUDA_* variables, so set them here.
set_target_properties(meshtrain_lib PROPERTIES
  CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}"
  CUDA_RUNTIME_LIBRARY Shared)

# the host side's knowledge of the device code's sm_90a instructions (wgmma:
# mt_cuda_wgmma_available, which attn_kernel=v4 and the wgmma probe ask)
if("${CMAKE_CUDA_ARCHITECTURES}" MATCHES "90a")
  target_compile_definitions(meshtrain_lib PRIVATE MT_CUDA_SM90A=1)
endif()
file(GLOB MT_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/ops/cuda/*.cu)
target_sources(meshtrain_lib PRIVATE ${MT_CUDA_SOURCES})
target_compile_definitions(meshtrain_lib PUBLIC MT_WITH_CUDA=1)
target_link_libraries(meshtrain_lib PUBLIC CUDA::cudart CUDA::cublas CUDA::cublasLt)
# C++20 by flag: CMake 3.25 knows no CUDA20 dialect flag for nvcc 13
target_compile_options(meshtrain_lib PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter>)
if(MT_WERROR)
  target_compile_options(meshtrain_lib PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings -Xcompiler=-Werror>)
endif()
option(MT_CUDA_RESOURCE_LOG "Keep ptxas's per-kernel resource usage in OBJECT.res" OFF)
if(MT_CUDA_RESOURCE_LOG)
  target_compile_options(meshtrain_lib PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--resource-usage>)
  set_target_properties(meshtrain_lib PROPERTIES
    CUDA_COMPILER_LAUNCHER ${CMAKE_SOURCE_DIR}/cmake/nvcc_resources.sh)
endif()

add_executable(cuda_ops_vs_cpu ${CMAKE_SOURCE_DIR}/tests/cuda/cuda_ops_vs_cpu.c)
target_link_libraries(cuda_ops_vs_cpu PRIVATE meshtrain_lib)
add_test(NAME cuda_ops_vs_cpu COMMAND cuda_ops_vs_cpu)
set_tests_properties(cuda_ops_vs_cpu PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2" TIMEOUT 600 SKIP_RETURN_CODE 77)

add_executable(cuda_mesh_device ${CMAKE_SOURCE_DIR}/tests/cuda/mesh_device.c)
target_link_libraries(cuda_mesh_device PRIVATE meshtrain_lib)
add_test(NAME cuda_mesh_device COMMAND cuda_mesh_device)
set_tests_properties(cuda_mesh_device PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2" TIMEOUT 120 SKIP_RETURN_CODE 77)

# bench/cuda_calib.c: measured GEMM / attention / one-rank all-reduce rates
# for the planner's GPU profile (docs/cuda.md, "Calibrating the planner's GPU
# profile"); the ctest runs only its --quick sizes (skipped without a GPU).
add_executable(cuda_calib ${CMAKE_SOURCE_DIR}/bench/cuda_calib.c)
target_link_libraries(cuda_calib PRIVATE meshtrain_lib)
add_test(NAME cuda_calib_quick COMMAND cuda_calib --quick)
set_tests_properties(cuda_calib_quick PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2" TIMEOUT 120 SKIP_RETURN_CODE 77)
