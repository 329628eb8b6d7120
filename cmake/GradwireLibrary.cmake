# gradwire_add_library(<folder> SOURCES ... DEPS ...)
#   Declares the layer library gradwire_<folder> (alias gradwire::<folder>) whose public
#   headers live in <folder>/include/gradwire/<folder>/, and installs it.
function(gradwire_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(gradwire_${name} ${ARG_SOURCES})
  add_library(gradwire::${name} ALIAS gradwire_${name})
  target_include_directories(gradwire_${name} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
    PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_link_libraries(gradwire_${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  install(TARGETS gradwire_${name} EXPORT gradwireTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(DIRECTORY include/gradwire DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endfunction()

# gradwire_add_tests(<folder> [OWN_MAIN] [LABEL <label>] SOURCES ... DEPS ...)
#   One GoogleTest binary per layer; each *_test.cc file is one unit; every test case is
#   registered with CTest. Tests run from the source tree root so test data paths are stable.
#   OWN_MAIN: the sources define main() (e.g. to re-run the binary as a child process).
#   LABEL: the CTest label (default: the folder's name).
#   A test that calls GTEST_SKIP is reported by CTest as skipped ("Not Run"), never as passed.
#   Tests run with GRADWIRE_TEST_ENVIRONMENT (set in the top CMakeLists.txt).
function(gradwire_add_tests name)
  if(NOT GRADWIRE_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(ARG "OWN_MAIN" "LABEL" "SOURCES;DEPS" ${ARGN})
  if(NOT ARG_LABEL)
    set(ARG_LABEL ${name})
  endif()
  # cmake/test_environment.cc: every test binary's job secret (run by ctest or by hand).
  add_executable(gradwire_${name}_tests ${ARG_SOURCES} ${PROJECT_SOURCE_DIR}/cmake/test_environment.cc)
  target_link_libraries(gradwire_${name}_tests PRIVATE ${ARG_DEPS} GTest::gtest)
  if(NOT ARG_OWN_MAIN)
    target_link_libraries(gradwire_${name}_tests PRIVATE GTest::gtest_main)
  endif()
  if(GRADWIRE_TSAN)
    target_sources(gradwire_${name}_tests PRIVATE ${PROJECT_SOURCE_DIR}/cmake/tsan/absl_mutex_annotations.cc)
    target_link_libraries(gradwire_${name}_tests PRIVATE ${CMAKE_DL_LIBS})
  endif()
  target_compile_definitions(gradwire_${name}_tests PRIVATE
    GRADWIRE_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  if(ARG_LABEL STREQUAL "gpu")
    target_include_directories(gradwire_${name}_tests PRIVATE ${PROJECT_SOURCE_DIR}/cmake)  # require_gpu.h
  endif()
  gtest_discover_tests(gradwire_${name}_tests
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS ${ARG_LABEL} TIMEOUT 300 ENVIRONMENT "${GRADWIRE_TEST_ENVIRONMENT}"
               SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
endfunction()

# gradwire_enable_vectorization(<target>)
#   For libraries whose loops are written to be auto-vectorised (kernels, optimizer updates):
#   - -fno-math-errno: otherwise std::sqrt/std::exp keep a branch to the libm call that
#     sets errno, which blocks vectorisation (nothing in gradwire reads errno);
#   - GCC's -O2 uses the "very cheap" vectoriser cost model, which refuses loops of unknown
#     trip count; the dynamic model vectorises them (measured: ReLU over a [128, 1024]
#     tensor went from a scalar loop to SSE/AVX). Release builds (-O3) already do this.
function(gradwire_enable_vectorization target)
  target_compile_options(${target} PRIVATE -fno-math-errno
    $<$<CXX_COMPILER_ID:GNU>:-fvect-cost-model=dynamic>)
endfunction()
