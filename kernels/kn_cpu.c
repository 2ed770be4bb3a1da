/* kn_cpu.c - run-time CPU feature detection and the force-scalar switch
 * (see kn_ops.h). */
#include "kn_ops.h"

#include <stdatomic.h>
#include <stdlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

static atomic_int g_force_scalar;
static atomic_int g_no_avx512;
static atomic_int g_no_bf16;

#if defined(__x86_64__) || defined(__i386__)
/* cpuid directly rather than __builtin_cpu_supports: clang 14 does not know
 * "f16c" there.  Also checks that the OS saves YMM state (OSXSAVE + XCR0). */
static int detect_avx2_fma_f16c(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    int f16c = (c >> 29) & 1;
    if (!(fma && osxsave && avx && f16c))
        return 0;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 6) != 6) /* XMM and YMM state enabled */
        return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    return (b >> 5) & 1; /* AVX2 */
}
#endif

#if defined(__x86_64__) || defined(__i386__)
/* AVX-512 F (leaf 7 EBX 16), DQ (17), BW (30), VL (31) and VNNI (ECX 11),
 * and XCR0 saving opmask, ZMM0-15 upper halves and ZMM16-31 (bits 5-7) as
 * well as XMM/YMM. */
static int detect_avx512(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1))
        return 0;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 0xe6) != 0xe6)
        return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    unsigned need_b = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31);
    return (b & need_b) == need_b && ((c >> 11) & 1);
}
#endif

int kn_cpu_has_avx512(void)
{
#if defined(__x86_64__) || defined(__i386__)
    static atomic_int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        const char *off = getenv("MC_NO_AVX512");
        v = off && *off && *off != '0' ? 0 : detect_avx512() && kn_cpu_has_avx2();
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v && !atomic_load_explicit(&g_no_avx512, memory_order_relaxed);
#else
    return 0;
#endif
}

void kn_set_no_avx512(int on)
{
    atomic_store(&g_no_avx512, on ? 1 : 0);
}

int kn_cpu_has_avx512bf16(void)
{
#if defined(__x86_64__) || defined(__i386__)
    static atomic_int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        unsigned a = 0, b, c, d;
        const char *off = getenv("MC_NO_BF16");
        /* leaf 7 subleaf 1 EAX bit 5: AVX512_BF16 (subleaf 0's EAX is
         * the last subleaf) */
        v = !(off && *off && *off != '0') && __get_cpuid_count(7, 0, &a, &b, &c, &d) &&
            a >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 5) & 1);
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v && kn_cpu_has_avx512() &&
           !atomic_load_explicit(&g_no_bf16, memory_order_relaxed);
#else
    return 0;
#endif
}

void kn_set_no_bf16(int on)
{
    atomic_store(&g_no_bf16, on ? 1 : 0);
}

int kn_cpu_has_avx2(void)
{
#if defined(__x86_64__) || defined(__i386__)
    /* All three are needed: the *_avx2.c files are built with -mavx2 -mfma
     * -mf16c and may use any of them. */
    static atomic_int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        /* MC_NO_AVX2=1 in the environment: use the scalar kernels (to
         * compare numerics, or on a CPU that misreports its features). */
        const char *off = getenv("MC_NO_AVX2");
        v = off && *off && *off != '0' ? 0 : detect_avx2_fma_f16c();
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v;
#else
    return 0;
#endif
}

void kn_set_force_scalar(int on)
{
    atomic_store(&g_force_scalar, on ? 1 : 0);
}

int kn_force_scalar(void)
{
    return atomic_load_explicit(&g_force_scalar, memory_order_relaxed);
}
