# char_model_resume.cmake — README's walk-through program resumed in a new process:
# one run trains to step 100; another trains to 50 and saves, and a third process loads
# that file and trains on to 100. The two runs must print the same losses for steps 60-100
# (to the float's last bit: %.9g) and the same CRC-32 of the final model, optimizer and
# TrainStep states.
#   cmake -DPROGRAM=<char_model> -DWORK=<dir> [-DPRECISION=bf16] -P char_model_resume.cmake
cmake_minimum_required(VERSION 3.20)
if(NOT PRECISION)
  set(PRECISION bf16)
endif()
file(MAKE_DIRECTORY "${WORK}")
set(state "${WORK}/char_model_${PRECISION}.tmstate")
file(REMOVE "${state}")

function(run_program out_var)
  execute_process(COMMAND "${PROGRAM}" --precision ${PRECISION} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  string(REPLACE ";" " " args "${ARGN}")
  message("$ char_model --precision ${PRECISION} ${args}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "char_model ${args} exited with ${rc}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

# The lines two runs must share: steps after 50, and the final state's checksum.
function(after_50 text out_var)
  string(REGEX MATCHALL "step +(6|7|8|9|10)0 [^\n]*|final: [^\n]*" lines "${text}")
  set(${out_var} "${lines}" PARENT_SCOPE)
endfunction()

run_program(whole --steps 100)
run_program(first --steps 50 --save "${state}")
run_program(second --steps 100 --resume "${state}")
file(REMOVE "${state}")

after_50("${whole}" expected)
after_50("${second}" resumed)
list(LENGTH expected n)
if(NOT n EQUAL 6)
  message(FATAL_ERROR "the run to step 100 printed ${n} of the 6 lines compared (steps 60-100, final)")
endif()
if(NOT "${expected}" STREQUAL "${resumed}")
  message(FATAL_ERROR "the resumed run differs from the run without a break:\n  ${expected}\nvs\n  ${resumed}")
endif()
if(NOT first MATCHES "saved [^\n]* at step 50" OR NOT second MATCHES "resumed [^\n]* at step 50")
  message(FATAL_ERROR "the first run did not save at step 50, or the second did not resume there")
endif()
message("char_model ${PRECISION}: resumed at step 50, steps 60-100 and the final state bitwise equal")
