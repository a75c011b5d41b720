# version.cmake - writes OUT (ddpmd_version.h): DDPMD_VERSION (VERSION, the project's) and
# DDPMD_GIT (`git describe --always --dirty --tags` of SRC, "" when SRC is no git checkout or git
# is missing). Run at every build (ddpmd --version, ddpmd_build_info); the file is rewritten only
# when its text changes, so an unchanged tree recompiles nothing.
execute_process(COMMAND git -C "${SRC}" describe --always --dirty --tags
                OUTPUT_VARIABLE git OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  set(git "")
endif()
# a describe is [A-Za-z0-9._+-]; nothing else reaches a C string or a metrics label
string(REGEX REPLACE "[^A-Za-z0-9._+-]" "" git "${git}")
set(text "/* ddpmd_version.h - made by server/version.cmake at build time */\n#define DDPMD_VERSION \"${VERSION}\"\n#define DDPMD_GIT \"${git}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
