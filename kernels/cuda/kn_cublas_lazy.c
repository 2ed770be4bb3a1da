/*
 * kn_cublas_lazy.c - cuBLAS loaded at its first use, not at program start.
 *
 * Why: linking libcublas makes the dynamic loader map and relocate
 * libcublas + libcublasLt (~600 MB of files) at start: 215 MB of resident
 * memory in every run of mcompile and mrun, even a `merge` or `--help` that
 * never touches a GPU.  libcudart alone costs ~0.5 MB, so it stays linked
 * (nvcc's kernel registration runs from static constructors and needs it at
 * start); only cuBLAS is deferred.
 *
 * How: this file defines the cuBLAS entry points the project calls (the
 * names cublas_v2.h maps cublasCreate & co. to), with cuBLAS's own
 * prototypes from its header, so callers (the .cu files of kernels/cuda,
 * runtime/rt_cuda*.c) stay plain cuBLAS code.  The first call dlopens
 * libcublas.so.<major> (the major version we were built against; first by
 * soname, then in the toolkit's library folder known at build time) and
 * looks every entry up once.  When the library or an entry is missing,
 * every call returns CUBLAS_STATUS_NOT_INITIALIZED and
 * cublasGetStatusString says why, so callers report a named MC_ERR_CUDA as
 * for any other cuBLAS failure.  The executable does not export these
 * names (nothing shared was linked against them), so libcublas's own
 * internal calls cannot bind to them.
 *
 * A cuBLAS entry the project starts calling must be added here: the link
 * fails with "undefined reference to cublasXxx" until it is.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <cublas_v2.h>

#include "kn_cuda.h"

#ifndef MC_CUBLAS_DIR
#define MC_CUBLAS_DIR ""
#endif

#define KN_STR2(x) #x
#define KN_STR(x) KN_STR2(x)
#define KN_CUBLAS_SONAME "libcublas.so." KN_STR(CUBLAS_VER_MAJOR)

typedef cublasStatus_t (*create_fn)(cublasHandle_t *);
typedef cublasStatus_t (*destroy_fn)(cublasHandle_t);
typedef cublasStatus_t (*set_stream_fn)(cublasHandle_t, cudaStream_t);
typedef cublasStatus_t (*get_stream_fn)(cublasHandle_t, cudaStream_t *);
typedef cublasStatus_t (*set_workspace_fn)(cublasHandle_t, void *, size_t);
typedef const char *(*status_string_fn)(cublasStatus_t);
typedef cublasStatus_t (*saxpy_fn)(cublasHandle_t, int, const float *,
                                   const float *, int, float *, int);
typedef cublasStatus_t (*dgemm_fn)(cublasHandle_t, cublasOperation_t,
                                   cublasOperation_t, int, int, int,
                                   const double *, const double *, int,
                                   const double *, int, const double *,
                                   double *, int);
typedef cublasStatus_t (*dsyrk_fn)(cublasHandle_t, cublasFillMode_t,
                                   cublasOperation_t, int, int,
                                   const double *, const double *, int,
                                   const double *, double *, int);
typedef cublasStatus_t (*sgemm_fn)(cublasHandle_t, cublasOperation_t,
                                   cublasOperation_t, int, int, int,
                                   const float *, const float *, int,
                                   const float *, int, const float *,
                                   float *, int);
typedef cublasStatus_t (*gemm_ex_fn)(cublasHandle_t, cublasOperation_t,
                                     cublasOperation_t, int, int, int,
                                     const void *, const void *,
                                     cudaDataType, int, const void *,
                                     cudaDataType, int, const void *, void *,
                                     cudaDataType, int, cublasComputeType_t,
                                     cublasGemmAlgo_t);

/* Filled once by load(); all NULL when loading failed. */
static struct {
    void *lib;                 /* dlopen handle, never closed */
    create_fn create;
    destroy_fn destroy;
    set_stream_fn set_stream;
    get_stream_fn get_stream;
    set_workspace_fn set_workspace;
    status_string_fn status_string;
    saxpy_fn saxpy;
    dgemm_fn dgemm;
    dsyrk_fn dsyrk;
    gemm_ex_fn gemm_ex;
    sgemm_fn sgemm;
    char why[512];             /* why loading failed ("" when it worked) */
} g_blas;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* dlsym into *slot; 0 when missing (and says which in g_blas.why). */
static int find(void *lib, const char *name, void **slot)
{
    *slot = dlsym(lib, name);
    if (*slot == NULL)
        snprintf(g_blas.why, sizeof g_blas.why, "%s has no symbol %s",
                 KN_CUBLAS_SONAME, name);
    return *slot != NULL;
}

