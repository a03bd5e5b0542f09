# gpufeed as an installed C++ package (`cmake --install <build> --prefix P`):
#   P/include/gpufeed/...                the public headers (each room's HEADERS list below; the
#                                        rest of include/ is internal and never installed)
#   P/lib/libgpufeed_<room>.so.<version> shared libraries, SONAME libgpufeed_<room>.so.<major>,
#                                        RUNPATH $ORIGIN (they find each other, nothing else)
#   P/lib/cmake/gpufeed/                 gpufeedConfig.cmake (components core, torch),
#                                        gpufeedConfigVersion.cmake (SameMajorVersion), targets
#   P/lib/pkgconfig/gpufeed.pc           the core component, for builds without CMake
# Components: `core` = gpufeed::common, gpufeed::decode, gpufeed::sampler, gpufeed::datasets,
# gpufeed::transforms, gpufeed::loader (torch-free); `torch` =
# gpufeed::prefetch, gpufeed::profiler, gpufeed::harness (the config finds Torch through the consumer's
# CMAKE_PREFIX_PATH). Everything the libraries use privately (spdlog, fmt, libjpeg-turbo, the image
# libraries, oneTBB, nlohmann_json, CUDA's runtime, the gloo shim) stays out of the installed
# interface: the public headers include none of it, so a consumer needs none of its headers.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(GPUFEED_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/gpufeed")

# gpufeed_library(<target> COMPONENT core|torch HEADERS <public headers, relative to include/>)
# Gives a room's library its version, SONAME, export name (gpufeed_loader -> gpufeed::loader),
# install RUNPATH and its public header set, and queues it for the component's export.
function(gpufeed_library target)
  cmake_parse_arguments(L "" "COMPONENT" "HEADERS" ${ARGN})
  string(REGEX REPLACE "^gpufeed_" "" _name "${target}")
  set_target_properties(${target} PROPERTIES
    VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
    EXPORT_NAME ${_name} INSTALL_RPATH "$ORIGIN")
  list(TRANSFORM L_HEADERS PREPEND "include/")
  target_sources(${target} PUBLIC FILE_SET HEADERS BASE_DIRS include FILES ${L_HEADERS})
  set_property(GLOBAL APPEND PROPERTY GPUFEED_${L_COMPONENT}_TARGETS ${target})
endfunction()

# gpufeed/version.h: the project's version, for #if checks in consumers. Installed with common,
# the lowest room.
function(gpufeed_version_header target)
  set(_dir "${PROJECT_BINARY_DIR}/generated/include")
  configure_file("${PROJECT_SOURCE_DIR}/cmake/version.h.in" "${_dir}/gpufeed/version.h" @ONLY)
  target_sources(${target} PUBLIC FILE_SET HEADERS BASE_DIRS "${_dir}" FILES "${_dir}/gpufeed/version.h")
endfunction()

# The install rules, after every room has been added. Only shared libraries are installed: a
# static libgpufeed_decode.a would drag libjpeg-turbo, the image libraries, spdlog, fmt and oneTBB
# into every consumer's link (and its CMake config). Static builds (the fuzzer) are in-tree only.
function(gpufeed_install_package)
  if(NOT BUILD_SHARED_LIBS)
    message(STATUS "gpufeed: static libraries: no install rules (the installed package is shared)")
    return()
  endif()
  if(NOT DEFINED GPUFEED_CUDA_ENABLED)
    set(GPUFEED_CUDA_ENABLED OFF)  # torch-free build (gpufeedConfig.cmake.in tests it)
  endif()
  get_property(_core GLOBAL PROPERTY GPUFEED_core_TARGETS)
  get_property(_torch GLOBAL PROPERTY GPUFEED_torch_TARGETS)
  set(_components core)
  if(_torch)
    list(APPEND _components torch)
  endif()
  foreach(_component IN LISTS _components)
    install(TARGETS ${_${_component}} EXPORT gpufeed-${_component}-targets
      LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT ${_component}
      FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT ${_component})
    install(EXPORT gpufeed-${_component}-targets NAMESPACE gpufeed::
      DESTINATION ${GPUFEED_INSTALL_CMAKEDIR} COMPONENT ${_component})
  endforeach()

  configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/gpufeedConfig.cmake.in"
    "${PROJECT_BINARY_DIR}/generated/gpufeedConfig.cmake"
    INSTALL_DESTINATION ${GPUFEED_INSTALL_CMAKEDIR})
  write_basic_package_version_file("${PROJECT_BINARY_DIR}/generated/gpufeedConfigVersion.cmake"
    VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
  install(FILES "${PROJECT_BINARY_DIR}/generated/gpufeedConfig.cmake"
    "${PROJECT_BINARY_DIR}/generated/gpufeedConfigVersion.cmake"
    DESTINATION ${GPUFEED_INSTALL_CMAKEDIR} COMPONENT core)

  # pkg-config, core component. Relocatable: prefix is found from the .pc file's own folder.
  # -std=c++20 is the headers' minimum (a later -std on the command line overrides it).
  file(RELATIVE_PATH GPUFEED_PC_PREFIX "/root/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/root")
  string(REGEX REPLACE "/$" "" GPUFEED_PC_PREFIX "\${pcfiledir}/${GPUFEED_PC_PREFIX}")
  foreach(_kind LIBDIR INCLUDEDIR)
    if(IS_ABSOLUTE "${CMAKE_INSTALL_${_kind}}")
      set(GPUFEED_PC_${_kind} "${CMAKE_INSTALL_${_kind}}")
    else()
      set(GPUFEED_PC_${_kind} "\${prefix}/${CMAKE_INSTALL_${_kind}}")
    endif()
  endforeach()
  configure_file("${PROJECT_SOURCE_DIR}/cmake/gpufeed.pc.in" "${PROJECT_BINARY_DIR}/generated/gpufeed.pc" @ONLY)
  install(FILES "${PROJECT_BINARY_DIR}/generated/gpufeed.pc"
    DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT core)
endfunction()
