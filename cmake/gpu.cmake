# The GPU backend of _C: at most one (a ROCm build of torch names its devices "cuda" too, so one
# _C cannot dispatch between vendors). GNOMON_GPU=auto picks CUDA or HIP only when a GPU of that
# vendor answers (nvidia-smi / rocm-smi) and its compiler is present; else no GPU backend.
# The kernels are hip/*.hip, one source for both: nvcc compiles them as CUDA, hipcc as HIP.

file(GLOB GNOMON_GPU_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/hip/*.hip)
include(CheckLanguage)

function(gnomon_gpu_answers tool pattern result)
  find_program(_tool NAMES ${tool})
  set(${result} FALSE PARENT_SCOPE)
  if(_tool)
    execute_process(COMMAND ${_tool} ${ARGN} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out
                    ERROR_QUIET TIMEOUT 20)
    if(_rc EQUAL 0 AND _out MATCHES "${pattern}")
      set(${result} TRUE PARENT_SCOPE)
    endif()
  endif()
  unset(_tool CACHE)
endfunction()

set(_gpu "${GNOMON_GPU}")
if(NOT _gpu MATCHES "^(auto|cuda|hip|off)$")
  message(FATAL_ERROR "GNOMON_GPU: expected auto, cuda, hip or off, got '${GNOMON_GPU}'")
endif()
if(_gpu STREQUAL "auto")
  set(_gpu off)
  gnomon_gpu_answers(nvidia-smi "GPU [0-9]" _nvidia -L)
  if(_nvidia)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      set(_gpu cuda)
    endif()
  endif()
  if(_gpu STREQUAL "off")
    gnomon_gpu_answers(rocm-smi "GPU|card" _amd --showid)
    find_program(GNOMON_HIPCC hipcc)
    if(_amd AND GNOMON_HIPCC)
      set(_gpu hip)
    endif()
  endif()
  message(STATUS "gnomon: GNOMON_GPU=auto chose '${_gpu}'")
endif()

if(_gpu STREQUAL "cuda")
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "80;90")
  endif()
  set(CMAKE_CUDA_RUNTIME_LIBRARY Static)  # imports on a machine without a driver
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 17)
  set_source_files_properties(${GNOMON_GPU_SOURCES} PROPERTIES LANGUAGE CUDA)
  target_sources(_C PRIVATE ${GNOMON_GPU_SOURCES})
  set_target_properties(_C PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}"
                                      CUDA_RUNTIME_LIBRARY Static)
  target_include_directories(_C PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/hip)
  target_compile_options(_C PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -O3>)
  target_compile_definitions(_C PRIVATE GNOMON_HAS_GPU GNOMON_WITH_CUDA
                             GNOMON_GPU_ARCHS="${CMAKE_CUDA_ARCHITECTURES}")
elseif(_gpu STREQUAL "hip")
  check_language(HIP)  # tries enable_language(HIP) in a scratch project
  if(CMAKE_HIP_COMPILER)  # a full ROCm install: CMake's HIP language
    if(NOT DEFINED CMAKE_HIP_ARCHITECTURES)
      set(CMAKE_HIP_ARCHITECTURES "gfx90a;gfx942;gfx950")
    endif()
    enable_language(HIP)
    set_source_files_properties(${GNOMON_GPU_SOURCES} PROPERTIES LANGUAGE HIP)
    target_sources(_C PRIVATE ${GNOMON_GPU_SOURCES})
    set_target_properties(_C PROPERTIES HIP_ARCHITECTURES "${CMAKE_HIP_ARCHITECTURES}")
  else()  # Debian's hipcc has no working hip-lang package: compile each kernel file with hipcc
    if(NOT DEFINED CMAKE_HIP_ARCHITECTURES)
      set(CMAKE_HIP_ARCHITECTURES "gfx90a")
    endif()
    find_program(GNOMON_HIPCC hipcc REQUIRED)
    find_library(GNOMON_AMDHIP amdhip64 REQUIRED)
    set(_offload "")
    foreach(_arch IN LISTS CMAKE_HIP_ARCHITECTURES)
      list(APPEND _offload "--offload-arch=${_arch}")
    endforeach()
    file(GLOB _headers ${CMAKE_CURRENT_SOURCE_DIR}/hip/*.h ${CMAKE_CURRENT_SOURCE_DIR}/csrc/*.h
         ${CMAKE_CURRENT_SOURCE_DIR}/csrc/core/*.h)
    foreach(_src IN LISTS GNOMON_GPU_SOURCES)
      get_filename_component(_name ${_src} NAME_WE)
      set(_obj ${CMAKE_CURRENT_BINARY_DIR}/hip/${_name}.o)
      add_custom_command(
        OUTPUT ${_obj}
        COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_CURRENT_BINARY_DIR}/hip
        COMMAND ${CMAKE_COMMAND} -E env HIP_PLATFORM=amd ${GNOMON_HIPCC} -x hip ${_offload}
                -fPIC -O3 -std=c++17 -DGNOMON_HAS_GPU -DGNOMON_WITH_HIP
                "-DGNOMON_GPU_ARCHS=\"${CMAKE_HIP_ARCHITECTURES}\""
                -I${CMAKE_CURRENT_SOURCE_DIR}/csrc -I${CMAKE_CURRENT_SOURCE_DIR}/hip
                -c ${_src} -o ${_obj}
        DEPENDS ${_src} ${_headers}
        COMMENT "hipcc ${_name}.hip"
        VERBATIM)
      list(APPEND _objects ${_obj})
    endforeach()
    set_source_files_properties(${_objects} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
    target_sources(_C PRIVATE ${_objects})
    target_link_libraries(_C PRIVATE ${GNOMON_AMDHIP})
  endif()
  target_include_directories(_C PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/hip)
  target_compile_definitions(_C PRIVATE GNOMON_HAS_GPU GNOMON_WITH_HIP
                             GNOMON_GPU_ARCHS="${CMAKE_HIP_ARCHITECTURES}")
endif()
