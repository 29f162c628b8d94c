/*
 * A fake libnvidia-ml.so.1 for tests: enough of NVML for discovery, MIG, topology,
 * metrics and XID health, driven by a scenario file and controlled from the test.
 *
 * The scenario is read from the file named by FAKE_NVML_SCENARIO each time the
 * library goes from uninitialised to initialised (so one process can switch
 * scenarios between tests). Format: one record per line, "kind key=value ...";
 * values may be double-quoted; '#' starts a comment. See scenarios/README.md.
 *
 * Test controls (exported, called through ctypes):
 *   fake_nvml_inject_event(gpu, type, data, gi, ci) -> number of event sets woken
 *   fake_nvml_inject_xid(gpu, xid)                  -> same, whole-GPU XID
 *   fake_nvml_set_lost(gpu, lost)                   -> mark a GPU lost (or back)
 *   fake_nvml_wait_waiters(n, timeout_ms)           -> 1 once n threads wait in nvmlEventSetWait
 *   fake_nvml_set_value(gpu, name, value)           -> change temp/util/power/memused
 *   fake_nvml_set_proc_util(gpu, pid, sm, mem)      -> a new utilization sample of a process
 *   fake_nvml_reset()                               -> forget everything (next init reloads)
 *   fake_nvml_call_count(gpu)                       -> device calls so far on a GPU
 *   fake_nvml_release_hangs()                       -> calls blocked by a hang=1 fault return
 *   fake_nvml_wait_hanging(n, timeout_ms)           -> 1 once n calls block in a hang fault
 *   fake_nvml_set_present(n)                        -> only the first n GPUs are there
 *                                                      (hot-plug; scenario line "present n")
 *
 * Control from another process (the plugin run as its own process, as deployed):
 * with FAKE_NVML_CONTROL=<fifo>, the first nvmlInit starts a thread that reads
 * lines "xid <gpu> <xid>" or "lost <gpu> <0|1>" from that FIFO and applies them.
 *
 * Build: gcc -shared -fPIC -O2 -pthread -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1 fake_nvml.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_UNKNOWN = 999,
};

/* Public NVML structures, laid out as nvml.h (and pynvml's ctypes) define them. */
typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount,
        sharedEncoderCount, sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount,
        computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

typedef struct fdev *nvmlDevice_t;
typedef struct fdev *nvmlGpuInstance_t; /* the MIG device that is the GPU instance */
typedef struct fdev *nvmlComputeInstance_t; /* the same record: one CI per GI here */

typedef struct {
    unsigned int start, size;
} nvmlGpuInstancePlacement_t;

