# Cross toolchain: zig's clang, libc++ and glibc stubs (PyPI's ziglang), for manylinux wheels built
# on any Linux without containers. The target is zig's triple with the glibc floor:
#   cmake -S . -B build/zig-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/zig.cmake \
#         -DGPUFEED_ZIG_TARGET=aarch64-linux-gnu.2.28 -DGPUFEED_ZIG_PREFIX=build/deps/aarch64-linux-gnu.2.28
# GPUFEED_ZIG_PREFIX holds the static dependencies that tools/wheel/build_deps.sh built for that
# target; find_package and pkg-config look only there. libc++ is linked statically by zig, so a
# binary needs only GLIBC_ versions (at most the target's), never GLIBCXX.
# Where qemu-user-static is installed, the target's binaries run under it (gtest discovery, ctest),
# with GPUFEED_ZIG_SYSROOT (a glibc of the target's architecture: tools/qemu_tests.sh) as its -L.
set(GPUFEED_ZIG_TARGET "x86_64-linux-gnu.2.28" CACHE STRING "zig target triple with the glibc version")
get_filename_component(_gpufeed_root "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
set(GPUFEED_ZIG_PREFIX "${_gpufeed_root}/build/deps/${GPUFEED_ZIG_TARGET}" CACHE PATH
    "static dependencies for the target (tools/wheel/build_deps.sh)")
get_filename_component(GPUFEED_ZIG_PREFIX "${GPUFEED_ZIG_PREFIX}" ABSOLUTE BASE_DIR "${_gpufeed_root}")
# try_compile projects read this file again: pass the settings on.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES GPUFEED_ZIG_TARGET GPUFEED_ZIG_PREFIX GPUFEED_ZIG_SYSROOT)

string(REGEX MATCH "^[^-]+" _zig_arch "${GPUFEED_ZIG_TARGET}")
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR "${_zig_arch}")

set(_zig_bin "${_gpufeed_root}/build/zig-wrappers/${GPUFEED_ZIG_TARGET}")
if(NOT EXISTS "${_zig_bin}/c++")
  execute_process(COMMAND "${_gpufeed_root}/tools/wheel/zig_wrappers.sh" "${GPUFEED_ZIG_TARGET}" "${_zig_bin}"
                  RESULT_VARIABLE _zig_rc)
  if(_zig_rc)
    message(FATAL_ERROR "zig.cmake: tools/wheel/zig_wrappers.sh failed (${_zig_rc})")
  endif()
endif()
set(CMAKE_C_COMPILER "${_zig_bin}/cc")
set(CMAKE_CXX_COMPILER "${_zig_bin}/c++")
set(CMAKE_AR "${_zig_bin}/ar" CACHE FILEPATH "zig ar")
set(CMAKE_RANLIB "${_zig_bin}/ranlib" CACHE FILEPATH "zig ranlib")

# zig links libc++ into each binary: python/CMakeLists.txt then hides all but _C's entry point.
set(GPUFEED_STATIC_CXX_RUNTIME ON)

set(CMAKE_FIND_ROOT_PATH "${GPUFEED_ZIG_PREFIX}")
set(CMAKE_PREFIX_PATH "${GPUFEED_ZIG_PREFIX}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# pkg-config reads only the target's .pc files (with their own absolute prefix).
set(ENV{PKG_CONFIG_LIBDIR} "${GPUFEED_ZIG_PREFIX}/lib/pkgconfig:${GPUFEED_ZIG_PREFIX}/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
set(ENV{PKG_CONFIG_SYSROOT_DIR} "")
# The static libraries' own dependencies (libtiff's zlib, libpng's libm, ...): pkg-config --static.
set(PKG_CONFIG_ARGN "--static" CACHE STRING "")

if(NOT CMAKE_SYSTEM_PROCESSOR STREQUAL CMAKE_HOST_SYSTEM_PROCESSOR)
  find_program(GPUFEED_QEMU "qemu-${_zig_arch}-static")
  if(GPUFEED_QEMU)
    set(GPUFEED_ZIG_SYSROOT "" CACHE PATH "a glibc of the target's architecture for qemu -L")
    if(GPUFEED_ZIG_SYSROOT)
      set(CMAKE_CROSSCOMPILING_EMULATOR "${GPUFEED_QEMU};-L;${GPUFEED_ZIG_SYSROOT}")
    else()
      set(CMAKE_CROSSCOMPILING_EMULATOR "${GPUFEED_QEMU}")
    endif()
  endif()
endif()
