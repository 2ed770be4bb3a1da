/* kn_cpu.c - run-time CPU feature detection and the force-scalar switch
 * (see kn_ops.h). */
#include "kn_ops.h"

#include <stdatomic.h>

static atomic_int g_force_scalar;

int kn_cpu_has_avx2(void)
{
#if defined(__x86_64__) || defined(__i386__)
    /* All three are needed: the *_avx2.c files are built with -mavx2 -mfma
     * -mf16c and may use any of them. */
    static atomic_int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
            __builtin_cpu_supports("f16c");
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
