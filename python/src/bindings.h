#pragma once
// Shared between gpufeed._C's translation units (module.cpp: the loader; profile.cpp: the profiler).
#include <nanobind/nanobind.h>

#include <memory>

#include "gpufeed/loader/loader.h"

namespace gpufeed::python {

/// The C++ loader behind a gpufeed._C._Loader object (shared: it stays alive while the caller
/// holds it, even if the Python loader is closed). Throws nb::type_error for another object.
std::shared_ptr<loader::Loader> loader_of(nanobind::handle py_loader);

/// Registers gpufeed._C._Profiler (profile.cpp).
void bind_profiler(nanobind::module_& m);

}  // namespace gpufeed::python
