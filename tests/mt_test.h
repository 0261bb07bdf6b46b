/*
 * mt_test.h — the EXPECT macro of the C unit tests: a failed condition is
 * printed with file:line and counted in n_fail (each test's main returns
 * non-zero when n_fail > 0). New tests include this instead of writing the
 * macro again.
 */
#ifndef MT_TEST_H
#define MT_TEST_H

#include <stdio.h>

static int n_fail = 0;

#define EXPECT(cond, ...)                                                      \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s:%d: FAILED: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                      \
            fputc('\n', stderr);                                               \
            n_fail++;                                                          \
        }                                                                      \
    } while (0)

#endif
