/* test_cpus.c - kn_cpus.h: the cgroup CPU limit's parsers, the walk over
 * a process's cgroups (on fake trees), the affinity mask, and the default
 * thread counts that follow from them (the pool, mcrt_open over a plan
 * sized for 4 threads, mrun's --json). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kn_cpus.h"
#include "kn_ops.h"
#include "mcrt.h"
#include "testutil.h"

static uint32_t v2(const char *s)
{
    return kn_cpu_quota_v2(s, strlen(s));
}

static uint32_t v1(const char *q, const char *p)
{
    return kn_cpu_quota_v1(q, strlen(q), p, strlen(p));
}

static void test_cpu_max_parses_what_the_kernel_writes(void **st)
{
    (void)st;
    assert_int_equal(v2("max 100000\n"), 0);
    assert_int_equal(v2("max\n"), 0);
    assert_int_equal(v2("200000 100000\n"), 2);
    assert_int_equal(v2("150000 100000\n"), 2); /* 1.5 CPUs: 2 threads */
    assert_int_equal(v2("50000 100000\n"), 1);
    assert_int_equal(v2("100000\n"), 1);        /* the default period */
    assert_int_equal(v2("400000 50000"), 8);
    /* not the kernel's text: no limit */
    const char *bad[] = {"", "\n", "abc", "-1", "0 100000", "100000 0",
                         "200000 100000 7", "200000x 100000", "200000 abc",
                         "99999999999999999999 100000", "1e6 100000"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(v2(bad[i]), 0);
    /* not NUL-terminated: only len bytes are read */
    assert_int_equal(kn_cpu_quota_v2("300000 100000999", 13), 3);
}

static void test_cfs_quota_parses_v1(void **st)
{
    (void)st;
    assert_int_equal(v1("-1\n", "100000\n"), 0);
    assert_int_equal(v1("300000\n", "100000\n"), 3);
    assert_int_equal(v1("250000", "100000"), 3);
    assert_int_equal(v1("1000", "100000"), 1);
    assert_int_equal(v1("x", "100000"), 0);
    assert_int_equal(v1("100000", "0"), 0);
    assert_int_equal(v1("100000", ""), 0);
}

static void put(const char *dir, const char *name, const char *text)
{
    char *d = tu_fmt("mkdir -p '%s'", dir);
    assert_int_equal(tu_run(d, NULL, NULL), 0);
    free(d);
    char *p = tu_fmt("%s/%s", dir, name);
    assert_int_equal(tu_write_file(p, text, strlen(text)), 0);
    free(p);
}

static uint32_t at(const char *root, const char *proc)
{
    return kn_cpu_quota_at(root, proc, strlen(proc));
}

static void test_the_lowest_limit_on_the_cgroup_path_counts(void **st)
{
    (void)st;
    char *tmp = tu_mkdtemp("cpus");
    char *root = tu_fmt("%s/cg", tmp);
    char *a = tu_fmt("%s/a", root), *ab = tu_fmt("%s/a/b", root);
    put(root, "cpu.max", "max 100000\n");
    put(a, "cpu.max", "300000 100000\n");
    put(ab, "cpu.max", "max 100000\n");
    assert_int_equal(at(root, "0::/a/b\n"), 3);
    assert_int_equal(at(root, "0::/a/b/c/d\n"), 3); /* not visible: parents */
    assert_int_equal(at(root, "0::/\n"), 0);
    put(root, "cpu.max", "200000 100000\n"); /* a container's own limit */
    assert_int_equal(at(root, "0::/a/b\n"), 2);
    assert_int_equal(at(root, "0::/elsewhere\n"), 2);
    /* cgroup v2 beside v1 (root/unified), and v1's cpu controller under
     * its joined name or root/cpu */
    char *u = tu_fmt("%s/unified/x", root);
    put(u, "cpu.max", "100000 100000\n");
    assert_int_equal(at(root, "0::/x\n"), 1);
    char *c1 = tu_fmt("%s/cpu,cpuacct/docker/c", root);
    put(c1, "cpu.cfs_quota_us", "-1\n");
    put(c1, "cpu.cfs_period_us", "100000\n");
    char *c1p = tu_fmt("%s/cpu,cpuacct/docker", root);
    put(c1p, "cpu.cfs_quota_us", "500000\n");
    put(c1p, "cpu.cfs_period_us", "100000\n");
    assert_int_equal(at(root, "4:cpu,cpuacct:/docker/c\n1:name=systemd:/\n"), 5);
    assert_int_equal(at(root, "4:cpuacct:/docker/c\n"), 0); /* not cpu */
    char *c2 = tu_fmt("%s/cpu/k8s", root);
    put(c2, "cpu.cfs_quota_us", "150000\n");
    put(c2, "cpu.cfs_period_us", "100000\n");
    assert_int_equal(at(root, "3:cpu:/k8s\n"), 2);
    /* text that is not /proc/self/cgroup's: nothing read */
    char *up = tu_fmt("%s/up", tmp);
    put(up, "cpu.max", "100000 100000\n");
    assert_int_equal(at(root, "0::/../up\n"), 0); /* lines ignored */
    assert_int_equal(at(root, "0::a/b\n"), 0);
    assert_int_equal(at(root, "0::/./a\n"), 0);
    assert_int_equal(at(root, ""), 0);
    assert_int_equal(at(root, "garbage without colons\n::\n"), 0);
    /* a FIFO where cpu.max should be is not opened for reading (no hang) */
    char *f = tu_fmt("%s/fifo", root);
    assert_int_equal(mkdir(f, 0755), 0);
    char *ff = tu_fmt("%s/cpu.max", f);
    assert_int_equal(mkfifo(ff, 0644), 0);
    put(root, "cpu.max", "max 100000\n");
    assert_int_equal(at(root, "0::/fifo\n"), 0);
    free(ff);
    free(f);
    free(up);
    free(c2);
    free(c1p);
    free(c1);
    free(u);
    free(ab);
    free(a);
    free(root);
    tu_rmtree(tmp);
    free(tmp);
}

