# tests/backend/cuda/host_exit_guard.cmake — fails when compiled CUDA host code calls exit().
#
# nvcc compiles a host function's call to a __device__-only function into `exit(1)`
# and says nothing (NOTE [Device-only names] in backend/cuda/element_io.cuh). The layout
# makes such a call a compile error when written unqualified; this scan catches the rest
# (an explicit `device::` qualification, a new helper outside that namespace) on any
# machine, GPU or not: it disassembles the host code of every given object and fails
# if a function whose name involves trainmem (a function of the library, or one
# instantiated on its types, such as a lambda inside cuda::Backend or a launcher
# template) calls `exit`. Library code never calls exit, so every such hit is the
# fingerprint; a program's own argument parser may call exit and is not flagged. A
# launcher the compiler inlines whole into a caller outside trainmem would be missed,
# which is why the layout (NOTE [Device-only names]) is the first line of defence.
# The scan must see trainmem::cuda functions at all, so a change in the disassembler's
# output cannot make it pass by seeing nothing.
#
# cmake -DOBJDUMP=<objdump> -DOBJECTS="a.o|b.o|..." -P host_exit_guard.cmake
cmake_minimum_required(VERSION 3.25)

if(NOT OBJDUMP OR NOT OBJECTS)
  message(FATAL_ERROR "host_exit_guard: pass -DOBJDUMP=<objdump> and -DOBJECTS=<a.o|b.o|...>")
endif()
string(REPLACE "|" ";" objects "${OBJECTS}")

# One line per trainmem function that calls exit: "<object>: <function>"; then "seen <n>", the
# number of host functions of trainmem::cuda in the object. A call to exit shows as a
# relocation against the symbol `exit` (objects) or a call to <exit@plt> (linked code).
set(awk_program [=[
/^[0-9a-f]+ <.*>:$/ { fn = $0; sub(/^[0-9a-f]+ </, "", fn); sub(/>:$/, "", fn); if (fn ~ /trainmem::cuda::/) seen++; next }
/R_X86_64_(PLT32|PC32|PLT64|GOTPCREL|GOTPCRELX|REX_GOTPCRELX)[ \t]+exit([-+]0x[0-9a-f]+)?$/ || /call.*<exit@plt>/ {
  if (fn ~ /trainmem::/ && !(fn in hit)) { hit[fn] = 1; print FILENAME_ ": " fn }
}
END { print "seen " seen + 0 }
]=])

set(total_seen 0)
set(failures "")
foreach(object IN LISTS objects)
  if(NOT EXISTS "${object}")
    message(FATAL_ERROR "host_exit_guard: ${object} does not exist (build the CUDA targets first)")
  endif()
  get_filename_component(name "${object}" NAME)
  execute_process(
    COMMAND "${OBJDUMP}" -dr -C --no-show-raw-insn "${object}"
    COMMAND awk -v "FILENAME_=${name}" "${awk_program}"
    OUTPUT_VARIABLE report
    RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "host_exit_guard: objdump | awk failed on ${object}: ${status}")
  endif()
  string(REGEX MATCH "seen ([0-9]+)" _ "${report}")
  set(seen "${CMAKE_MATCH_1}")
  math(EXPR total_seen "${total_seen} + ${seen}")
  string(REGEX REPLACE "seen [0-9]+\n?$" "" hits "${report}")
  string(APPEND failures "${hits}")
  message(STATUS "${name}: ${seen} host functions of trainmem::cuda scanned")
endforeach()

if(total_seen EQUAL 0)
  message(FATAL_ERROR "host_exit_guard: no host function of trainmem::cuda found in ${OBJECTS}; "
                      "the scan no longer understands the disassembly")
endif()
if(NOT failures STREQUAL "")
  message(FATAL_ERROR "host_exit_guard: trainmem host code calls exit() — the fingerprint of a host call to a "
                      "__device__-only function (NOTE [Device-only names]):\n${failures}")
endif()
message(STATUS "host_exit_guard: no trainmem host function calls exit (${total_seen} trainmem::cuda functions scanned)")
