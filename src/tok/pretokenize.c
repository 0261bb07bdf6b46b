/*
 * pretokenize.c — the GPT-4 split pattern, written by hand for UTF-8 bytes.
 *
 * The pattern (tiktoken cl100k) is, alternatives tried in order:
 *   1. '(?i:[sdmt]|ll|ve|re)              contractions
 *   2. [^\r\n\p{L}\p{N}]?+\p{L}+          a word, with one leading non-letter
 *   3. \p{N}{1,3}                         numbers, at most 3 digits a piece
 *   4.  ?[^\s\p{L}\p{N}]++[\r\n]*          punctuation run (+ optional space)
 *   5. \s*[\r\n]                          whitespace up to the last newline
 *   6. \s+(?!\S)                          whitespace, leaving the last one
 *                                         to the next word
 *   7. \s+
 * Invariant: every call consumes at least one byte and never splits a valid
 * UTF-8 sequence; a byte that is not part of valid UTF-8 is its own
 * "codepoint" of class OTHER, so any byte string is covered and the chunks
 * concatenate back to the input exactly.
 *
 * Unicode classes without tables: ASCII is exact; other codepoints are
 * letters unless they fall in the whitespace, digit or punctuation/symbol
 * ranges listed in cp_class (docs/tokenizer.md says which).
 */
#include "mt_tok.h"

enum cls { CL_LETTER = 0, CL_NUMBER, CL_SPACE, CL_OTHER };

static int in(uint32_t c, uint32_t lo, uint32_t hi) { return c >= lo && c <= hi; }

static enum cls cp_class(uint32_t c)
{
    if (c < 0x80) {
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return CL_LETTER;
        if (c >= '0' && c <= '9') return CL_NUMBER;
        if (c == ' ' || in(c, 0x09, 0x0d)) return CL_SPACE;
        return CL_OTHER;
    }
    /* Unicode White_Space */
    if (c == 0x85 || c == 0xa0 || c == 0x1680 || in(c, 0x2000, 0x200a) || c == 0x2028 ||
        c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000)
        return CL_SPACE;
    /* digits and number forms */
    if (c == 0xb2 || c == 0xb3 || c == 0xb9 || in(c, 0xbc, 0xbe) || in(c, 0x660, 0x669) ||
        in(c, 0x6f0, 0x6f9) || in(c, 0x966, 0x96f) || in(c, 0x2150, 0x218f) ||
        in(c, 0x2460, 0x249b) || in(c, 0xff10, 0xff19))
        return CL_NUMBER;
    /* letters inside Latin-1 punctuation block */
    if (c == 0xaa || c == 0xb5 || c == 0xba) return CL_LETTER;
    /* controls, punctuation, symbols, combining marks, emoji, private use */
    if (in(c, 0x80, 0xbf) || c == 0xd7 || c == 0xf7 || in(c, 0x300, 0x36f) ||
        in(c, 0x2000, 0x2bff) || in(c, 0x2e00, 0x2e7f) || in(c, 0x3000, 0x303f) ||
        in(c, 0xe000, 0xf8ff) || in(c, 0xfe00, 0xfe4f) || in(c, 0xff01, 0xff0f) ||
        in(c, 0xff1a, 0xff20) || in(c, 0xff3b, 0xff40) || in(c, 0xff5b, 0xff65) ||
        in(c, 0xfff0, 0xffff) || in(c, 0x1f000, 0x1faff))
        return CL_OTHER;
    return CL_LETTER;
}

/* Decode one codepoint at s[i] (strict UTF-8: no overlongs, surrogates or
 * > U+10FFFF). Returns its length in bytes (1 for an invalid byte, whose
 * class is OTHER) and its class. */
