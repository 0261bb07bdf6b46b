/*
 * mt_test.h — the EXPECT macros of the C unit tests: a failed condition is
 * printed with file:line and counted in n_fail (each test's main returns
 * non-zero when n_fail > 0). Every C test includes this instead of writing
 * the macros again.
 *
 *     EXPECT(x == 3);                          // the condition is the message
 *     EXPECT(x == 3, "x = %d after %s", x, s); // plus a printf-style note
 *     EXPECT_ERR(rc, MT_ERR_IO, "cannot open"); // (mt_core.h) status and message
 *
 * The note must be a string literal: it is pasted after " " so that a note
 * with arguments keeps its printf format check and one without is legal.
 * EXPECT_ERR needs core/mt_core.h included before this header.
 */
#ifndef MT_TEST_H
#define MT_TEST_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int n_fail = 0;

static inline __attribute__((format(printf, 1, 2))) void mt_test_note_(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

#define EXPECT(cond, ...)                                                      \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s:%d: FAILED: %s:", __FILE__, __LINE__, #cond);  \
            mt_test_note_(" " __VA_ARGS__);                                    \
            n_fail++;                                                          \
        }                                                                      \
    } while (0)

#ifdef MT_CORE_H
/* st == want and the context's message contains needle (NULL: any message). */
static inline void mt_test_expect_err(const char *file, int line, struct mt_ctx *ctx, enum mt_status st,
                                       enum mt_status want, const char *needle)
{
    const char *msg = mt_ctx_last_error(ctx);
    if (st != want || (needle && !strstr(msg, needle))) {
        fprintf(stderr, "%s:%d: FAILED: got %s (want %s), message '%s' (want to contain '%s')\n", file, line,
                mt_status_str(st), mt_status_str(want), msg, needle ? needle : "");
        n_fail++;
    }
}
#define EXPECT_ERR_AT(c, st, want, needle) mt_test_expect_err(__FILE__, __LINE__, (c), (st), (want), (needle))
/* the test's context is the local `ctx` */
#define EXPECT_ERR(st, want, needle) EXPECT_ERR_AT(&ctx, (st), (want), (needle))
#endif

#endif
