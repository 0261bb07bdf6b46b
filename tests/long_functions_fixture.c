/*
 * long_functions_fixture.c — the shapes scripts/long_functions.py must parse
 * (its --self-test, run by ctest test_long_functions). Never compiled: it
 * only has to look like the C and CUDA of src/ and tools/. Each EXPECT line
 * names a definition in file order: its name, the line its signature starts
 * on, its length in lines (signature to closing brace), and for two of them
 * whether the comment above says why.
 *
 * EXPECT lines (in order):
 */
// EXPECT plain 32 4
// EXPECT own_line_type 37 5
// EXPECT split_signature 43 6
// EXPECT one_liner 50 1
// EXPECT inline_brace 52 4
// EXPECT braces_in_literals 57 8
// EXPECT __launch_bounds_kernel 73 4
// EXPECT attributed 78 4
// EXPECT in_extern_c 84 4
// EXPECT indented_close 91 3
// EXPECT pick 95 4
// EXPECT fp_param 100 4
// EXPECT with_why 108 3 why
// EXPECT without_why 113 3 no-why
// EXPECT last 116 3
#include <stddef.h>
#define MT_LOOKS_LIKE_A_BODY(x)  \
    do {                         \
        (x)++;                   \
    } while (0)

static int plain(int x)
{
    return x + 1;
}

static const char *
own_line_type(void)
{
    return "}";
}

int split_signature(const float *a,
                    const float *b,
                    size_t n)
{
    return a == b && n;
}

static inline int one_liner(int x) { return x; }

static inline float inline_brace(float x) {
    /* a comment with a brace } */
    return x;
}

static char braces_in_literals(int i)
{
    const char *s = "{{{ \" }";
    char c = '{';
    char d = '\'';
    (void)d;
    return i ? c : s[0];
}

struct not_a_function { int a; };
enum not_one_either { A, B };
static const int table[] = {1, 2, 3};
static const struct not_a_function init = {
    .a = 1,
};

__global__ void __launch_bounds__(256) __launch_bounds_kernel(float *x, int n)
{
    if (n) x[0] = 0;
}

static void attributed(int x)
    __attribute__((unused))
{
}

extern "C" {
void in_extern_c(void)
{
    MT_LOOKS_LIKE_A_BODY(x);
}
}

#ifdef NEVER
    static void indented_close(void)
    {
    }
#endif
static int (*pick(int k))(int)
{
    return k ? plain : 0;
}

void fp_param(void (*cb)(int), int n)
{
    cb(n);
}

/* Long on purpose: the reason would go here (the why-rule reads this comment
 * whole, however many lines it spans). */

void with_why(void)
{
}

/* a comment without the word */
void without_why(void)
{
}
int last(void) {
    return 0;
}
