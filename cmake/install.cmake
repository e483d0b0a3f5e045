# What `cmake --install build [--prefix DIR]` installs (GNUInstallDirs paths, relative to the prefix):
#   bin/kvslim                              the command-line tool
#   lib/libkvslim.so.<soversion>, .so, .a   the library, shared (SONAME libkvslim.so.<soversion>) and static
#   include/kvslim/*.h                      the public headers
#   lib/cmake/kvslim/                       find_package(kvslim): kvslim::kvslim (shared), and with
#                                           COMPONENTS static kvslim::kvslim_static
#   lib/pkgconfig/kvslim.pc                 pkg-config --cflags --libs kvslim
#   share/man/man1/kvslim.1.gz              the man page (from `kvslim --help`, by help2man)
#   share/kvslim/models/stories260K.gguf    the bundled model, for a first run
#   lib/python3.X/dist-packages/kvslim      the Python package (component python, when it is built)
# `cpack -G DEB` in the build directory packs the same into kvslim_<version>_<arch>.deb for /usr.
include(CMakePackageConfigHelpers)

install(TARGETS kvslim RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
set_target_properties(kvslim_shared PROPERTIES EXPORT_NAME kvslim)
set_target_properties(kvslim_lib PROPERTIES EXPORT_NAME kvslim_archive)
install(TARGETS kvslim_shared EXPORT kvslimTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS kvslim_lib EXPORT kvslimStaticTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/kvslim DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h" PATTERN "version.h" EXCLUDE)
# The installed kvslim/version.h carries the version itself (the tree's reads the KVSLIM_VERSION the
# build defines), so a program built with any compiler flags, or pkg-config's, gets it.
file(READ ${CMAKE_SOURCE_DIR}/include/kvslim/version.h KVSLIM_VERSION_H)
string(REPLACE "#define KVSLIM_VERSION \"unknown\"" "#define KVSLIM_VERSION \"${PROJECT_VERSION}\""
       KVSLIM_VERSION_H_INSTALLED "${KVSLIM_VERSION_H}")
if(KVSLIM_VERSION_H_INSTALLED STREQUAL KVSLIM_VERSION_H)
  message(FATAL_ERROR "include/kvslim/version.h has no line '#define KVSLIM_VERSION \"unknown\"' for "
                      "cmake/install.cmake to put the version in")
endif()
set(KVSLIM_VERSION_H_OLD "")
if(EXISTS ${CMAKE_BINARY_DIR}/include/kvslim/version.h)
  file(READ ${CMAKE_BINARY_DIR}/include/kvslim/version.h KVSLIM_VERSION_H_OLD)
endif()
if(NOT KVSLIM_VERSION_H_OLD STREQUAL KVSLIM_VERSION_H_INSTALLED)
  file(WRITE ${CMAKE_BINARY_DIR}/include/kvslim/version.h "${KVSLIM_VERSION_H_INSTALLED}")
endif()
set_property(DIRECTORY ${CMAKE_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
             ${CMAKE_SOURCE_DIR}/include/kvslim/version.h)
install(FILES ${CMAKE_BINARY_DIR}/include/kvslim/version.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvslim)
install(FILES ${CMAKE_SOURCE_DIR}/models/stories260K.gguf DESTINATION ${CMAKE_INSTALL_DATADIR}/kvslim/models)

set(KVSLIM_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvslim)
install(EXPORT kvslimTargets NAMESPACE kvslim:: DESTINATION ${KVSLIM_CMAKE_DIR})
install(EXPORT kvslimStaticTargets NAMESPACE kvslim:: DESTINATION ${KVSLIM_CMAKE_DIR})
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/kvslimConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/cmake/kvslimConfig.cmake INSTALL_DESTINATION ${KVSLIM_CMAKE_DIR})
# 0.x: a new minor version may break the API, as the SONAME says.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cmake/kvslimConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/cmake/kvslimConfig.cmake ${CMAKE_BINARY_DIR}/cmake/kvslimConfigVersion.cmake
        DESTINATION ${KVSLIM_CMAKE_DIR})

# kvslim.pc finds its prefix from its own place (${pcfiledir}), so `--prefix DIR` and the package's
# /usr both work without reconfiguring.
file(RELATIVE_PATH KVSLIM_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" KVSLIM_PC_TO_PREFIX "${KVSLIM_PC_TO_PREFIX}")
configure_file(${CMAKE_SOURCE_DIR}/cmake/kvslim.pc.in ${CMAKE_BINARY_DIR}/cmake/kvslim.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/cmake/kvslim.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The man page is `kvslim --help` and `--version` through help2man (Debian help2man), so it cannot
# drift from the tool.
find_program(KVSLIM_HELP2MAN help2man)
if(KVSLIM_HELP2MAN)
  add_custom_command(OUTPUT ${CMAKE_BINARY_DIR}/man/kvslim.1.gz
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/man
    COMMAND ${KVSLIM_HELP2MAN} --no-info --no-discard-stderr
            --name "long-context LLM inference on the CPU with KV-cache compression"
            --include ${CMAKE_SOURCE_DIR}/cmake/kvslim.h2m
            --output ${CMAKE_BINARY_DIR}/man/kvslim.1 $<TARGET_FILE:kvslim>
    COMMAND gzip -9nf ${CMAKE_BINARY_DIR}/man/kvslim.1
    DEPENDS kvslim ${CMAKE_SOURCE_DIR}/cmake/kvslim.h2m VERBATIM)
  add_custom_target(kvslim_man ALL DEPENDS ${CMAKE_BINARY_DIR}/man/kvslim.1.gz)
  install(FILES ${CMAKE_BINARY_DIR}/man/kvslim.1.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
else()
  message(STATUS "kvslim: help2man not found (Debian help2man), the man page is not built")
endif()

# Debian package: one package with everything above, for /usr; the run-time dependencies are the
# libraries the binaries link (dpkg-shlibdeps, Debian dpkg-dev), the Python module's python3 from
# the interpreter it was built for. The public headers need only the C++ standard library.
set(CPACK_PACKAGE_NAME kvslim)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "long-context LLM inference on the CPU with KV-cache compression")
set(CPACK_PACKAGE_DESCRIPTION "kvslim runs Llama-family GGUF models on the CPU and compresses their KV cache \
with presses (SnapKV, StreamingLLM, KVzip, AdaKV and others, as in NVIDIA kvpress), measuring what the cache \
holds. The package has the kvslim command, the C++ library and headers (CMake package and pkg-config file), \
the Python module and a small bundled model.")
set(CPACK_PACKAGE_CONTACT "kvslim maintainers" CACHE STRING "Maintainer field of the Debian package")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
# OpenBLAS is loaded by its path at run time (src/kernels/blas_loader.cpp), so dpkg-shlibdeps does not
# see it: the package names the pthread build, the one the path points at.
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libopenblas0-pthread")
if(TARGET _kvslim)
  math(EXPR KVSLIM_PY_NEXT_MINOR "${Python3_VERSION_MINOR} + 1")
  string(APPEND CPACK_DEBIAN_PACKAGE_DEPENDS
         ", python3 (>= ${Python3_VERSION_MAJOR}.${Python3_VERSION_MINOR}), python3 (<< ${Python3_VERSION_MAJOR}.${KVSLIM_PY_NEXT_MINOR})")
endif()
set(CPACK_GENERATOR DEB)
include(CPack)