/* nvml.h nvmlComputeInstanceProfileInfo_t (v1; pynvml c_nvmlComputeInstanceProfileInfo_t) */
typedef struct {
    unsigned int id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;

typedef struct {
    nvmlDevice_t device;
    unsigned int id, profileId;
    unsigned int start, size; /* nvmlGpuInstancePlacement_t */
} nvmlGpuInstanceInfo_t;

typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount;
    unsigned int copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

/* GPU instance profiles of an A100-SXM4-40GB: NVML's profile enum (nvml.h
 * NVML_GPU_INSTANCE_PROFILE_*: 0 = 1 slice, 1 = 2, 2 = 3, 3 = 4, 4 = 7, 7 = 1 slice
 * REV1 (media extensions), 9 = 1 slice REV2) -> the profile ID the driver reports
 * (NVIDIA's MIG user guide, A100 profiles: 1g.5gb 19, 1g.5gb+me 20, 1g.10gb 15,
 * 2g.10gb 14, 3g.20gb 9, 4g.20gb 5, 7g.40gb 0). Other enums: NOT_SUPPORTED. */
static const int a100_profile_ids[18] = {19, 14, 9, 5, 0, -1, -1, 20, -1, 15,
                                         -1, -1, -1, -1, -1, -1, -1, -1};
static const unsigned a100_profile_slices[18] = {1, 2, 3, 4, 7, 0, 0, 1, 0, 1};
/* Placements per profile enum, in memory slices (the A100's 8), as `nvidia-smi mig -lgipp`
 * prints them on an A100 (NVIDIA MIG user guide, "A100 MIG profiles" placement figure):
 * 19 {0..6}:1, 14 {0,2,4}:2, 9 {0,4}:4, 5 {0}:4, 0 {0}:8, 20 {0..6}:1, 15 {0,2,4,6}:2.
 * step = distance between starts, count = how many; instances = how many may coexist
 * (`nvidia-smi mig -lgip` "Instances Free" on an empty A100: 7, 3, 2, 1, 1, 1, 4). */
static const unsigned a100_place_size[18] = {1, 2, 4, 4, 8, 0, 0, 1, 0, 2};
static const unsigned a100_place_step[18] = {1, 2, 4, 1, 1, 0, 0, 1, 0, 2};
static const unsigned a100_place_count[18] = {7, 3, 2, 1, 1, 0, 0, 7, 0, 4};
static const unsigned a100_instances[18] = {7, 3, 2, 1, 1, 0, 0, 1, 0, 4};
/* Compute instance profile enum (nvml.h NVML_COMPUTE_INSTANCE_PROFILE_*) -> slices.
 * The profile ID a CI profile reports is taken to equal its enum (guessed; the backend
 * reads it back through nvmlGpuInstanceGetComputeInstanceProfileInfo, never assumes). */
static const unsigned ci_profile_slices[8] = {1, 2, 3, 4, 7, 8, 6, 1};
typedef struct fset *nvmlEventSet_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

/* nvml.h nvmlProcessInfo_t (v2/v3 layout; pynvml's c_nvmlProcessInfo_v3_t): pid,
 * usedGpuMemory in bytes (NVML_VALUE_NOT_AVAILABLE = ~0ULL when the driver cannot
 * tell, e.g. under WDDM), then the GPU/compute instance IDs (0xFFFFFFFF without MIG,
 * NVML API reference, "nvmlProcessInfo_t"). */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

/* nvml.h nvmlProcessUtilizationSample_t (pynvml's c_nvmlProcessUtilizationSample_t): the
 * process, the CPU timestamp of the sample in microseconds, and its SM, memory, encoder
 * and decoder utilization in percent (NVML API reference, nvmlDeviceGetProcessUtilization). */
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

/* Sizes the Python side checks against pynvml's ctypes structures. */
unsigned int fake_nvml_sizeof(const char *name) {
    if (!strcmp(name, "nvmlPciInfo_t")) return sizeof(nvmlPciInfo_t);
    if (!strcmp(name, "nvmlMemory_t")) return sizeof(nvmlMemory_t);
    if (!strcmp(name, "nvmlMemory_v2_t")) return sizeof(nvmlMemory_v2_t);
    if (!strcmp(name, "nvmlUtilization_t")) return sizeof(nvmlUtilization_t);
    if (!strcmp(name, "nvmlDeviceAttributes_t")) return sizeof(nvmlDeviceAttributes_t);
    if (!strcmp(name, "nvmlEventData_t")) return sizeof(nvmlEventData_t);
    if (!strcmp(name, "nvmlProcessInfo_t")) return sizeof(nvmlProcessInfo_t);
    if (!strcmp(name, "nvmlProcessUtilizationSample_t"))
        return sizeof(nvmlProcessUtilizationSample_t);
    if (!strcmp(name, "nvmlGpuInstanceInfo_t")) return sizeof(nvmlGpuInstanceInfo_t);
    if (!strcmp(name, "nvmlGpuInstanceProfileInfo_t"))
        return sizeof(nvmlGpuInstanceProfileInfo_t);
    return 0;
}

#define MAXGPU 16
#define MAXMIG 8
#define MAXLINK 36
#define MAXFAULT 64
#define MAXSET 16
#define MAXPROC 16
#define QLEN 64

struct fdev {
    int is_mig;
    int index; /* GPU index, or MIG index within its parent */
    struct fdev *parent;
    char uuid[96];
    char name[96];
    unsigned minor;
    unsigned long long mem_mb, used_mb;
    int cc_major, cc_minor;
    char busid[32];
    unsigned pci_device_id, pci_subsys;
    int board, sw, bridge, numa;
    int mig_capable, mig_mode;
    int nmig;
    struct fdev *migs[MAXMIG];
    unsigned gi, ci, gi_slices, ci_slices, sms;
    unsigned gi_profile; /* MIG: the GPU instance's profile ID (scenario "profile=") */
    /* MIG: the GPU instance's placement in memory slices (nvmlGpuInstancePlacement_t);
     * size 0 = unknown (a scenario "mig" line without start=/size=), never in the way
     * of a created instance */
    unsigned gi_start, gi_size;
    int has_ci;  /* MIG: a compute instance exists, so NVML lists it as a MIG device */
    int in_use;  /* a migpool slot holding an instance */
    unsigned util, memutil, temp, power_mw;
    int lost;
    long calls, lost_after;
    int max_links;
    int link_remote[MAXLINK]; /* GPU index, -1 (inactive) or -2 (an NVSwitch) */
    unsigned compute_mode; /* nvmlComputeMode_t: 0 DEFAULT ... 3 EXCLUSIVE_PROCESS */
    int nproc; /* compute processes (scenario "proc gpu=N pid=P used=MiB|-1 ...") */
    unsigned proc_pid[MAXPROC];
    long long proc_used_mb[MAXPROC]; /* -1: NVML cannot tell */
    unsigned proc_gi[MAXPROC], proc_ci[MAXPROC]; /* 0xFFFFFFFF: not on a MIG instance */
    int proc_mps[MAXPROC]; /* an MPS client: listed by the MPS call, not the plain one */
    /* the process's last utilization sample (percent); ts 0 = none (it never had a
     * non-zero utilization, so NVML has no sample of it) */
    unsigned proc_sm[MAXPROC], proc_mem[MAXPROC], proc_enc[MAXPROC], proc_dec[MAXPROC];
    unsigned long long proc_ts[MAXPROC];
};

struct fault {
    char fn[96];
    int dev; /* -1: any device (or none) */
    int mig; /* -1: any handle; >=0: only that MIG index of dev */
    int err;
    int hang; /* the call blocks until fake_nvml_release_hangs(), then runs as usual */
    long after, times, hits, fired;
};

struct event {
    struct fdev *dev;
    unsigned long long type, data;
    unsigned gi, ci;
};

struct fset {
    int used;
    unsigned long long mask[MAXGPU];
    struct event q[QLEN];
    int head, len;
    int lost_pending;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv; /* monotonic clock; initialised once */
static pthread_once_t cv_once = PTHREAD_ONCE_INIT;

static int initialised; /* NVML refcount */
static int loaded;      /* scenario loaded */
static int init_error;
static char driver_version[80] = "550.54.15";
static char nvml_version[80] = "12.550.54.15";
static int cuda_version = 12040;
static struct fdev gpus[MAXGPU];
static int ngpu;
/* GPUs beyond this index are not there yet (hot-plug); -1: all are. Guessed, not
 * checked against a real driver: that nvmlDeviceGetCount counts a GPU bound after
 * nvmlInit without a new init. The backend re-reads the count at every discovery. */
static int present = -1;
static struct fdev migpool[MAXGPU * MAXMIG];
static int nmigpool;
static struct fault faults[MAXFAULT];
static int nfault;
static int topo_override[MAXGPU][MAXGPU]; /* -1: derive */
static struct fset sets[MAXSET];
static int waiters;

static void cv_init(void) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&cv, &a);
    pthread_condattr_destroy(&a);
}

/* A process utilization sample's timestamp: CPU time in microseconds since the epoch
 * (NVML API reference, nvmlProcessUtilizationSample_t "CPU Timestamp in microseconds"),
 * strictly increasing here so that a test's new sample is always newer. */
static unsigned long long last_sample_ts;

static unsigned long long sample_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned long long now = (unsigned long long)ts.tv_sec * 1000000ULL + ts.tv_nsec / 1000ULL;
    if (now <= last_sample_ts) now = last_sample_ts + 1;
    return last_sample_ts = now;
}

/* ---- scenario parsing ---- */

static char *next_token(char **p, char *out, size_t n) {
    char *s = *p;
    size_t i = 0;
    while (*s == ' ' || *s == '\t') s++;
    if (!*s || *s == '\n' || *s == '#') return NULL;
    while (*s && *s != ' ' && *s != '\t' && *s != '\n') {
        if (*s == '"') {
            s++;
            while (*s && *s != '"') {
                if (i + 1 < n) out[i++] = *s;
                s++;
            }
            if (*s == '"') s++;
            continue;
        }
        if (i + 1 < n) out[i++] = *s;
        s++;
    }
    out[i] = 0;
    *p = s;
    return out;
}

static const char *kv(int ntok, char toks[][128], const char *key) {
    size_t kl = strlen(key);
    for (int i = 1; i < ntok; i++)
        if (!strncmp(toks[i], key, kl) && toks[i][kl] == '=') return toks[i] + kl + 1;
    return NULL;
}

static long kvl(int ntok, char toks[][128], const char *key, long dflt) {
    const char *v = kv(ntok, toks, key);
    return v ? strtol(v, NULL, 0) : dflt;
}

