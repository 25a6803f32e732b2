/* A minimal NVTX tool for the CPU tests of oocgemm.diagnostics.nvtx (tests/test_nvtx.py).
 *
 * Loaded the way Nsight Systems and CUPTI are: NVTX_INJECTION64_PATH names this library, and
 * each NVTX instance in the process (the nvtx package's, a libnvtx3interop/libnvToolsExt, CuPy's)
 * calls InitializeInjectionNvtx2 on its first NVTX call. It handles the core and domain range
 * calls and appends one line per call to the file FAKE_NVTX_LOG names:
 *
 *   push <tid> <domain> <color> <message>     (domain "-" for the default one)
 *   pop <tid> <domain>
 *
 * Its extension entry point accepts every module and handles none of its calls, so
 * nvtxDomainIsEnabled says 1 (enabled) for every domain, unless FAKE_NVTX_REJECT_EXTENSIONS is
 * set (see the end of this file).
 *
 * Self-contained (no NVTX headers): the layouts below are those of nvtx3/nvToolsExt.h and
 * nvtx3/nvtxDetail/nvtxTypes.h, which NVTX keeps stable across versions.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct {
    uint16_t version;
    uint16_t size;
    uint32_t category;
    int32_t colorType;
    uint32_t color;
    int32_t payloadType;
    int32_t reserved0;
    uint64_t payload;
    int32_t messageType; /* 1 ASCII, 2 wide, 3 registered */
    const void *message;
} attributes_t;

typedef void (*fn_t)(void);
typedef int (*get_table_t)(int module, fn_t ***table, unsigned int *size);
typedef struct {
    size_t struct_size;
    get_table_t GetModuleFunctionTable;
} callbacks_t;
typedef const void *(*get_export_table_t)(uint32_t id);

enum { MODULE_CORE = 1, MODULE_CORE2 = 5 };
enum { CORE_RangePushEx = 8, CORE_RangePushA = 9, CORE_RangePop = 11 };
enum { CORE2_DomainRangePushEx = 4, CORE2_DomainRangePop = 5, CORE2_DomainRegisterStringA = 10,
       CORE2_DomainCreateA = 12 };

static FILE *out;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static long tid(void) { return (long)syscall(SYS_gettid); }

static const char *message(const attributes_t *a) {
    if (a == NULL || a->message == NULL) return "";
    if (a->messageType == 1 || a->messageType == 3) return (const char *)a->message;
    return "?"; /* wide strings: not used by oocgemm */
}

static void line(const char *what, const char *domain, const attributes_t *a) {
    if (out == NULL) return;
    pthread_mutex_lock(&lock);
    if (a != NULL)
        fprintf(out, "%s %ld %s %08x %s\n", what, tid(), domain,
                a->colorType == 1 ? a->color : 0u, message(a));
    else
        fprintf(out, "%s %ld %s\n", what, tid(), domain);
    fflush(out);
    pthread_mutex_unlock(&lock);
}

/* A domain handle and a registered string handle are both the name itself (strdup). */
static void *domain_create(const char *name) { return strdup(name ? name : ""); }
static void *register_string(void *domain, const char *s) { (void)domain; return strdup(s); }
static int domain_push(void *domain, const attributes_t *a) {
    line("push", domain ? (const char *)domain : "-", a);
    return 0;
}
static int domain_pop(void *domain) { line("pop", domain ? (const char *)domain : "-", NULL); return 0; }
static int push_ex(const attributes_t *a) { line("push", "-", a); return 0; }
static int push_a(const char *s) {
    attributes_t a = {0};
    a.messageType = 1;
    a.message = s;
    line("push", "-", &a);
    return 0;
}
static int pop(void) { line("pop", "-", NULL); return 0; }

static void set(fn_t **table, unsigned int size, unsigned int id, fn_t fn) {
    if (id < size && table[id] != NULL) *table[id] = fn;
}

int InitializeInjectionNvtx2(get_export_table_t get) {
    const callbacks_t *cb = (const callbacks_t *)get(1);
    fn_t **table = NULL;
    unsigned int size = 0;
    if (cb == NULL) return 0;
    pthread_mutex_lock(&lock);
    if (out == NULL && getenv("FAKE_NVTX_LOG") != NULL) out = fopen(getenv("FAKE_NVTX_LOG"), "a");
    pthread_mutex_unlock(&lock);
    if (cb->GetModuleFunctionTable(MODULE_CORE, &table, &size) && table) {
        set(table, size, CORE_RangePushEx, (fn_t)push_ex);
        set(table, size, CORE_RangePushA, (fn_t)push_a);
        set(table, size, CORE_RangePop, (fn_t)pop);
    }
    if (cb->GetModuleFunctionTable(MODULE_CORE2, &table, &size) && table) {
        set(table, size, CORE2_DomainCreateA, (fn_t)domain_create);
        set(table, size, CORE2_DomainRegisterStringA, (fn_t)register_string);
        set(table, size, CORE2_DomainRangePushEx, (fn_t)domain_push);
        set(table, size, CORE2_DomainRangePop, (fn_t)domain_pop);
    }
    return 1;
}

/* The NVTX extensions' entry point (payload, counters, ...): with FAKE_NVTX_REJECT_EXTENSIONS
 * set it fails, as a tool does that rejects an extension module it does not know (CUPTI 13.0
 * takes the payload extension of compatibility ids 0x0103 and 0x0104 only). NVTX then answers
 * nvtxDomainIsEnabled with 0 for every domain, and the nvtx package hands out dummy domains,
 * though the core calls (the ranges) still reach this tool. */
int InitializeInjectionNvtxExtension(void *module_info) {
    (void)module_info;
    return getenv("FAKE_NVTX_REJECT_EXTENSIONS") != NULL ? 0 : 1;
}