static size_t decode(const uint8_t *s, size_t n, size_t i, enum cls *cl)
{
    uint8_t b = s[i];
    if (b < 0x80) { *cl = cp_class(b); return 1; }
    size_t len;
    uint32_t c;
    uint8_t lo = 0x80, hi = 0xbf;
    if (b >= 0xc2 && b <= 0xdf) { len = 2; c = b & 0x1f; }
    else if (b >= 0xe0 && b <= 0xef) {
        len = 3; c = b & 0x0f;
        if (b == 0xe0) lo = 0xa0;
        if (b == 0xed) hi = 0x9f;
    } else if (b >= 0xf0 && b <= 0xf4) {
        len = 4; c = b & 0x07;
        if (b == 0xf0) lo = 0x90;
        if (b == 0xf4) hi = 0x8f;
    } else { *cl = CL_OTHER; return 1; }
    if (i + len > n) { *cl = CL_OTHER; return 1; }
    for (size_t k = 1; k < len; k++) {
        uint8_t t = s[i + k];
        if (t < (k == 1 ? lo : 0x80) || t > (k == 1 ? hi : 0xbf)) { *cl = CL_OTHER; return 1; }
        c = (c << 6) | (t & 0x3f);
    }
    *cl = cp_class(c);
    return len;
}

static int is_crlf(uint8_t b) { return b == '\r' || b == '\n'; }
static uint8_t lower(uint8_t b) { return (b >= 'A' && b <= 'Z') ? (uint8_t)(b | 0x20) : b; }

/* End of the run of codepoints of class `want` starting at j (at most `max`
 * codepoints; 0 = no limit). */
static size_t run_of(const uint8_t *s, size_t n, size_t j, enum cls want, int max)
{
    int k = 0;
    while (j < n && (max == 0 || k < max)) {
        enum cls cl;
        size_t len = decode(s, n, j, &cl);
        if (cl != want) break;
        j += len;
        k++;
    }
    return j;
}

size_t mt_tok_pretok_next(const uint8_t *s, size_t n, size_t i)
{
    MT_ASSERT(i < n);
    enum cls c0;
    size_t len0 = decode(s, n, i, &c0);

    /* 1. contractions */
    if (s[i] == '\'' && i + 1 < n) {
        uint8_t a = lower(s[i + 1]);
        if (a == 's' || a == 'd' || a == 'm' || a == 't') return i + 2;
        if (i + 2 < n) {
            uint8_t b = lower(s[i + 2]);
            if ((a == 'l' && b == 'l') || (a == 'v' && b == 'e') || (a == 'r' && b == 'e'))
                return i + 3;
        }
    }
    /* 2. [^\r\n\p{L}\p{N}]?+\p{L}+ */
    {
        size_t j = i;
        int ok = 1;
        if (c0 != CL_LETTER) {
            if (c0 == CL_NUMBER || is_crlf(s[i])) ok = 0;
            else j = i + len0;
        }
        if (ok) {
            size_t e = run_of(s, n, j, CL_LETTER, 0);
            if (e > j) return e;
        }
    }
    /* 3. \p{N}{1,3} */
    if (c0 == CL_NUMBER) return run_of(s, n, i, CL_NUMBER, 3);
    /* 4. ' ?[^\s\p{L}\p{N}]++[\r\n]*' */
    {
        size_t j = (s[i] == ' ') ? i + 1 : i;
        size_t e = run_of(s, n, j, CL_OTHER, 0);
        if (e > j) {
            while (e < n && is_crlf(s[e])) e++;
            return e;
        }
    }
    /* 5-7: whitespace run [i, e) */
    if (c0 == CL_SPACE) {
        size_t e = i, last_nl = (size_t)-1, last_start = i;
        while (e < n) {
            enum cls cl;
            size_t len = decode(s, n, e, &cl);
            if (cl != CL_SPACE) break;
            if (is_crlf(s[e])) last_nl = e;
            last_start = e;
            e += len;
        }
        if (last_nl != (size_t)-1) return last_nl + 1;   /* 5 */
        if (e == n) return e;                              /* 6, at end of text */
        if (last_start > i) return last_start;             /* 6 */
        return e;                                          /* 7 */
    }
    return i + len0; /* not reached: every class is handled above */
}
