// compile_cpp.cpp — lossfuse.h as strict C++17 with every configuration macro set explicitly:
//     g++ -std=c++17 -Wall -Wextra -pedantic -Werror -I. tests/compile_cpp.cpp -o compile_cpp -lm
// The same calls and checks as compile_c.c (compile_checks.h), but with LF_USE_EXP2 0 (plain
// expf), so that both settings are compiled and run; the checks hold for either.
#include <cassert>
#include <cstdio>
#include <cstring>

#define LF_HD static inline
#define LF_USE_EXP2 0
#define LF_ASSERT(c) assert(c)
#include "lossfuse.h"

#if LF_USE_EXP2 != 0
#error "LF_USE_EXP2 was overridden"
#endif

#if LF_VERSION_MAJOR != 0 || LF_VERSION_MINOR != 1 || LF_VERSION_PATCH != 0
#error "unexpected lossfuse.h version"
#endif

#define LF_COMPILE_NAME "compile_cpp"
#include "compile_checks.h"
