#pragma once
// Errors that cross into Python. bindings.cpp maps each onto the Python exception of the same
// name, so C++ code states what went wrong without knowing about pybind11.
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace gnomon {

struct ValueError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct TypeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct KeyError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

template <typename Error, typename... Parts>
[[noreturn]] void raise(Parts&&... parts) {
  throw Error(concat(std::forward<Parts>(parts)...));
}

}  // namespace gnomon
