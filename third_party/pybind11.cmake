# Locates pybind11 from the Python environment that drives the build
# (scikit-build-core's isolated build env, or the active interpreter).
find_package(Python 3.9 REQUIRED COMPONENTS Interpreter Development.Module)
if(NOT pybind11_DIR)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -m pybind11 --cmakedir
    OUTPUT_VARIABLE pybind11_DIR
    OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _pybind11_found)
  if(NOT _pybind11_found EQUAL 0)
    message(FATAL_ERROR "pybind11 not found for ${Python_EXECUTABLE}: pip install pybind11")
  endif()
endif()
find_package(pybind11 CONFIG REQUIRED)