static void fill_common(struct fdev *d, int ntok, char toks[][128]) {
    const char *v;
    if ((v = kv(ntok, toks, "uuid"))) snprintf(d->uuid, sizeof d->uuid, "%s", v);
    if ((v = kv(ntok, toks, "name"))) snprintf(d->name, sizeof d->name, "%s", v);
    d->mem_mb = kvl(ntok, toks, "mem", d->mem_mb);
    d->used_mb = kvl(ntok, toks, "used", d->used_mb);
}

static void reset_state(void) {
    memset(gpus, 0, sizeof gpus);
    memset(migpool, 0, sizeof migpool);
    memset(faults, 0, sizeof faults);
    memset(sets, 0, sizeof sets);
    memset(topo_override, 0xff, sizeof topo_override);
    ngpu = nmigpool = nfault = 0;
    present = -1;
    init_error = 0;
    loaded = 0;
    snprintf(driver_version, sizeof driver_version, "550.54.15");
    snprintf(nvml_version, sizeof nvml_version, "12.550.54.15");
    cuda_version = 12040;
}

static int load_scenario(const char *path) {
    FILE *f = fopen(path, "r");
    char line[1024];
    if (!f) {
        fprintf(stderr, "fake-nvml: cannot open scenario %s\n", path);
        return -1;
    }
    while (fgets(line, sizeof line, f)) {
        char toks[24][128];
        int ntok = 0;
        char *p = line;
        while (ntok < 24 && next_token(&p, toks[ntok], sizeof toks[ntok])) ntok++;
        if (!ntok) continue;
        const char *k = toks[0];
        if (!strcmp(k, "driver") && ntok > 1) {
            snprintf(driver_version, sizeof driver_version, "%s", toks[1]);
        } else if (!strcmp(k, "nvml") && ntok > 1) {
            snprintf(nvml_version, sizeof nvml_version, "%s", toks[1]);
        } else if (!strcmp(k, "cuda") && ntok > 1) {
            cuda_version = (int)strtol(toks[1], NULL, 0);
        } else if (!strcmp(k, "present") && ntok > 1) {
            present = (int)strtol(toks[1], NULL, 0);
        } else if (!strcmp(k, "init_error") && ntok > 1) {
            init_error = (int)strtol(toks[1], NULL, 0);
        } else if (!strcmp(k, "gpu") && ngpu < MAXGPU) {
            struct fdev *d = &gpus[ngpu];
            d->index = ngpu++;
            d->minor = kvl(ntok, toks, "minor", d->index);
            fill_common(d, ntok, toks);
            const char *cc = kv(ntok, toks, "cc");
            if (cc) sscanf(cc, "%d.%d", &d->cc_major, &d->cc_minor);
            const char *pci = kv(ntok, toks, "pci");
            snprintf(d->busid, sizeof d->busid, "%s", pci ? pci : "00000000:00:00.0");
            d->pci_device_id = kvl(ntok, toks, "pciid", 0x20b010de);
            d->pci_subsys = kvl(ntok, toks, "subsys", 0x134f10de);
            d->board = kvl(ntok, toks, "board", 1000 + d->index);
            d->sw = kvl(ntok, toks, "switch", d->index);
            d->bridge = kvl(ntok, toks, "bridge", d->index);
            d->numa = kvl(ntok, toks, "numa", 0);
            d->mig_capable = kvl(ntok, toks, "migcap", 1);
            d->mig_mode = kvl(ntok, toks, "mig", 0);
            d->sms = kvl(ntok, toks, "sms", 108);
            d->util = kvl(ntok, toks, "util", 0);
            d->memutil = kvl(ntok, toks, "memutil", 0);
            d->temp = kvl(ntok, toks, "temp", 35);
            d->power_mw = kvl(ntok, toks, "power", 60000);
            d->lost_after = kvl(ntok, toks, "lost_after", 0);
            d->max_links = kvl(ntok, toks, "nvlinks", 0);
            for (int i = 0; i < MAXLINK; i++) d->link_remote[i] = -1;
            /* switchlinks=N: the first N links go to NVSwitches, not to GPUs */
            long sw = kvl(ntok, toks, "switchlinks", 0);
            for (long i = 0; i < sw && i < d->max_links; i++) d->link_remote[i] = -2;
        } else if (!strcmp(k, "mig") && nmigpool < MAXGPU * MAXMIG) {
            long g = kvl(ntok, toks, "gpu", -1);
            if (g < 0 || g >= ngpu || gpus[g].nmig >= MAXMIG) continue;
            struct fdev *m = &migpool[nmigpool++];
            struct fdev *p = &gpus[g];
            m->is_mig = 1;
            m->parent = p;
            m->index = p->nmig;
            p->migs[p->nmig++] = m;
            fill_common(m, ntok, toks);
            m->gi = kvl(ntok, toks, "gi", 0);
            m->ci = kvl(ntok, toks, "ci", 0);
            m->gi_slices = kvl(ntok, toks, "slices", 1);
            m->ci_slices = kvl(ntok, toks, "cislices", m->gi_slices);
            /* default: the A100 profile ID of a plain profile with that many slices */
            long dflt = 0;
            for (int e = 0; e < 5; e++)
                if (a100_profile_slices[e] == m->gi_slices) dflt = a100_profile_ids[e];
            m->gi_profile = kvl(ntok, toks, "profile", dflt);
            m->gi_start = kvl(ntok, toks, "start", 0);
            m->gi_size = kvl(ntok, toks, "size", 0);
            m->has_ci = m->in_use = 1;
            m->sms = kvl(ntok, toks, "sms", 14 * m->ci_slices);
            if (!m->name[0]) snprintf(m->name, sizeof m->name, "%s MIG", p->name);
        } else if (!strcmp(k, "nvlink")) {
            /* nvlink a=0 b=1 n=2: n links between GPUs a and b */
            long a = kvl(ntok, toks, "a", -1), b = kvl(ntok, toks, "b", -1);
            long n = kvl(ntok, toks, "n", 1);
            if (a < 0 || b < 0 || a >= ngpu || b >= ngpu) continue;
            for (long i = 0; i < n; i++) {
                for (int j = 0; j < gpus[a].max_links; j++)
                    if (gpus[a].link_remote[j] < 0) { gpus[a].link_remote[j] = b; break; }
                for (int j = 0; j < gpus[b].max_links; j++)
                    if (gpus[b].link_remote[j] < 0) { gpus[b].link_remote[j] = a; break; }
            }
        } else if (!strcmp(k, "proc")) {
            /* proc gpu=0 pid=4242 used=1024 [gi=G ci=C] [mps=1] [sm=S memutil=M enc=E dec=D]:
             * a compute process, its framebuffer, its MIG instance, whether it is an MPS
             * client, and a utilization sample (taken when the scenario loads) */
            long g = kvl(ntok, toks, "gpu", -1);
            if (g < 0 || g >= ngpu || gpus[g].nproc >= MAXPROC) continue;
            struct fdev *d = &gpus[g];
            int i = d->nproc++;
            d->proc_pid[i] = kvl(ntok, toks, "pid", 1000 + i);
            d->proc_used_mb[i] = kvl(ntok, toks, "used", -1);
            d->proc_gi[i] = (unsigned)kvl(ntok, toks, "gi", 0xFFFFFFFFL);
            d->proc_ci[i] = (unsigned)kvl(ntok, toks, "ci", 0xFFFFFFFFL);
            d->proc_mps[i] = (int)kvl(ntok, toks, "mps", 0);
            if (kv(ntok, toks, "sm") || kv(ntok, toks, "memutil")) {
                d->proc_sm[i] = (unsigned)kvl(ntok, toks, "sm", 0);
                d->proc_mem[i] = (unsigned)kvl(ntok, toks, "memutil", 0);
                d->proc_enc[i] = (unsigned)kvl(ntok, toks, "enc", 0);
                d->proc_dec[i] = (unsigned)kvl(ntok, toks, "dec", 0);
                d->proc_ts[i] = sample_time();
            }
        } else if (!strcmp(k, "topo")) {
            long a = kvl(ntok, toks, "a", -1), b = kvl(ntok, toks, "b", -1);
            long lvl = kvl(ntok, toks, "level", 50);
            if (a >= 0 && b >= 0 && a < MAXGPU && b < MAXGPU)
                topo_override[a][b] = topo_override[b][a] = (int)lvl;
        } else if (!strcmp(k, "fault") && nfault < MAXFAULT) {
            struct fault *ft = &faults[nfault++];
            const char *fn = kv(ntok, toks, "fn");
            snprintf(ft->fn, sizeof ft->fn, "%s", fn ? fn : "*");
            ft->dev = kvl(ntok, toks, "dev", -1);
            ft->mig = kvl(ntok, toks, "migdev", -1);
            ft->err = kvl(ntok, toks, "err", NVML_ERROR_UNKNOWN);
            ft->after = kvl(ntok, toks, "after", 0);
            ft->times = kvl(ntok, toks, "times", 0);
            ft->hang = kvl(ntok, toks, "hang", 0);
        } else {
            fprintf(stderr, "fake-nvml: %s: unknown record %s\n", path, k);
        }
    }
    fclose(f);
    loaded = 1;
    return 0;
}

