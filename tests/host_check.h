/* tests/host_check.h — what the host test programs share: the CHECK macro with its counters,
 * a seeded splitmix64 generator, and a generator of awkward logits. Include once per program
 * (everything is static); functions are static inline so a program need not use them all. */
#ifndef LOSSFUSE_TESTS_HOST_CHECK_H
#define LOSSFUSE_TESTS_HOST_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long g_checks = 0, g_failed = 0;
static unsigned long long g_seed = 0;

/* One check: counted; on failure one line with the seed (the first 200 failures). */
#define CHECK(cond, ...)                                                                        \
    do {                                                                                        \
        ++g_checks;                                                                             \
        if (!(cond)) {                                                                          \
            ++g_failed;                                                                         \
            if (g_failed <= 200) {                                                              \
                printf("FAIL %s:%d seed=%llu: ", __FILE__, __LINE__, g_seed);                   \
                printf(__VA_ARGS__);                                                            \
                printf("\n");                                                                   \
            }                                                                                   \
        }                                                                                       \
    } while (0)

static uint64_t g_rng;
static inline uint64_t rng_u64(void)
{ /* splitmix64 */
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline double rng_unif(void) { return (double)(rng_u64() >> 11) * (1.0 / 9007199254740992.0); }
static inline int64_t rng_int(int64_t n) { return (int64_t)(rng_u64() % (uint64_t)n); } /* [0, n) */
static inline double rng_normal(void)
{
    double a = rng_unif(), b = rng_unif();
    return sqrt(-2.0 * log(a + 1e-300)) * cos(6.283185307179586 * b);
}

/* Logits: normals, x8 normals, small integers (ties), outliers with |x| log-uniform up to
 * `big` (1e4 for value checks, ~60 for gradient checks), and a fraction `pinf` of -inf. */
static inline float gen_logit(double big, double pinf)
{
    double r = rng_unif();
    if (r < pinf) return -INFINITY;
    r = rng_unif();
    if (r < 0.55) return (float)rng_normal();
    if (r < 0.75) return (float)(8.0 * rng_normal());
    if (r < 0.85) return (float)floor(3.0 * rng_normal());
    return (float)((rng_unif() < 0.5 ? -1.0 : 1.0) * exp(rng_unif() * log(big)));
}

/* main() of a host test: run_all(seed) once with a fixed seed and once with a fresh one
 * (time(), or argv[1] to reproduce a failure); a summary line; exit 0 when every check passed. */
static inline int host_check_main(int argc, char **argv, const char *name, unsigned long long fixed,
                                  void (*run_all)(unsigned long long))
{
    unsigned long long seed = argc > 1 ? strtoull(argv[1], NULL, 0) : (unsigned long long)time(NULL);
    printf("%s: seeds %llu (fixed) and %llu (this run; pass it as argv[1] to reproduce)\n", name, fixed, seed);
    run_all(fixed);
    run_all(seed);
    printf("%s: %ld checks, %ld failed\n", name, g_checks, g_failed);
    return g_failed ? 1 : 0;
}

#endif
