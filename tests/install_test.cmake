# ctest install_package: installs the build into a scratch prefix, then checks the package as a
# user would: examples/embed built with find_package(clattn) (shared and static), the same
# program built with pkg-config, the installed clattn command, and that libclattn.so exports
# nothing but the public API; with MPI, examples/embed_mpi through find_package(clattn
# COMPONENTS mpi) and pkg-config clattn_mpi, run on 2 ranks.
# Arguments: -DBUILD_DIR= -DSOURCE_DIR= -DC_COMPILER= [-DEXTRA_C_FLAGS=] [-DWITH_MPI=ON
# -DMPIEXEC=mpiexec]
set(work ${BUILD_DIR}/install-test)
set(prefix ${work}/prefix)
file(REMOVE_RECURSE ${work})

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${what}: ok\n${out}")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

run_step("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
run_step("configure examples/embed with find_package(clattn)"
  ${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/embed -B ${work}/embed
  -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_C_COMPILER=${C_COMPILER}
  "-DCMAKE_C_FLAGS=${EXTRA_C_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${EXTRA_C_FLAGS}")
run_step("build examples/embed" ${CMAKE_COMMAND} --build ${work}/embed)

# The device-running steps: 77 (no device) is passed on as "skipped", except under CI=true,
# where a machine without a device must not report green.
foreach(program embed_queue embed_queue_static)
  execute_process(COMMAND ${work}/embed/${program} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(rc EQUAL 77 AND "$ENV{CI}" STREQUAL "true")
    message(FATAL_ERROR "${program}: no OpenCL device under CI=true: nothing was tested")
  elseif(rc EQUAL 77)
    message(STATUS "no OpenCL device: SKIPPED, nothing was tested")
    cmake_language(EXIT 77)
  elseif(NOT rc EQUAL 0)
    message(FATAL_ERROR "${program} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${program}: ${out}")
endforeach()

# pkg-config: the installed clattn.pc alone is enough to compile and link.
file(GLOB pc_file ${prefix}/*/pkgconfig/clattn.pc ${prefix}/*/*/pkgconfig/clattn.pc)
if(NOT pc_file)
  message(FATAL_ERROR "clattn.pc was not installed under ${prefix}")
endif()
get_filename_component(pc_dir ${pc_file} DIRECTORY)
set(ENV{PKG_CONFIG_PATH} ${pc_dir})
run_step("pkg-config --cflags --libs clattn" pkg-config --cflags --libs clattn)
separate_arguments(pc_flags UNIX_COMMAND "${step_output}")
run_step("cc with pkg-config" ${C_COMPILER} ${SOURCE_DIR}/examples/embed/embed_queue.c
  -o ${work}/embed_pkgconfig ${pc_flags} -lm ${EXTRA_C_FLAGS} -Wl,-rpath,${pc_dir}/..)
run_step("embed_queue built with pkg-config" ${work}/embed_pkgconfig)

# libclattn_mpi (built with -DCLATTN_MPI=ON): examples/embed_mpi through
# find_package(clattn COMPONENTS mpi) and through pkg-config clattn_mpi, each run on 2 ranks.
if(WITH_MPI)
  run_step("configure examples/embed_mpi with find_package(clattn COMPONENTS mpi)"
    ${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/embed_mpi -B ${work}/embed_mpi
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_C_COMPILER=${C_COMPILER}
    "-DCMAKE_C_FLAGS=${EXTRA_C_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${EXTRA_C_FLAGS}")
  run_step("build examples/embed_mpi" ${CMAKE_COMMAND} --build ${work}/embed_mpi)
  run_step("pkg-config --cflags --libs clattn_mpi" pkg-config --cflags --libs clattn_mpi)
  separate_arguments(pc_mpi_flags UNIX_COMMAND "${step_output}")
  run_step("cc with pkg-config clattn_mpi" ${C_COMPILER}
    ${SOURCE_DIR}/examples/embed_mpi/embed_ring.c -o ${work}/embed_ring_pkgconfig
    ${pc_mpi_flags} -lm ${EXTRA_C_FLAGS} -Wl,-rpath,${pc_dir}/..)
  foreach(program ${work}/embed_mpi/embed_ring ${work}/embed_ring_pkgconfig)
    run_step("${program} on 2 ranks" ${MPIEXEC} --allow-run-as-root --oversubscribe -n 2
      ${program})
  endforeach()
else()
  message(STATUS "built without -DCLATTN_MPI=ON: the clattn_mpi package is not checked")
endif()

# The installed command runs from its prefix.
run_step("installed clattn --version" ${prefix}/bin/clattn --version)

# Only the public API is exported.
file(GLOB libs ${prefix}/*/libclattn.so ${prefix}/*/*/libclattn.so)
run_step("nm -D libclattn.so" nm -D --defined-only ${libs})
string(REGEX MATCHALL "[0-9a-f]+ [TDBR] [A-Za-z_][A-Za-z0-9_]*" symbols "${step_output}")
foreach(symbol ${symbols})
  if(NOT symbol MATCHES " clattn_[a-z]" OR symbol MATCHES " clattn__")
    message(FATAL_ERROR "libclattn.so exports a non-public symbol: ${symbol}")
  endif()
endforeach()
list(LENGTH symbols count)
message(STATUS "libclattn.so exports ${count} symbols, all public clattn_*")