/* ---- helpers ---- */

/* A driver call that never returns on its own (docs/sources.md#hung-calls: a stuck
 * call is gone for good): fault lines with hang=1 block here, the mutex released, until the
 * test calls fake_nvml_release_hangs() (or fake_nvml_reset()). Called with mu held. */
static int hang_gen;
static int hanging;

static void hang_here(void) {
    int gen = hang_gen;
    hanging++;
    pthread_cond_broadcast(&cv); /* wakes fake_nvml_wait_hanging */
    while (gen == hang_gen) pthread_cond_wait(&cv, &mu);
    hanging--;
}

static int fault_check(const char *fn, struct fdev *d) {
    int phys = d ? (d->is_mig ? d->parent->index : d->index) : -1;
    int mig = d && d->is_mig ? d->index : -1;
    for (int i = 0; i < nfault; i++) {
        struct fault *ft = &faults[i];
        if (strcmp(ft->fn, "*") && strcmp(ft->fn, fn)) continue;
        if (ft->dev >= 0 && ft->dev != phys) continue;
        if (ft->mig >= 0 && ft->mig != mig) continue;
        if (ft->mig == -2 && mig != -1) continue; /* migdev=-2: the GPU's own handle only */
        ft->hits++;
        if (ft->hits <= ft->after) continue;
        if (ft->times && ft->fired >= ft->times) continue;
        ft->fired++;
        if (ft->hang) {
            hang_here();
            return 0;
        }
        return ft->err;
    }
    return 0;
}

/* Every device entry point starts here: init check, lost GPUs, injected faults. */
static int enter(const char *fn, struct fdev *d) {
    int rc = 0;
    pthread_mutex_lock(&mu);
    if (!initialised) {
        rc = NVML_ERROR_UNINITIALIZED;
    } else if (d) {
        struct fdev *p = d->is_mig ? d->parent : d;
        p->calls++;
        if (p->lost_after && p->calls > p->lost_after) p->lost = 1;
        if (p->lost) rc = NVML_ERROR_GPU_IS_LOST;
    }
    if (!rc) rc = fault_check(fn, d);
    pthread_mutex_unlock(&mu);
    return rc;
}

#define ENTER(d)                                    \
    do {                                            \
        int rc_ = enter(__func__, (d));             \
        if (rc_) return rc_;                        \
    } while (0)

static int copy_str(char *dst, unsigned len, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

static void fill_pci(struct fdev *g, nvmlPciInfo_t *pci) {
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", g->busid);
    /* The legacy field holds the 4-digit domain form. */
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s",
             strlen(g->busid) > 4 ? g->busid + 4 : g->busid);
    unsigned dom = 0, bus = 0, dev = 0;
    sscanf(g->busid, "%x:%x:%x", &dom, &bus, &dev);
    pci->domain = dom;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsys;
}

/* ---- init / system ---- */

int fake_nvml_inject_xid(unsigned gpu, unsigned long long xid);
int fake_nvml_set_lost(unsigned gpu, int lost);

static void *control_thread(void *arg) {
    const char *path = arg;
    char line[128];
    /* read+write open: never sees EOF when a writer closes, so one open serves all */
    FILE *f = fopen(path, "r+");
    if (!f) {
        fprintf(stderr, "fake-nvml: cannot open control FIFO %s\n", path);
        return NULL;
    }
    while (fgets(line, sizeof line, f)) {
        unsigned gpu = 0;
        unsigned long long value = 0;
        if (sscanf(line, "xid %u %llu", &gpu, &value) == 2)
            fake_nvml_inject_xid(gpu, value);
        else if (sscanf(line, "lost %u %llu", &gpu, &value) == 2)
            fake_nvml_set_lost(gpu, (int)value);
        else
            fprintf(stderr, "fake-nvml: control: cannot parse %s", line);
    }
    fclose(f);
    return NULL;
}

static pthread_once_t control_once = PTHREAD_ONCE_INIT;

