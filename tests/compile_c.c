/* compile_c.c — lossfuse.h as strict C99 with every configuration macro set explicitly:
 *     gcc -std=c99 -Wall -Wextra -pedantic -Werror -I. tests/compile_c.c -o compile_c -lm
 * Calls a representative function of every section and returns 0 when a few results that can
 * be checked by hand hold (compile_checks.h, shared with compile_cpp.cpp, which compiles the same
 * calls as C++ with LF_USE_EXP2 0, so both settings of LF_USE_EXP2 are compiled and run). */
#include <assert.h>
#include <stdio.h>

#define LF_HD static inline
#define LF_USE_EXP2 1
#define LF_ASSERT(c) assert(c)
#include "lossfuse.h"

#if LF_VERSION_MAJOR != 0 || LF_VERSION_MINOR != 1 || LF_VERSION_PATCH != 0
#error "unexpected lossfuse.h version"
#endif

#define LF_COMPILE_NAME "compile_c"
#include "compile_checks.h"
