# A machine with no OpenCL device: a suite skips (exit 77, said loudly) when run by hand, and
# fails (exit 1) under CI=true, so CI can never report green on a machine where nothing ran.
# OCL_ICD_VENDORS pointing at an empty folder makes Debian's ICD loader find no platform.
# Run as: cmake -DPROGRAM=<a check suite> -DWORK_DIR=<scratch> -P no_device_test.cmake
file(MAKE_DIRECTORY ${WORK_DIR}/no-icd)
foreach(ci "" "true")
  execute_process(COMMAND ${CMAKE_COMMAND} -E env OCL_ICD_VENDORS=${WORK_DIR}/no-icd CI=${ci}
                          CLATTN_DEVICE= ${PROGRAM}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(ci STREQUAL "true")
    set(want_rc 1)
    set(want_text "FAILED under CI=true: NO OPENCL DEVICE")
  else()
    set(want_rc 77)
    set(want_text "SKIPPED, nothing was tested: NO OPENCL DEVICE")
  endif()
  string(FIND "${out}" "${want_text}" at)
  if(NOT rc EQUAL want_rc OR at EQUAL -1)
    message(FATAL_ERROR "CI='${ci}', no device: exit ${rc} (want ${want_rc}), output:\n${out}\n${err}")
  endif()
  message(STATUS "CI='${ci}', no device: exit ${rc}, '${want_text}'")
endforeach()