static void control_start(void) {
    const char *path = getenv("FAKE_NVML_CONTROL");
    pthread_t t;
    if (path && *path && pthread_create(&t, NULL, control_thread, (void *)path) == 0)
        pthread_detach(t);
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_once(&cv_once, cv_init);
    pthread_once(&control_once, control_start);
    pthread_mutex_lock(&mu);
    if (initialised == 0) {
        const char *path = getenv("FAKE_NVML_SCENARIO");
        reset_state();
        if (path && *path && load_scenario(path) != 0) {
            pthread_mutex_unlock(&mu);
            return NVML_ERROR_UNKNOWN;
        }
    }
    int rc = init_error ? init_error : fault_check("nvmlInitWithFlags", NULL);
    if (!rc) initialised++;
    pthread_mutex_unlock(&mu);
    return rc;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&mu);
    int rc = initialised ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (initialised) initialised--;
    pthread_mutex_unlock(&mu);
    return rc;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len) {
    ENTER(NULL);
    return copy_str(v, len, driver_version);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned int len) {
    ENTER(NULL);
    return copy_str(v, len, nvml_version);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    ENTER(NULL);
    *v = cuda_version;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) {
    ENTER(NULL);
    *v = cuda_version;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
    ENTER(NULL);
    *n = present >= 0 && present < ngpu ? present : ngpu;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (i >= (unsigned)ngpu || (present >= 0 && i >= (unsigned)present))
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(&gpus[i]);
    *d = &gpus[i];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) {
    struct fdev *found = NULL;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    for (int i = 0; i < ngpu && !found; i++) {
        if (!strcmp(gpus[i].uuid, uuid)) found = &gpus[i];
        for (int j = 0; j < gpus[i].nmig && !found; j++)
            if (!strcmp(gpus[i].migs[j]->uuid, uuid)) found = gpus[i].migs[j];
    }
    if (!found) return NVML_ERROR_NOT_FOUND;
    ENTER(found);
    *d = found;
    return NVML_SUCCESS;
}

/* ---- device queries ---- */

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) {
    ENTER(d);
    return copy_str(uuid, len, d->uuid);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) {
    ENTER(d);
    return copy_str(name, len, d->name);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i) {
    ENTER(d);
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *i = d->index;
    return NVML_SUCCESS;
}

/* NVML API reference: nvmlDeviceGet/SetComputeMode, modes 0 DEFAULT, 1 EXCLUSIVE_THREAD
 * (deprecated), 2 PROHIBITED, 3 EXCLUSIVE_PROCESS; setting needs root (a scenario
 * "fault fn=nvmlDeviceSetComputeMode err=4" is NO_PERMISSION). MIG devices: guessed
 * NOT_SUPPORTED (the mode is the GPU's). */
nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t d, unsigned int *mode) {
    ENTER(d);
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
    *mode = d->compute_mode;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t d, unsigned int mode) {
    ENTER(d);
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    if (mode > 3) return NVML_ERROR_INVALID_ARGUMENT;
    d->compute_mode = mode;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *m) {
    ENTER(d);
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *m = d->minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    ENTER(d);
    m->total = d->mem_mb << 20;
    m->used = d->used_mb << 20;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

/* The processes of a device as NVML lists them (NVML API reference and nvml.h,
 * nvmlDeviceGetComputeRunningProcesses_v3 / nvmlDeviceGetMPSComputeRunningProcesses_v3):
 * - the count in/out protocol: with *infoCount too small (or infos NULL) it sets
 *   *infoCount to the number of processes and returns INSUFFICIENT_SIZE, SUCCESS when
 *   there are none; pynvml's wrappers call first with 0/NULL, then with a larger array;
 * - usedGpuMemory is NVML_VALUE_NOT_AVAILABLE (all ones) when the driver cannot tell;
 * - "In MIG mode, if device handle is provided, the API returns aggregate information":
 *   a parent GPU in MIG mode lists every instance's processes, each with its GPU and
 *   compute instance IDs; "per-instance information can be queried by using specific
 *   MIG device handles": a MIG handle lists the processes of its own instance;
 * - the MPS call lists the processes "with a MPS compute context" (MPS clients), the
 *   plain call the others (scenario key mps=1 says which list a process is on). */
static nvmlReturn_t list_processes(struct fdev *d, unsigned int *infoCount,
                                   nvmlProcessInfo_t *infos, int mps) {
    if (!infoCount) return NVML_ERROR_INVALID_ARGUMENT;
    struct fdev *g = d->is_mig ? d->parent : d;
    unsigned idx[MAXPROC], n = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < g->nproc; i++) {
        if (g->proc_mps[i] != mps) continue;
        if (d->is_mig && (g->proc_gi[i] != d->gi || g->proc_ci[i] != d->ci)) continue;
        idx[n++] = (unsigned)i;
    }
    if (!infos || *infoCount < n) {
        *infoCount = n;
        pthread_mutex_unlock(&mu);
        return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    for (unsigned k = 0; k < n; k++) {
        unsigned i = idx[k];
        infos[k].pid = g->proc_pid[i];
        infos[k].usedGpuMemory =
            g->proc_used_mb[i] < 0 ? ~0ULL : (unsigned long long)g->proc_used_mb[i] << 20;
        /* 0xFFFFFFFF without MIG (nvml.h nvmlProcessInfo_t: "If MIG is enabled, stores a
         * valid GPU instance ID. gpuInstanceId is set to 0xFFFFFFFF otherwise.") */
        infos[k].gpuInstanceId = g->mig_mode ? g->proc_gi[i] : 0xFFFFFFFFu;
        infos[k].computeInstanceId = g->mig_mode ? g->proc_ci[i] : 0xFFFFFFFFu;
    }
    *infoCount = n;
    pthread_mutex_unlock(&mu);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos) {
    ENTER(d);
    return list_processes(d, infoCount, infos, 0);
}

/* nvmlProcessInfo_v2_t has the same layout as v3 (nvml.h; pynvml aliases the two);
 * pynvml's nvmlDeviceGetComputeRunningProcesses resolves _v3, the _v2 entry points are
 * for callers that name them. */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos) {
    ENTER(d);
    return list_processes(d, infoCount, infos, 0);
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *infoCount,
                                                         nvmlProcessInfo_t *infos) {
    ENTER(d);
    return list_processes(d, infoCount, infos, 1);
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *infoCount,
                                                         nvmlProcessInfo_t *infos) {
    ENTER(d);
    return list_processes(d, infoCount, infos, 1);
}

