# cython: language_level=3
"""JSON scanning shared by the compiled modules (inlined into each one that cimports it)."""


cdef inline Py_ssize_t json_ws(const unsigned char* p, Py_ssize_t i, Py_ssize_t n) noexcept:
    """The offset of the first byte at or after ``i`` that is not JSON whitespace."""
    # One compare for the usual answer (a token, not whitespace): every whitespace byte is
    # at most a space.
    while i < n and p[i] <= 32 and (p[i] == 32 or p[i] == 10 or p[i] == 13 or p[i] == 9):
        i += 1
    return i


# A JSON string's inside is mostly bytes that need no look (hex digits, names): these find the
# next one that does sixteen bytes at a time (SSE2, which every x86-64 has), else eight (SWAR,
# word operations), instead of three tests per byte.  Two rules, one scanner: ``plain_run``
# stops at '"', '\\' or a control byte (a byte >= 0x80 is plain: UTF-8 inside a string);
# ``printable_run`` also at every byte >= 0x80 (printable ASCII only: what the lane reads in
# place, leaving anything else to a decoder).
cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    #if defined(__SSE2__)
    #include <emmintrin.h>
    #endif
    #define CG_ONES 0x0101010101010101ULL
    #define CG_HIGHS 0x8080808080808080ULL

    /* No '"', no '\\' and no byte below 0x20 among these eight, nor (ascii) one >= 0x80
       (exact: a byte >= 0x80 is otherwise plain, and a borrow only ever sets a bit where a
       byte already matched). */
    static inline int cg_plain8(uint64_t w, int ascii) {
        uint64_t quote = w ^ (CG_ONES * 0x22), slash = w ^ (CG_ONES * 0x5c);
        uint64_t found = ((w - CG_ONES * 0x20) & ~w) | ((quote - CG_ONES) & ~quote)
                         | ((slash - CG_ONES) & ~slash) | (ascii ? w : 0);
        return (found & CG_HIGHS) == 0;
    }

    /* The offset of the first byte at or after i that is not plain (n: none). */
    static inline Py_ssize_t cg_string_run(const unsigned char* p, Py_ssize_t i, Py_ssize_t n,
                                           int ascii) {
        uint64_t w;
    #if defined(__SSE2__)
        const __m128i quote = _mm_set1_epi8(0x22), slash = _mm_set1_epi8(0x5c);
        const __m128i ctrl = _mm_set1_epi8(0x1f), space = _mm_set1_epi8(0x20);
        while (i + 16 <= n) {
            __m128i x = _mm_loadu_si128((const __m128i*)(p + i));
            /* ascii: a signed compare below 0x20 also catches every byte >= 0x80 */
            __m128i low = ascii ? _mm_cmplt_epi8(x, space)
                                : _mm_cmpeq_epi8(_mm_min_epu8(x, ctrl), x);
            __m128i hit = _mm_or_si128(
                _mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, slash)), low);
            int mask = _mm_movemask_epi8(hit);
            if (mask)
                return i + __builtin_ctz((unsigned)mask);
            i += 16;
        }
    #endif
        while (i + 8 <= n) {
            memcpy(&w, p + i, 8);
            if (!cg_plain8(w, ascii))
                break;
            i += 8;
        }
        while (i < n && p[i] != 0x22 && p[i] != 0x5c && p[i] >= 0x20 && !(ascii && p[i] >= 0x80))
            i++;
        return i;
    }

    static inline Py_ssize_t cg_plain_run(const unsigned char* p, Py_ssize_t i, Py_ssize_t n) {
        return cg_string_run(p, i, n, 0);
    }

    static inline Py_ssize_t cg_printable_run(const unsigned char* p, Py_ssize_t i,
                                              Py_ssize_t n) {
        return cg_string_run(p, i, n, 1);
    }

    /* Any byte >= 0x80 among the n at p?  Every byte's high bit OR-ed together, 32 bytes a
       turn (no early exit: a body is almost always ASCII). */
    static inline int cg_any_high(const unsigned char* p, Py_ssize_t n) {
        Py_ssize_t i = 0;
        uint64_t seen = 0, w;
    #if defined(__SSE2__)
        __m128i a = _mm_setzero_si128(), b = _mm_setzero_si128();
        for (; i + 32 <= n; i += 32) {
            a = _mm_or_si128(a, _mm_loadu_si128((const __m128i*)(p + i)));
            b = _mm_or_si128(b, _mm_loadu_si128((const __m128i*)(p + i + 16)));
        }
        if (_mm_movemask_epi8(_mm_or_si128(a, b)))
            return 1;
    #endif
        for (; i + 8 <= n; i += 8) {
            memcpy(&w, p + i, 8);
            seen |= w;
        }
        for (; i < n; i++)
            seen |= p[i];
        return (seen & CG_HIGHS) != 0;
    }
    """
    Py_ssize_t plain_run "cg_plain_run"(const unsigned char* p, Py_ssize_t i,
                                         Py_ssize_t n) noexcept
    Py_ssize_t printable_run "cg_printable_run"(const unsigned char* p, Py_ssize_t i,
                                                 Py_ssize_t n) noexcept
    bint any_high "cg_any_high"(const unsigned char* p, Py_ssize_t n) noexcept