/* Run the rest of a test on the first CPU of the affinity mask only. */
static int pin_to_one_cpu(cpu_set_t *saved)
{
    if (sched_getaffinity(0, sizeof *saved, saved) != 0)
        return -1;
    int first = -1;
    for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
        if (CPU_ISSET(c, saved))
            first = c;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    return sched_setaffinity(0, sizeof one, &one);
}

static void test_count_follows_the_affinity_mask(void **st)
{
    (void)st;
    int n = kn_cpu_count();
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    assert_true(n >= 1 && n <= (online > 0 ? online : 1));
    cpu_set_t saved;
    assert_int_equal(pin_to_one_cpu(&saved), 0);
    assert_int_equal(kn_cpu_count(), 1);
    kn_pool *p = kn_pool_create(0);
    assert_non_null(p);
    assert_int_equal(kn_pool_threads(p), 1);
    kn_pool_free(p);
    assert_int_equal(sched_setaffinity(0, sizeof saved, &saved), 0);
    assert_int_equal(kn_cpu_count(), n);
}

/* An artifact planned for 4 threads (mcompile's default) runs on the CPUs
 * there are unless told otherwise: through the API and through mrun. */
static void test_a_plan_for_more_threads_runs_on_the_cpus_there_are(void **st)
{
    (void)st;
    char *tmp = tu_mkdtemp("cpus-art");
    char *art = tu_fmt("%s/m.mca", tmp);
    char *out = NULL, *err = NULL;
    assert_int_equal(tu_run_bin(&out, &err, "mcompile",
                                "%s/llama --target 64MiB -q -o %s",
                                MC_FIXTURE_DIR, art), 0);
    cpu_set_t saved;
    assert_int_equal(pin_to_one_cpu(&saved), 0);
    mcrt_options o;
    mcrt_options_default(&o);
    o.device = MCRT_DEVICE_CPU;
    mcrt *h = NULL;
    mcrt_info info;
    assert_int_equal(mcrt_open(art, &o, &h), 0);
    assert_int_equal(mcrt_get_info(h, &info), 0);
    assert_int_equal(info.threads, 1);
    mcrt_close(h);
    o.threads = 3; /* asked for: kept (the plan has room for 4) */
    assert_int_equal(mcrt_open(art, &o, &h), 0);
    assert_int_equal(mcrt_get_info(h, &info), 0);
    assert_int_equal(info.threads, 3);
    mcrt_close(h);
    /* mrun inherits the mask */
    assert_int_equal(tu_run_bin(&out, &err, "mrun",
                                "%s --device cpu --tokens '1 2 3' "
                                "--max-new-tokens 2 --json", art), 0);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    assert_non_null(j);
    assert_int_equal(json_integer_value(json_object_get(j, "threads")), 1);
    json_decref(j);
    /* no idle CPU under the mask: no note */
    assert_null(strstr(err, "note:"));
    assert_int_equal(sched_setaffinity(0, sizeof saved, &saved), 0);
    /* a plan for 1 thread on a machine with more CPUs says so, unless -q */
    char *one = tu_fmt("%s/one.mca", tmp);
    assert_int_equal(tu_run_bin(&out, &err, "mcompile",
                                "%s/llama --target 64MiB --threads 1 -q -o %s",
                                MC_FIXTURE_DIR, one), 0);
    const char *cmd = "%s --device cpu --tokens '1 2 3' --max-new-tokens 2 %s";
    assert_int_equal(tu_run_bin(&out, &err, "mrun", cmd, one, ""), 0);
    if (kn_cpu_count() > 1) {
        assert_non_null(strstr(err, "plan is sized for 1"));
        assert_non_null(strstr(err, "--threads"));
    } else {
        assert_null(strstr(err, "note:"));
    }
    assert_int_equal(tu_run_bin(&out, &err, "mrun", cmd, one, "-q"), 0);
    assert_null(strstr(err, "note:"));
    free(one);
    free(out);
    free(err);
    free(art);
    tu_rmtree(tmp);
    free(tmp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_max_parses_what_the_kernel_writes),
        cmocka_unit_test(test_cfs_quota_parses_v1),
        cmocka_unit_test(test_the_lowest_limit_on_the_cgroup_path_counts),
        cmocka_unit_test(test_count_follows_the_affinity_mask),
        cmocka_unit_test(test_a_plan_for_more_threads_runs_on_the_cpus_there_are),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
