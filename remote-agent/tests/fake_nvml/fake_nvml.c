/*
 * A stand-in for libnvidia-ml.so.1 with two fixed GPUs, for the agent's
 * tests. It exports only what the agent calls through nvml-wrapper.
 *
 * GPU 0 is busy: most of its memory used, and two processes: the pid in
 * $FAKE_NVML_PID (listed as both compute and graphics, 512 MiB) and pid 1
 * (graphics, memory unknown). GPU 1 is nearly idle and does not report its
 * power draw. tests/gpu.rs prints the same values from a fake nvidia-smi.
 */
#include <stdlib.h>
#include <string.h>

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_VALUE_NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFULL

#define MIB (1024ULL * 1024ULL)

typedef struct {
    unsigned index;
    const char *name;
    const char *uuid;
    unsigned util_gpu;
    unsigned util_mem;
    unsigned long long total;
    unsigned long long used;
    unsigned temperature;
    int power_supported;
    unsigned power_mw;
} fake_device;

static fake_device devices[2] = {
    {0, "Fake GPU A100", "GPU-00000000-1111-2222-3333-444444444444", 87, 60,
     81920 * MIB, 70000 * MIB, 61, 1, 412500},
    {1, "Fake GPU A100", "GPU-55555555-6666-7777-8888-999999999999", 3, 1,
     81920 * MIB, 1024 * MIB, 40, 0, 0},
};

static int initialized;

typedef struct {
    unsigned version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvml_memory_v2;

typedef struct {
    unsigned gpu;
    unsigned memory;
} nvml_utilization;

typedef struct {
    unsigned pid;
    unsigned long long usedGpuMemory;
    unsigned gpuInstanceId;
    unsigned computeInstanceId;
} nvml_process_info;

static fake_device *device_of(void *handle) {
    if (handle == (void *)&devices[0]) return &devices[0];
    if (handle == (void *)&devices[1]) return &devices[1];
    return NULL;
}

static int copy_string(const char *s, char *out, unsigned len) {
    if (out == NULL || strlen(s) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, s);
    return NVML_SUCCESS;
}

int nvmlInit_v2(void) {
    initialized = 1;
    return NVML_SUCCESS;
}

int nvmlShutdown(void) {
    initialized = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(int result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    default: return "Unknown Error";
    }
}

int nvmlSystemGetDriverVersion(char *version, unsigned len) {
    return copy_string("550.54.15", version, len);
}

int nvmlDeviceGetCount_v2(unsigned *count) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *count = 2;
    return NVML_SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned index, void **device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (index >= 2 || device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

int nvmlDeviceGetName(void *device, char *name, unsigned len) {
    fake_device *d = device_of(device);
    if (d == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    return copy_string(d->name, name, len);
}

int nvmlDeviceGetUUID(void *device, char *uuid, unsigned len) {
    fake_device *d = device_of(device);
    if (d == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    return copy_string(d->uuid, uuid, len);
}

int nvmlDeviceGetUtilizationRates(void *device, nvml_utilization *u) {
    fake_device *d = device_of(device);
    if (d == NULL || u == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    u->gpu = d->util_gpu;
    u->memory = d->util_mem;
    return NVML_SUCCESS;
}

int nvmlDeviceGetMemoryInfo_v2(void *device, nvml_memory_v2 *m) {
    fake_device *d = device_of(device);
    if (d == NULL || m == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    /* The caller must say which struct version it passes. */
    if (m->version != (unsigned)(sizeof(nvml_memory_v2) | (2u << 24)))
        return NVML_ERROR_INVALID_ARGUMENT;
    m->total = d->total;
    m->reserved = 0;
    m->used = d->used;
    m->free = d->total - d->used;
    return NVML_SUCCESS;
}

int nvmlDeviceGetTemperature(void *device, unsigned sensor, unsigned *temp) {
    fake_device *d = device_of(device);
    if (d == NULL || temp == NULL || sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *temp = d->temperature;
    return NVML_SUCCESS;
}

int nvmlDeviceGetPowerUsage(void *device, unsigned *power) {
    fake_device *d = device_of(device);
    if (d == NULL || power == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->power_supported) return NVML_ERROR_NOT_SUPPORTED;
    *power = d->power_mw;
    return NVML_SUCCESS;
}

/* Fills `infos` (or just counts, when it is NULL) the way NVML does. */
static int processes(const nvml_process_info *list, unsigned n, unsigned *count,
                     nvml_process_info *infos) {
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (infos == NULL || *count < n) {
        *count = n;
        return n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(infos, list, n * sizeof(*list));
    *count = n;
    return NVML_SUCCESS;
}

static unsigned test_pid(void) {
    const char *pid = getenv("FAKE_NVML_PID");
    return pid ? (unsigned)strtoul(pid, NULL, 10) : 0;
}

int nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned *count,
                                            nvml_process_info *infos) {
    fake_device *d = device_of(device);
    if (d == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    nvml_process_info list[1] = {{test_pid(), 512 * MIB, 0xFFFFFFFF, 0xFFFFFFFF}};
    unsigned n = (d->index == 0 && list[0].pid != 0) ? 1 : 0;
    return processes(list, n, count, infos);
}

int nvmlDeviceGetGraphicsRunningProcesses_v3(void *device, unsigned *count,
                                             nvml_process_info *infos) {
    fake_device *d = device_of(device);
    if (d == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    nvml_process_info list[2] = {
        {1, NVML_VALUE_NOT_AVAILABLE, 0xFFFFFFFF, 0xFFFFFFFF},
        {test_pid(), 512 * MIB, 0xFFFFFFFF, 0xFFFFFFFF},
    };
    unsigned n = d->index != 0 ? 0 : (list[1].pid != 0 ? 2 : 1);
    return processes(list, n, count, infos);
}