static void load(void)
{
    /* RTLD_LOCAL: cuBLAS's symbols stay out of the global scope. */
    void *lib = dlopen(KN_CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL && MC_CUBLAS_DIR[0] != '\0')
        lib = dlopen(MC_CUBLAS_DIR "/" KN_CUBLAS_SONAME,
                     RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char *e = dlerror();
        snprintf(g_blas.why, sizeof g_blas.why,
                 "cuBLAS could not be loaded: %s", e ? e : KN_CUBLAS_SONAME);
        return;
    }
    void *p[11];
    int ok = find(lib, "cublasCreate_v2", &p[0]) &&
             find(lib, "cublasDestroy_v2", &p[1]) &&
             find(lib, "cublasSetStream_v2", &p[2]) &&
             find(lib, "cublasGetStream_v2", &p[3]) &&
             find(lib, "cublasSetWorkspace_v2", &p[4]) &&
             find(lib, "cublasGetStatusString", &p[5]) &&
             find(lib, "cublasSaxpy_v2", &p[6]) &&
             find(lib, "cublasDgemm_v2", &p[7]) &&
             find(lib, "cublasDsyrk_v2", &p[8]) &&
             find(lib, "cublasGemmEx", &p[9]) &&
             find(lib, "cublasSgemm_v2", &p[10]);
    if (!ok) {
        dlclose(lib);
        return;
    }
    /* POSIX: a dlsym result converts to a function pointer through a
     * same-sized object; memcpy states that without a cast warning. */
    g_blas.lib = lib;
    memcpy(&g_blas.create, &p[0], sizeof p[0]);
    memcpy(&g_blas.destroy, &p[1], sizeof p[1]);
    memcpy(&g_blas.set_stream, &p[2], sizeof p[2]);
    memcpy(&g_blas.get_stream, &p[3], sizeof p[3]);
    memcpy(&g_blas.set_workspace, &p[4], sizeof p[4]);
    memcpy(&g_blas.status_string, &p[5], sizeof p[5]);
    memcpy(&g_blas.saxpy, &p[6], sizeof p[6]);
    memcpy(&g_blas.dgemm, &p[7], sizeof p[7]);
    memcpy(&g_blas.dsyrk, &p[8], sizeof p[8]);
    memcpy(&g_blas.gemm_ex, &p[9], sizeof p[9]);
    memcpy(&g_blas.sgemm, &p[10], sizeof p[10]);
}

/* 1 when cuBLAS is loaded (loading it now on the first call). */
static int ready(void)
{
    pthread_once(&g_once, load);
    return g_blas.lib != NULL;
}

int kn_cublas_loaded(void)
{
    return g_blas.lib != NULL;
}

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t *handle)
{
    return ready() ? g_blas.create(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle)
{
    return ready() ? g_blas.destroy(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle,
                                               cudaStream_t streamId)
{
    return ready() ? g_blas.set_stream(handle, streamId)
                   : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasGetStream_v2(cublasHandle_t handle,
                                               cudaStream_t *streamId)
{
    return ready() ? g_blas.get_stream(handle, streamId)
                   : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSetWorkspace_v2(cublasHandle_t handle,
                                                  void *workspace,
                                                  size_t workspaceSizeInBytes)
{
    return ready() ? g_blas.set_workspace(handle, workspace,
                                          workspaceSizeInBytes)
                   : CUBLAS_STATUS_NOT_INITIALIZED;
}

const char *CUBLASWINAPI cublasGetStatusString(cublasStatus_t status)
{
    if (ready())
        return g_blas.status_string(status);
    return g_blas.why;
}

cublasStatus_t CUBLASWINAPI cublasSaxpy_v2(cublasHandle_t handle, int n,
                                           const float *alpha,
                                           const float *x, int incx,
                                           float *y, int incy)
{
    return ready() ? g_blas.saxpy(handle, n, alpha, x, incx, y, incy)
                   : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasDgemm_v2(cublasHandle_t handle,
                                           cublasOperation_t transa,
                                           cublasOperation_t transb, int m,
                                           int n, int k, const double *alpha,
                                           const double *A, int lda,
                                           const double *B, int ldb,
                                           const double *beta, double *C,
                                           int ldc)
{
    return ready() ? g_blas.dgemm(handle, transa, transb, m, n, k, alpha, A,
                                  lda, B, ldb, beta, C, ldc)
                   : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSgemm_v2(cublasHandle_t handle,
                                           cublasOperation_t transa,
                                           cublasOperation_t transb, int m,
                                           int n, int k, const float *alpha,
                                           const float *A, int lda,
                                           const float *B, int ldb,
                                           const float *beta, float *C,
                                           int ldc)
{
    return ready() ? g_blas.sgemm(handle, transa, transb, m, n, k, alpha, A,
                                  lda, B, ldb, beta, C, ldc)
                   : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasDsyrk_v2(cublasHandle_t handle,
                                           cublasFillMode_t uplo,
                                           cublasOperation_t trans, int n,
                                           int k, const double *alpha,
                                           const double *A, int lda,
                                           const double *beta, double *C,
                                           int ldc)
{
    return ready() ? g_blas.dsyrk(handle, uplo, trans, n, k, alpha, A, lda,
                                  beta, C, ldc)
                   : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasGemmEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
    int m, int n, int k, const void *alpha, const void *A, cudaDataType Atype,
    int lda, const void *B, cudaDataType Btype, int ldb, const void *beta,
    void *C, cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
    cublasGemmAlgo_t algo)
{
    return ready() ? g_blas.gemm_ex(handle, transa, transb, m, n, k, alpha, A,
                                    Atype, lda, B, Btype, ldb, beta, C, Ctype,
                                    ldc, computeType, algo)
                   : CUBLAS_STATUS_NOT_INITIALIZED;
}
