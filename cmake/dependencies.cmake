# All dependencies come from Debian packages (scripts/setup.sh); CUDA from /usr/local/cuda.
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(CBLAS_INCLUDE_DIR NAMES cblas.h PATHS /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/openblas REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(yaml-cpp REQUIRED)  # --recipe YAML files (Debian libyaml-cpp-dev)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(ZLIB REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
# Checkpoints (io/checkpoint_file.cc, the only user): Debian's openmpi flavour of HDF5, used serially.
pkg_check_modules(HDF5 REQUIRED IMPORTED_TARGET hdf5-openmpi)

if(SYMPRUNE_WITH_MPI)
  find_package(MPI REQUIRED COMPONENTS CXX)
  find_program(SYMPRUNE_MPIEXEC NAMES mpirun mpiexec HINTS ${MPI_CXX_COMPILER_DIR} REQUIRED)
endif()

if(SYMPRUNE_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()

# ThreadSanitizer: the emulation then runs every CUDA thread of a block as an OS thread between real barriers,
# so a data race between CUDA threads (a missing __syncthreads/__syncwarp) is a data race TSan reports.
if(SYMPRUNE_TSAN)
  if(SYMPRUNE_SANITIZE)
    message(FATAL_ERROR "SYMPRUNE_TSAN and SYMPRUNE_SANITIZE cannot be combined (ThreadSanitizer excludes ASan)")
  endif()
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
endif()

if(SYMPRUNE_WITH_CUDA)
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80 90)
  endif()
  enable_language(CUDA)
  # CMake 3.25 has no CUDA20 dialect flags for nvcc; .cu files are C++17 (host .cc files stay C++20).
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)
endif()
if(SYMPRUNE_WITH_NCCL AND NOT SYMPRUNE_WITH_CUDA)
  message(FATAL_ERROR "SYMPRUNE_WITH_NCCL needs SYMPRUNE_WITH_CUDA=ON")
endif()
if(SYMPRUNE_WITH_NCCL)
  # NCCL ships with the CUDA toolkit here (or in system paths); libnccl loads libcuda at run time.
  find_path(NCCL_INCLUDE_DIR NAMES nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} PATHS /usr/local/cuda/include
            REQUIRED)
  find_library(NCCL_LIBRARY NAMES nccl HINTS ${CUDAToolkit_LIBRARY_DIR}
               PATHS /usr/local/cuda/lib64 /usr/local/cuda/lib REQUIRED)
  add_library(symprune::nccl UNKNOWN IMPORTED)
  set_target_properties(symprune::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                                                  INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
  message(STATUS "NCCL: ${NCCL_LIBRARY} (headers in ${NCCL_INCLUDE_DIR})")
endif()