/* nvml.h, nvmlDeviceGetProcessUtilization: "One utilization sample structure is returned
 * per process running, that had some non-zero utilization during the last sample period",
 * only samples newer than lastSeenTimeStamp; "If no valid sample entries are found since
 * the lastSeenTimeStamp, NVML_ERROR_NOT_FOUND is returned"; the buffer is sized by a
 * first call with utilization NULL, which answers INSUFFICIENT_SIZE with the count (the
 * protocol pynvml's wrapper follows: it raises on any other answer to that call).
 * NOT_SUPPORTED on MIG devices and on a GPU in MIG mode: nvml.h says of
 * nvmlDeviceGetUtilizationRates "On MIG-enabled GPUs, querying device utilization rates
 * is not currently supported", and NVIDIA's MIG user guide leaves utilization out of
 * what is reported per MIG device; that the per-process samples follow it is guessed. */
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d,
                                             nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp) {
    ENTER(d);
    if (!processSamplesCount) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig || d->mig_mode) return NVML_ERROR_NOT_SUPPORTED;
    unsigned idx[MAXPROC], n = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < d->nproc; i++)
        if (d->proc_ts[i] && d->proc_ts[i] > lastSeenTimeStamp) idx[n++] = (unsigned)i;
    if (!n) {
        pthread_mutex_unlock(&mu);
        return NVML_ERROR_NOT_FOUND;
    }
    if (!utilization || *processSamplesCount < n) {
        *processSamplesCount = n;
        pthread_mutex_unlock(&mu);
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned k = 0; k < n; k++) {
        unsigned i = idx[k];
        utilization[k].pid = d->proc_pid[i];
        utilization[k].timeStamp = d->proc_ts[i];
        utilization[k].smUtil = d->proc_sm[i];
        utilization[k].memUtil = d->proc_mem[i];
        utilization[k].encUtil = d->proc_enc[i];
        utilization[k].decUtil = d->proc_dec[i];
    }
    *processSamplesCount = n;
    pthread_mutex_unlock(&mu);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    ENTER(d);
    if (m->version != 0x02000028) return NVML_ERROR_INVALID_ARGUMENT;
    m->total = d->mem_mb << 20;
    m->used = d->used_mb << 20;
    m->reserved = 0;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
    ENTER(d);
    struct fdev *g = d->is_mig ? d->parent : d;
    *major = g->cc_major;
    *minor = g->cc_minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    ENTER(d);
    fill_pci(d->is_mig ? d->parent : d, pci);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    ENTER(d);
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    u->gpu = d->util;
    u->memory = d->memutil;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, unsigned int sensor, unsigned int *t) {
    ENTER(d);
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    if (sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *t = d->temp;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    ENTER(d);
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *mw = d->power_mw;
    return NVML_SUCCESS;
}

/* ---- MIG (left out with -DFAKE_NO_MIG: an older driver without these symbols) ---- */
#ifndef FAKE_NO_MIG

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pending) {
    ENTER(d);
    if (d->is_mig || !d->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    *cur = *pending = d->mig_mode;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is) {
    ENTER(d);
    *is = d->is_mig;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *n) {
    ENTER(d);
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *n = d->mig_capable ? 7 : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int i, nvmlDevice_t *m) {
    ENTER(d);
    if (d->is_mig || !d->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    if (!d->mig_mode) return NVML_ERROR_INVALID_ARGUMENT;
    if (i >= 7) return NVML_ERROR_INVALID_ARGUMENT;
    /* MIG devices are GPU instance + compute instance pairs: a GPU instance without a
     * compute instance is not one (NVML API reference, nvmlDeviceGetMigDeviceHandleByIndex) */
    unsigned seen = 0;
    for (int j = 0; j < d->nmig; j++) {
        if (!d->migs[j]->has_ci) continue;
        if (seen++ == i) {
            *m = d->migs[j];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t m, nvmlDevice_t *d) {
    ENTER(m);
    if (!m->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *d = m->parent;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t m, unsigned int *id) {
    ENTER(m);
    if (!m->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *id = m->gi;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t d, unsigned int profile,
                                                  nvmlGpuInstanceProfileInfo_t *info) {
    ENTER(d);
    if (d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    if (profile >= 18) return NVML_ERROR_INVALID_ARGUMENT;
    if (a100_profile_ids[profile] < 0) return NVML_ERROR_NOT_SUPPORTED;
    memset(info, 0, sizeof *info);
    info->id = (unsigned)a100_profile_ids[profile];
    info->sliceCount = a100_profile_slices[profile];
    info->instanceCount = a100_instances[profile];
    info->multiprocessorCount = 14 * a100_profile_slices[profile];
    info->memorySizeMB = d->mem_mb * a100_place_size[profile] / 8;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t d, unsigned int id, nvmlGpuInstance_t *gi) {
    ENTER(d);
    if (d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    for (int j = 0; j < d->nmig; j++) {
        if (d->migs[j]->gi == id) {
            *gi = d->migs[j];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gi, nvmlGpuInstanceInfo_t *info) {
    ENTER(gi);
    memset(info, 0, sizeof *info);
    info->device = gi->parent;
    info->id = gi->gi;
    info->profileId = gi->gi_profile;
    info->start = gi->gi_start;
    info->size = gi->gi_size ? gi->gi_size : gi->gi_slices;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t m, unsigned int *id) {
    ENTER(m);
    if (!m->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *id = m->ci;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t d, nvmlDeviceAttributes_t *a) {
    ENTER(d);
    memset(a, 0, sizeof *a);
    a->multiprocessorCount = d->sms;
    if (d->is_mig) {
        a->gpuInstanceSliceCount = d->gi_slices;
        a->computeInstanceSliceCount = d->ci_slices;
    }
    a->memorySizeMB = d->mem_mb;
    return NVML_SUCCESS;
}

/* ---- dynamic MIG: GPU and compute instances created and destroyed at run time ---- */

static int profile_enum(unsigned profile_id) {
    for (int e = 0; e < 18; e++)
        if (a100_profile_ids[e] >= 0 && (unsigned)a100_profile_ids[e] == profile_id) return e;
    return -1;
}

nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t d, unsigned int profile_id,
                                                           nvmlGpuInstancePlacement_t *out,
                                                           unsigned int *count) {
    ENTER(d);
    if (d->is_mig || !count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    int e = profile_enum(profile_id);
    if (e < 0) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = a100_place_count[e];
    if (!out) { /* NULL: how many there are (NVML API reference) */
        *count = n;
        return NVML_SUCCESS;
    }
    if (*count < n) return NVML_ERROR_INSUFFICIENT_SIZE;
    for (unsigned i = 0; i < n; i++) {
        out[i].start = i * a100_place_step[e];
        out[i].size = a100_place_size[e];
    }
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t d, unsigned int profile_id,
                                                      const nvmlGpuInstancePlacement_t *pl,
                                                      nvmlGpuInstance_t *gi) {
    ENTER(d);
    if (d->is_mig || !pl || !gi) return NVML_ERROR_INVALID_ARGUMENT;
    /* NVML API reference, nvmlDeviceCreateGpuInstanceWithPlacement: NOT_SUPPORTED when the
     * device has no MIG mode enabled */
    if (!d->mig_capable || !d->mig_mode) return NVML_ERROR_NOT_SUPPORTED;
    int e = profile_enum(profile_id);
    if (e < 0) return NVML_ERROR_INVALID_ARGUMENT;
    int valid = 0;
    for (unsigned i = 0; i < a100_place_count[e]; i++)
        if (pl->start == i * a100_place_step[e] && pl->size == a100_place_size[e]) valid = 1;
    if (!valid) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mu);
    int same = 0;
    unsigned long used_ids = 0;
    for (int j = 0; j < d->nmig; j++) {
        struct fdev *o = d->migs[j];
        used_ids |= 1UL << o->gi;
        if (o->gi_profile == profile_id) same++;
        /* occupied memory slices: NVML answers INSUFFICIENT_RESOURCES (API reference) */
        if (o->gi_size && pl->start < o->gi_start + o->gi_size && o->gi_start < pl->start + pl->size) {
            pthread_mutex_unlock(&mu);
            return NVML_ERROR_INSUFFICIENT_RESOURCES;
        }
    }
    struct fdev *m = NULL;
    for (int j = 0; j < MAXGPU * MAXMIG && !m; j++)
        if (!migpool[j].in_use) m = &migpool[j];
    if (same >= (int)a100_instances[e] || d->nmig >= MAXMIG || !m) {
        pthread_mutex_unlock(&mu);
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    if (m - migpool >= nmigpool) nmigpool = (int)(m - migpool) + 1;
    memset(m, 0, sizeof *m);
    m->in_use = m->is_mig = 1;
    m->parent = d;
    m->index = d->nmig;
    d->migs[d->nmig++] = m;
    /* GPU instance IDs: the lowest free one from 1 (guessed; the driver's choice is not
     * documented, and the backend reads the ID back from NVML) */
    unsigned id = 1;
    while (used_ids & (1UL << id)) id++;
    m->gi = id;
    m->gi_profile = profile_id;
    m->gi_start = pl->start;
    m->gi_size = pl->size;
    m->gi_slices = a100_profile_slices[e];
    /* memory: the parent's share of the placement's memory slices (guessed: a real
     * instance is ~4% smaller, 9856 of 10240 MiB for 1g.10gb on an A100-80GB; the
     * profile name, rounded up to GB, comes out the same) */
    m->mem_mb = d->mem_mb * pl->size / 8;
    m->minor = d->minor;
    snprintf(m->name, sizeof m->name, "%s MIG", d->name);
    *gi = m;
    pthread_mutex_unlock(&mu);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t d, unsigned int profile_id,
                                       nvmlGpuInstance_t *out, unsigned int *count) {
    ENTER(d);
    if (d->is_mig || !count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    unsigned n = 0;
    for (int j = 0; j < d->nmig; j++)
        if (d->migs[j]->gi_profile == profile_id) {
            if (out) out[n] = d->migs[j];
            n++;
        }
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gi, unsigned int profile,
                                                          unsigned int eng,
                                                          nvmlComputeInstanceProfileInfo_t *info) {
    ENTER(gi);
    if (!gi->is_mig || !info || profile >= 8 || eng != 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (ci_profile_slices[profile] > gi->gi_slices) return NVML_ERROR_NOT_SUPPORTED;
    memset(info, 0, sizeof *info);
    info->id = profile;
    info->sliceCount = ci_profile_slices[profile];
    info->instanceCount = gi->gi_slices / ci_profile_slices[profile];
    info->multiprocessorCount = 14 * ci_profile_slices[profile];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gi, unsigned int profile_id,
                                                  nvmlComputeInstance_t *ci) {
    ENTER(gi);
    if (!gi->is_mig || !ci || profile_id >= 8) return NVML_ERROR_INVALID_ARGUMENT;
    /* the fake models one compute instance per GPU instance, of the whole instance */
    if (ci_profile_slices[profile_id] != gi->gi_slices) return NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&mu);
    if (gi->has_ci) {
        pthread_mutex_unlock(&mu);
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    struct fdev *p = gi->parent;
    gi->has_ci = 1;
    gi->ci = 0;
    gi->ci_slices = gi->gi_slices;
    gi->sms = 14 * gi->ci_slices;
    snprintf(gi->uuid, sizeof gi->uuid, "MIG-d1a00000-0000-4000-8000-%04x%08x", p->index,
             (unsigned)(gi->gi * 0x1000 + gi->gi_start * 0x10 + gi->gi_size));
    *ci = gi;
    pthread_mutex_unlock(&mu);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gi, unsigned int profile_id,
                                                nvmlComputeInstance_t *out, unsigned int *count) {
    ENTER(gi);
    if (!gi->is_mig || !count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = 0;
    if (gi->has_ci && profile_id < 8 && ci_profile_slices[profile_id] == gi->ci_slices) {
        if (out) out[0] = gi;
        n = 1;
    }
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t ci) {
    ENTER(ci);
    pthread_mutex_lock(&mu);
    if (!ci->is_mig || !ci->has_ci) {
        pthread_mutex_unlock(&mu);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    ci->has_ci = 0;
    ci->uuid[0] = 0;
    pthread_mutex_unlock(&mu);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gi) {
    ENTER(gi);
    pthread_mutex_lock(&mu);
    if (!gi->is_mig || !gi->in_use) {
        pthread_mutex_unlock(&mu);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    /* a GPU instance that still holds compute instances is IN_USE (NVML API reference) */
    if (gi->has_ci) {
        pthread_mutex_unlock(&mu);
        return NVML_ERROR_IN_USE;
    }
    struct fdev *p = gi->parent;
    int k = 0;
    for (int j = 0; j < p->nmig; j++)
        if (p->migs[j] != gi) {
            p->migs[k] = p->migs[j];
            p->migs[k]->index = k;
            k++;
        }
    p->nmig = k;
    gi->in_use = 0;
    pthread_mutex_unlock(&mu);
    return NVML_SUCCESS;
}

#endif /* FAKE_NO_MIG */

/* ---- topology ---- */

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, unsigned int *lvl) {
    ENTER(a);
    ENTER(b);
    if (a->is_mig || b->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    int o = topo_override[a->index][b->index];
    if (o >= 0) *lvl = o;
    else if (a->board == b->board) *lvl = 0;
    else if (a->sw == b->sw) *lvl = 10;
    else if (a->bridge == b->bridge) *lvl = 30;
    else if (a->numa == b->numa) *lvl = 40;
    else *lvl = 50;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, unsigned int *active) {
    ENTER(d);
    if (d->is_mig || d->max_links == 0) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned)d->max_links) return NVML_ERROR_INVALID_ARGUMENT;
    *active = d->link_remote[link] != -1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned int link, nvmlPciInfo_t *pci) {
    ENTER(d);
    if (d->is_mig || d->max_links == 0) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned)d->max_links) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->link_remote[link] == -1) return NVML_ERROR_NOT_FOUND;
    if (d->link_remote[link] == -2) {
        static struct fdev nvswitch = {.busid = "00000000:C5:00.0", .pci_device_id = 0x22a310de};
        fill_pci(&nvswitch, pci);
        return NVML_SUCCESS;
    }
    fill_pci(&gpus[d->link_remote[link]], pci);
    return NVML_SUCCESS;
}

/* ---- events ---- */

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
    ENTER(d);
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *types = 0x1 | 0x2 | 0x8;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *s) {
    ENTER(NULL);
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAXSET; i++) {
        if (!sets[i].used) {
            memset(&sets[i], 0, sizeof sets[i]);
            sets[i].used = 1;
            *s = &sets[i];
            pthread_mutex_unlock(&mu);
            return NVML_SUCCESS;
        }
    }
    pthread_mutex_unlock(&mu);
    return NVML_ERROR_UNKNOWN;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t s) {
    ENTER(d);
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    if (types & ~0xbULL) return NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&mu);
    s->mask[d->index] |= types;
    pthread_mutex_unlock(&mu);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t s) {
    pthread_mutex_lock(&mu);
    s->used = 0;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t s, nvmlEventData_t *data, unsigned int timeout_ms) {
    ENTER(NULL);
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    int rc = NVML_SUCCESS;
    pthread_mutex_lock(&mu);
    waiters++;
    pthread_cond_broadcast(&cv); /* wakes fake_nvml_wait_waiters */
    while (s->used && s->len == 0 && !s->lost_pending) {
        if (pthread_cond_timedwait(&cv, &mu, &until) == ETIMEDOUT) break;
    }
    waiters--;
    if (!s->used) {
        rc = NVML_ERROR_UNINITIALIZED;
    } else if (s->lost_pending) {
        s->lost_pending = 0;
        rc = NVML_ERROR_GPU_IS_LOST;
    } else if (s->len) {
        struct event *e = &s->q[s->head];
        data->device = e->dev;
        data->eventType = e->type;
        data->eventData = e->data;
        data->gpuInstanceId = e->gi;
        data->computeInstanceId = e->ci;
        s->head = (s->head + 1) % QLEN;
        s->len--;
    } else {
        rc = NVML_ERROR_TIMEOUT;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

/* ---- test controls ---- */

/* hot-plug: the first n GPUs of the scenario are there (-1: all) */
void fake_nvml_set_present(int n) {
    pthread_mutex_lock(&mu);
    present = n;
    pthread_mutex_unlock(&mu);
}

int fake_nvml_inject_event(unsigned gpu, unsigned long long type, unsigned long long data,
                           unsigned gi, unsigned ci) {
    int n = 0;
    pthread_once(&cv_once, cv_init);
    pthread_mutex_lock(&mu);
    if (gpu < (unsigned)ngpu) {
        for (int i = 0; i < MAXSET; i++) {
            struct fset *s = &sets[i];
            if (!s->used || !(s->mask[gpu] & type) || s->len == QLEN) continue;
            struct event *e = &s->q[(s->head + s->len) % QLEN];
            e->dev = &gpus[gpu];
            e->type = type;
            e->data = data;
            e->gi = gi;
            e->ci = ci;
            s->len++;
            n++;
        }
        pthread_cond_broadcast(&cv);
    }
    pthread_mutex_unlock(&mu);
    return n;
}

int fake_nvml_inject_xid(unsigned gpu, unsigned long long xid) {
    return fake_nvml_inject_event(gpu, 0x8, xid, 0xffffffffu, 0xffffffffu);
}

int fake_nvml_set_lost(unsigned gpu, int lost) {
    int n = 0;
    pthread_once(&cv_once, cv_init);
    pthread_mutex_lock(&mu);
    if (gpu < (unsigned)ngpu) {
        gpus[gpu].lost = lost;
        gpus[gpu].lost_after = 0;
        if (lost) {
            for (int i = 0; i < MAXSET; i++)
                if (sets[i].used && sets[i].mask[gpu]) { sets[i].lost_pending = 1; n++; }
            pthread_cond_broadcast(&cv);
        }
    }
    pthread_mutex_unlock(&mu);
    return n;
}

void fake_nvml_release_hangs(void) {
    pthread_once(&cv_once, cv_init);
    pthread_mutex_lock(&mu);
    hang_gen++;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

/* 1 once n calls block in a hang fault (synchronisation without sleeps), else 0. */
int fake_nvml_wait_hanging(int n, int timeout_ms) {
    struct timespec until;
    pthread_once(&cv_once, cv_init);
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&mu);
    while (hanging < n)
        if (pthread_cond_timedwait(&cv, &mu, &until) == ETIMEDOUT) break;
    int ok = hanging >= n;
    pthread_mutex_unlock(&mu);
    return ok;
}

int fake_nvml_wait_waiters(int n, int timeout_ms) {
    struct timespec until;
    pthread_once(&cv_once, cv_init);
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&mu);
    while (waiters < n)
        if (pthread_cond_timedwait(&cv, &mu, &until) == ETIMEDOUT) break;
    int ok = waiters >= n;
    pthread_mutex_unlock(&mu);
    return ok;
}

int fake_nvml_set_value(unsigned gpu, const char *name, long value) {
    int ok = 1;
    pthread_mutex_lock(&mu);
    if (gpu >= (unsigned)ngpu) ok = 0;
    else if (!strcmp(name, "temp")) gpus[gpu].temp = value;
    else if (!strcmp(name, "util")) gpus[gpu].util = value;
    else if (!strcmp(name, "power")) gpus[gpu].power_mw = value;
    else if (!strcmp(name, "used")) gpus[gpu].used_mb = value;
    else ok = 0;
    pthread_mutex_unlock(&mu);
    return ok;
}

/* A new utilization sample of process pid on GPU gpu, taken now (newer than any
 * before); 0 when the GPU or the process is not there. */
int fake_nvml_set_proc_util(unsigned gpu, unsigned pid, unsigned sm, unsigned mem) {
    int ok = 0;
    pthread_mutex_lock(&mu);
    if (gpu < (unsigned)ngpu) {
        struct fdev *d = &gpus[gpu];
        for (int i = 0; i < d->nproc; i++)
            if (d->proc_pid[i] == pid) {
                d->proc_sm[i] = sm;
                d->proc_mem[i] = mem;
                d->proc_ts[i] = sample_time();
                ok = 1;
            }
    }
    pthread_mutex_unlock(&mu);
    return ok;
}

long fake_nvml_call_count(unsigned gpu) {
    long n;
    pthread_mutex_lock(&mu);
    n = gpu < (unsigned)ngpu ? gpus[gpu].calls : -1;
    pthread_mutex_unlock(&mu);
    return n;
}

void fake_nvml_reset(void) {
    pthread_once(&cv_once, cv_init);
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAXSET; i++) sets[i].used = 0;
    pthread_cond_broadcast(&cv);
    initialised = 0;
    reset_state();
    hang_gen++; /* a stuck call left by a test returns now */
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}
