# embed.cmake - writes OUT, a C file holding IN's bytes (NUL-terminated) as the array NAME and its
# length as NAME_len: openapi.yaml for GET /openapi.yaml (the contract the binary was built with)
# and web/'s dashboard files for GET / and /ui/... (api.c's static table), so the binary serves
# them without reading a file. Run: cmake -DIN=... -DOUT=... -DNAME=... -P embed.cmake
if(NOT NAME)
  message(FATAL_ERROR "embed.cmake: -DNAME=symbol is required")
endif()
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" n)
math(EXPR len "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
get_filename_component(base ${IN} NAME)
file(WRITE ${OUT}.tmp "/* generated from ${base} by api/embed.cmake */\n#include <stddef.h>\n"
     "extern const char ${NAME}[];\nextern const size_t ${NAME}_len;\n"
     "const char ${NAME}[] = {\n${bytes}0};\nconst size_t ${NAME}_len = ${len};\n")
file(RENAME ${OUT}.tmp ${OUT})
