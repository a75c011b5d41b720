# embed.cmake - writes OUT, a C file holding IN's bytes as ddpmd_openapi_yaml (GET /openapi.yaml
# serves the contract the binary was built with). Run: cmake -DIN=... -DOUT=... -P embed.cmake
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" n)
math(EXPR len "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE ${OUT}.tmp "/* generated from openapi.yaml by api/embed.cmake */\n#include <stddef.h>\n"
     "extern const char ddpmd_openapi_yaml[];\nextern const size_t ddpmd_openapi_yaml_len;\n"
     "const char ddpmd_openapi_yaml[] = {\n${bytes}0};\nconst size_t ddpmd_openapi_yaml_len = ${len};\n")
file(RENAME ${OUT}.tmp ${OUT})
