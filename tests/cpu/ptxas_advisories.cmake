# Compiles one CUDA source for sm_90a with ptxas's report (-Xptxas -v) and fails when ptxas
# reports a performance loss, e.g. C7518 "wgmma.mma_async instructions are serialized": the
# kernel stays correct, so no other test notices, yet the Hopper gemm_to_sparse ran 13 % slower
# with it (docs/gemm_to_sparse.md). ptxas prints these as "info", which -Werror does not catch.
#   cmake -DNVCC=... -DSOURCE=... -DINCLUDES="dir;dir" -P ptxas_advisories.cmake
foreach(_var NVCC SOURCE INCLUDES)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "ptxas_advisories.cmake: -D${_var}=... is required")
  endif()
endforeach()
set(_args -std=c++20 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -cubin -Xptxas -v)
foreach(_dir IN LISTS INCLUDES)
  list(APPEND _args -I${_dir})
endforeach()
get_filename_component(_name ${SOURCE} NAME_WE)
set(_cubin ${CMAKE_CURRENT_BINARY_DIR}/ptxas_advisories_${_name}.cubin)
execute_process(COMMAND ${NVCC} ${_args} ${SOURCE} -o ${_cubin} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out
                ERROR_VARIABLE _out)
file(REMOVE ${_cubin})
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "nvcc failed on ${SOURCE} (status ${_rc}):\n${_out}")
endif()
string(REGEX MATCHALL "[^\n]*Performance Loss[^\n]*" _losses "${_out}")
if(_losses)
  list(JOIN _losses "\n" _text)
  message(FATAL_ERROR "ptxas reports a performance loss in ${SOURCE}:\n${_text}")
endif()
message(STATUS "${SOURCE}: no performance advisory from ptxas")
